# Training: one end model per (task, seed), from scratch (vision) or fine-tuned (language).


rule train:
    input:
        f"{RESULTS}/data/{{task}}.json",
    output:
        directory(f"{RESULTS}/models/{{task}}/seed{{seed}}"),
    params:
        model=lambda wildcards: VISION["model"],
    log:
        f"{LOGS}/train/{{task}}/seed{{seed}}.log",
    benchmark:
        f"{BENCH}/train/{{task}}/seed{{seed}}.tsv"
    threads: VISION["train_threads"]
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-train task={wildcards.task} model={params.model} seed={wildcards.seed} "
        "output={output} threads={threads} > {log} 2>&1"
