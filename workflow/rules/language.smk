# Language track: its end models are fine-tuned by `train` and matched by `match` (results/<profile>/lang/
# <model>/, the model being the track's group); here: pairwise merges (Table 1 in-domain), the merge of the
# whole NER group (Table 1 out-of-domain), the layer-subset sweep (Figure 6) and group matching (beyond the
# paper). Pairwise merges copy each evaluated task's head; grouped NER merges fuse the heads (one shared
# label space).


rule lang_merge_pair:
    input:
        anchor=model_dir("lang", "{group}", "{anchor}"),
        source=lambda w: source_dir("lang", w.group, w.source, w.anchor, w.matching),
        source_head=model_dir("lang", "{group}", "{source}"),
        statistics=lambda w: unmoved_statistics("lang", w.group, unmoved([w.anchor, w.source], w.matching)),
    output:
        [f"{RESULTS}/lang/{{group}}/eval/{{source}}-onto-{{anchor}}/{{matching}}/{method}.json" for method in LANG_METHODS],
    params:
        profile=PROFILE,
        methods=hydra_list(LANG_METHODS),
        options=lambda w: method_options(w.group, w.anchor),
        models=lambda w, input: hydra_list([input.anchor, input.source]),
        tasks=lambda w: hydra_list([w.anchor, w.source]),
        heads=lambda w, input: hydra_list([input.anchor, input.source_head]),
        eval_dir=quoted_dirname,
        statistics=statistics_option,
    log:
        f"{LOGS}/lang/{{group}}/merge/{{source}}-onto-{{anchor}}/{{matching}}.log",
    benchmark:
        f"{BENCH}/lang/{{group}}/merge/{{source}}-onto-{{anchor}}/{{matching}}.tsv"
    threads: 1
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-merge "
        "task={wildcards.anchor:q} methods={params.methods:q} method_options={params.options:q} "
        "profile={params.profile:q} models={params.models:q} tasks={params.tasks:q} eval_tasks={params.tasks:q} "
        "eval_heads={params.heads:q} statistics={params.statistics:q} eval_dir={params.eval_dir:q} > {log:q} 2>&1"


rule lang_merge_group:
    input:
        anchor=model_dir("lang", "{group}", LANG["ner"][0]),
        sources=lambda w: [source_dir("lang", w.group, s, LANG["ner"][0], w.matching) for s in LANG["ner"][1:]],
        statistics=lambda w: unmoved_statistics("lang", w.group, unmoved(LANG["ner"], w.matching)),
    output:
        [f"{RESULTS}/lang/{{group}}/eval_group/ner/{{matching}}/{method}.json" for method in LANG_METHODS],
    params:
        profile=PROFILE,
        ood=LANG_OOD,
        methods=hydra_list(LANG_METHODS),
        options=lambda w: method_options(w.group, LANG["ner"][0]),
        models=lambda w, input: hydra_list([input.anchor] + list(input.sources)),
        tasks=hydra_list(LANG["ner"]),
        eval_dir=quoted_dirname,
        statistics=statistics_option,
    log:
        f"{LOGS}/lang/{{group}}/merge_group/ner/{{matching}}.log",
    benchmark:
        f"{BENCH}/lang/{{group}}/merge_group/ner/{{matching}}.tsv"
    threads: 1
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-merge "
        "task={params.ood:q} methods={params.methods:q} method_options={params.options:q} profile={params.profile:q} "
        "models={params.models:q} tasks={params.tasks:q} statistics={params.statistics:q} "
        "eval_dir={params.eval_dir:q} > {log:q} 2>&1"


rule layer_sweep:
    input:
        anchor=model_dir("lang", "{group}", LANG["glue"][0]),
        source=model_dir("lang", "{group}", LANG["glue"][1]),
    output:
        f"{RESULTS}/lang/{{group}}/layers.json",
    params:
        profile=PROFILE,
        tasks=hydra_list(LANG["glue"]),
        matching=LANG["matching"],
        examples=LANG.get("sweep_examples") or "null",
        anchor=quoted_input("anchor"),
        source=quoted_input("source"),
        output=quoted_output,
    log:
        f"{LOGS}/lang/{{group}}/layers.log",
    benchmark:
        f"{BENCH}/lang/{{group}}/layers.tsv"
    threads: LANG["train_threads"]  # as many as a fine-tuning (mini: 1; two such jobs share a 2-core machine)
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-layers "
        "anchor={params.anchor:q} source={params.source:q} tasks={params.tasks:q} matching={params.matching:q} "
        "examples={params.examples:q} profile={params.profile:q} output={params.output:q} > {log:q} 2>&1"


# Beyond the paper (Appendix D's open problems): the NER group matched by anchor vs barycentric
# (generalized Procrustes) matching, simple-merged and evaluated out of domain; joint vs sequential
# rotation+rescaling for every pair.
rule multimodel:
    input:
        lambda w: [model_dir("lang", w.group, d) for d in LANG["ner"]],
    output:
        report=f"{RESULTS}/lang/{{group}}/multimodel.json",
        models=temp(directory(f"{RESULTS}/lang/{{group}}/barycenter/ner")),
    params:
        models=quoted_input(),
        matching=LANG["matching"],
        report=lambda w, output: hydra_quote(output.report),
        output_models=lambda w, output: hydra_quote(output.models),
    log:
        f"{LOGS}/lang/{{group}}/multimodel.log",
    benchmark:
        f"{BENCH}/lang/{{group}}/multimodel.tsv"
    threads: LANG["train_threads"]  # as many as a fine-tuning (mini: 1; two such jobs share a 2-core machine)
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-multimodel "
        "models={params.models:q} matching={params.matching:q} matching.multi=barycenter output={params.report:q} "
        "output_models={params.output_models:q} > {log:q} 2>&1"


rule multimodel_merge:
    input:
        rules.multimodel.output.models,
    output:
        f"{RESULTS}/lang/{{group}}/eval_barycenter/ner/simple.json",
    params:
        models=lambda w, input: hydra_list(f"{input[0]}/{i}" for i in range(len(LANG["ner"]))),
        profile=PROFILE,
        ood=LANG_OOD,
        eval_dir=quoted_dirname,
    log:
        f"{LOGS}/lang/{{group}}/merge_barycenter/ner/simple.log",
    benchmark:
        f"{BENCH}/lang/{{group}}/merge_barycenter/ner/simple.tsv"
    threads: 1
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-merge "
        "task={params.ood:q} methods='[simple]' profile={params.profile:q} models={params.models:q} "
        "eval_dir={params.eval_dir:q} > {log:q} 2>&1"
