# Decoder tracks (beyond the paper): `decoder`, Llama-layout decoders trained from scratch by seed on one causal_lm
# task (results/<profile>/decoder/<task>/), and `decoder_ft`, one pretrained decoder fine-tuned on several domains
# (results/<profile>/decoder_ft/<model>/; its table is built on demand). Their end models are trained, scored,
# matched and given statistics by the shared rules (train, evaluate_end_model, match, statistics); here, for both
# tracks by the wildcard `track`: every pairwise merge by each fusion method, evaluated in the same process on the
# pair's tasks; the same simple merge done by mergekit's own CLI (the `merge` extra); the loss along the linear path.


rule decoder_merge:
    wildcard_constraints:
        track="|".join(DECODER_TRACKS),
    input:
        anchor=model_dir("{track}", "{group}", "{anchor}"),
        source=lambda w: source_dir(w.track, w.group, w.source, w.anchor, w.matching),
        statistics=lambda w: unmoved_statistics(w.track, w.group, unmoved([w.anchor, w.source], w.matching)),
    output:
        [f"{RESULTS}/{{track}}/{{group}}/eval/{{source}}-onto-{{anchor}}/{{matching}}/{method}.json"
         for method in DECODER_METHODS],
    params:
        profile=PROFILE,
        task=lambda w: task_of(w.track, w.group, w.anchor),
        methods=hydra_list(DECODER_METHODS),
        options=lambda w: TRACKS[w.track]["options"](w.group, w.anchor),
        models=lambda w, input: hydra_list([input.anchor, input.source]),
        tasks=lambda w: hydra_list(decoder_pair_tasks(w)),
        eval_tasks=lambda w: hydra_list(decoder_merge_tasks(w)),
        eval_dir=quoted_dirname,
        statistics=statistics_option,
    log:
        f"{LOGS}/{{track}}/{{group}}/merge/{{source}}-onto-{{anchor}}/{{matching}}.log",
    benchmark:
        f"{BENCH}/{{track}}/{{group}}/merge/{{source}}-onto-{{anchor}}/{{matching}}.tsv"
    threads: 1
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-merge "
        "task={params.task:q} methods={params.methods:q} method_options={params.options:q} profile={params.profile:q} "
        "models={params.models:q} tasks={params.tasks:q} eval_tasks={params.eval_tasks:q} "
        "statistics={params.statistics:q} eval_dir={params.eval_dir:q} > {log:q} 2>&1"


# The simple merge of a pair done by mergekit (its `mergekit-yaml` CLI: a linear merge 0.5 / 0.5 in float32 of the two
# folders as symfusion wrote them, absolute paths, offline) and evaluated as symfusion's merges are; the JSON also
# records the largest weight difference from symfusion's own simple merge. Without mergekit installed the job
# fails with one `error:` line naming the `merge` extra.
rule decoder_mergekit:
    wildcard_constraints:
        track="|".join(DECODER_TRACKS),
    input:
        anchor=model_dir("{track}", "{group}", "{anchor}"),
        source=lambda w: source_dir(w.track, w.group, w.source, w.anchor, w.matching),
    output:
        f"{RESULTS}/{{track}}/{{group}}/eval/{{source}}-onto-{{anchor}}/{{matching}}/mergekit/simple.json",
    params:
        profile=PROFILE,
        task=lambda w: task_of(w.track, w.group, w.anchor),
        models=lambda w, input: hydra_list([input.anchor, input.source]),
        eval_tasks=lambda w: hydra_list(decoder_merge_tasks(w)),
        eval_dir=quoted_dirname,
    log:
        f"{LOGS}/{{track}}/{{group}}/mergekit/{{source}}-onto-{{anchor}}/{{matching}}.log",
    benchmark:
        f"{BENCH}/{{track}}/{{group}}/mergekit/{{source}}-onto-{{anchor}}/{{matching}}.tsv"
    threads: 1
    resources:
        gpu=1,          # evaluated under the same precision as symfusion's merges (bfloat16 autocast on a GPU)
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-merge "
        "task={params.task:q} methods='[simple]' client=mergekit profile={params.profile:q} models={params.models:q} "
        "eval_tasks={params.eval_tasks:q} eval_dir={params.eval_dir:q} > {log:q} 2>&1"


rule decoder_barrier:
    wildcard_constraints:
        track="|".join(DECODER_TRACKS),
    input:
        anchor=model_dir("{track}", "{group}", "{anchor}"),
        source=lambda w: source_dir(w.track, w.group, w.source, w.anchor, w.matching),
    output:
        f"{RESULTS}/{{track}}/{{group}}/barrier/{{source}}-onto-{{anchor}}/{{matching}}.json",
    params:
        profile=PROFILE,
        task=lambda w: task_of(w.track, w.group, w.anchor),
        points=DECODER.get("barrier_points", 11),
        examples=DECODER.get("barrier_examples") or "null",
        anchor=quoted_input("anchor"),
        source=quoted_input("source"),
        output=quoted_output,
    log:
        f"{LOGS}/{{track}}/{{group}}/barrier/{{source}}-onto-{{anchor}}/{{matching}}.log",
    benchmark:
        f"{BENCH}/{{track}}/{{group}}/barrier/{{source}}-onto-{{anchor}}/{{matching}}.tsv"
    threads: 1
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-barrier "
        "task={params.task:q} profile={params.profile:q} anchor={params.anchor:q} source={params.source:q} "
        "points={params.points:q} examples={params.examples:q} output={params.output:q} > {log:q} 2>&1"
