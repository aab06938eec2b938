# Merging (vision): fuse the anchor ViT with the matched source by every fusion method and evaluate each
# merged model, in one process per matching (Fisher/Gram/OT statistics use the matched models; no merged
# folder is kept). The language track's merges are in language.smk.


# Fisher / Gram statistics of an end model that several merges fuse unmoved (common.smk: shares_statistics),
# computed once on its own task's statistic batches; a merge reads them instead of computing them again
# (symfusion-merge checks that they are of the same weights, data and options, bit for bit the same result).
# Methods of the track without a per-model statistic are skipped by symfusion-statistics.
rule statistics:
    input:
        model_dir("{track}", "{group}", "{name}"),
    output:
        temp(f"{RESULTS}/{{track}}/{{group}}/statistics/{{name}}.safetensors"),
    params:
        task=end_model_task,
        profile=PROFILE,
        methods=lambda w: hydra_list(TRACKS[w.track]["methods"]),
        options=lambda w: TRACKS[w.track]["options"](w.group, w.name),
        model_dir=quoted_input(0),
        output=quoted_output,
    log:
        f"{LOGS}/{{track}}/{{group}}/statistics/{{name}}.log",
    benchmark:
        f"{BENCH}/{{track}}/{{group}}/statistics/{{name}}.tsv"
    threads: 1
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-statistics "
        "task={params.task:q} profile={params.profile:q} model_dir={params.model_dir:q} methods={params.methods:q} "
        "method_options={params.options:q} output={params.output:q} > {log:q} 2>&1"


rule merge_evaluate:
    input:
        anchor=model_dir("vision", "{group}", "{anchor}"),
        source=matched_dir("vision", "{group}", "{source}", "{anchor}", "{matching}"),
        statistics=lambda w: unmoved_statistics("vision", w.group, unmoved([w.anchor, w.source], w.matching)),
    output:
        [f"{RESULTS}/vision/{{group}}/eval/{{source}}-onto-{{anchor}}/{{matching}}/{method}.json" for method in FUSION_METHODS],
    params:
        methods=hydra_list(FUSION_METHODS),
        profile=PROFILE,
        models=lambda w, input: hydra_list([input.anchor, input.source]),
        eval_dir=quoted_dirname,
        statistics=statistics_option,
    log:
        f"{LOGS}/vision/{{group}}/merge/{{source}}-onto-{{anchor}}/{{matching}}.log",
    benchmark:
        f"{BENCH}/vision/{{group}}/merge/{{source}}-onto-{{anchor}}/{{matching}}.tsv"
    threads: 1
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-merge "
        "task={wildcards.group:q} profile={params.profile:q} methods={params.methods:q} models={params.models:q} "
        "statistics={params.statistics:q} eval_dir={params.eval_dir:q} > {log:q} 2>&1"
