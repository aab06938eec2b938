# Decoder tracks (beyond the paper): `decoder`, Llama-layout decoders trained from scratch by seed on one causal_lm
# task (results/<profile>/decoder/<task>/), and `decoder_ft`, one pretrained decoder fine-tuned on several domains
# (results/<profile>/decoder_ft/<model>/; its table is built on demand). Their end models are trained, scored,
# matched, merged (decoder_merge, merge.smk), given statistics and loss paths (barrier.smk) by the shared rules; here,
# for both tracks by the wildcard `track`: the same simple merge done by mergekit's own CLI (the `merge` extra).


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
        eval_tasks=lambda w: hydra_list(TRACKS[w.track].pair_tasks(w.group, w.source, w.anchor)),
        eval_dir=quoted_dirname,
    log:
        f"{LOGS}/{{track}}/{{group}}/mergekit/{{source}}-onto-{{anchor}}/{{matching}}.log",
    benchmark:
        f"{BENCH}/{{track}}/{{group}}/mergekit/{{source}}-onto-{{anchor}}/{{matching}}.tsv"
    threads: 1
    resources:
        gpu=1,          # evaluated on the same device and in the same precision as symfusion's merges
    conda:
        ENV
    shell:
        "symfusion-merge "
        "task={params.task:q} methods='[simple]' client=mergekit profile={params.profile:q} models={params.models:q} "
        "eval_tasks={params.eval_tasks:q} eval_dir={params.eval_dir:q} > {log:q} 2>&1"
