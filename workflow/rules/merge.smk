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
        methods=lambda w: ",".join(FUSION_METHODS if w.track == "vision" else LANG_METHODS),
        options=lambda w: "" if w.track == "vision" else method_options(w.group, w.name),
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
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-statistics task={params.task} "
        "profile={params.profile} model_dir={input} 'methods=[{params.methods}]' {params.options} output={output} > {log} 2>&1"


rule merge_evaluate:
    input:
        anchor=model_dir("vision", "{task}", "{anchor}"),
        source=matched_dir("vision", "{task}", "{source}", "{anchor}", "{matching}"),
        statistics=lambda w: unmoved_statistics("vision", w.task, unmoved([w.anchor, w.source], w.matching)),
    output:
        [f"{RESULTS}/vision/{{task}}/eval/{{source}}-onto-{{anchor}}/{{matching}}/{method}.json" for method in FUSION_METHODS],
    params:
        methods=",".join(FUSION_METHODS),
        profile=PROFILE,
        eval_dir=lambda w, output: os.path.dirname(output[0]),
        statistics=statistics_option,
    log:
        f"{LOGS}/vision/{{task}}/merge/{{source}}-onto-{{anchor}}/{{matching}}.log",
    benchmark:
        f"{BENCH}/vision/{{task}}/merge/{{source}}-onto-{{anchor}}/{{matching}}.tsv"
    threads: 1
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-merge task={wildcards.task} profile={params.profile} "
        "'methods=[{params.methods}]' 'models=[{input.anchor},{input.source}]' {params.statistics} eval_dir={params.eval_dir} > {log} 2>&1"
