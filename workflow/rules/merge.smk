# Merging: fuse the anchor with the matched source by every fusion method and evaluate each merged model,
# in one process per matching (Fisher/Gram/OT statistics use the matched models; no merged folder is kept).


rule merge_evaluate:
    input:
        anchor=f"{RESULTS}/models/{{task}}/{{anchor}}",
        source=f"{RESULTS}/matched/{{task}}/{{source}}-onto-{{anchor}}/{{matching}}",
    output:
        [f"{RESULTS}/eval/{{task}}/{{source}}-onto-{{anchor}}/{{matching}}/{method}.json" for method in FUSION_METHODS],
    params:
        methods=",".join(FUSION_METHODS),
        eval_dir=lambda w, output: os.path.dirname(output[0]),
    log:
        f"{LOGS}/merge/{{task}}/{{source}}-onto-{{anchor}}/{{matching}}.log",
    benchmark:
        f"{BENCH}/merge/{{task}}/{{source}}-onto-{{anchor}}/{{matching}}.tsv"
    threads: 1
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-merge task={wildcards.task} 'methods=[{params.methods}]' "
        "'models=[{input.anchor},{input.source}]' eval_dir={params.eval_dir} > {log} 2>&1"
