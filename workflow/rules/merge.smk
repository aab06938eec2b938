# Merging (vision): fuse the anchor ViT with the matched source by every fusion method and evaluate each
# merged model, in one process per matching (Fisher/Gram/OT statistics use the matched models; no merged
# folder is kept). The language track's merges are in language.smk.


rule merge_evaluate:
    input:
        anchor=model_dir("vision", "{task}", "{anchor}"),
        source=matched_dir("vision", "{task}", "{source}", "{anchor}", "{matching}"),
    output:
        [f"{RESULTS}/vision/{{task}}/eval/{{source}}-onto-{{anchor}}/{{matching}}/{method}.json" for method in FUSION_METHODS],
    params:
        methods=",".join(FUSION_METHODS),
        profile=PROFILE,
        eval_dir=lambda w, output: os.path.dirname(output[0]),
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
        "'methods=[{params.methods}]' 'models=[{input.anchor},{input.source}]' eval_dir={params.eval_dir} > {log} 2>&1"
