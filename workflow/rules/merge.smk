# Merging: fuse the anchor with the matched source; Fisher/Gram/OT statistics use the matched models.


rule merge:
    input:
        anchor=f"{RESULTS}/models/{{task}}/{{anchor}}",
        source=f"{RESULTS}/matched/{{task}}/{{source}}-onto-{{anchor}}/{{matching}}",
    output:
        directory(f"{RESULTS}/merged/{{task}}/{{source}}-onto-{{anchor}}/{{matching}}/{{method}}"),
    log:
        f"{LOGS}/merge/{{task}}/{{source}}-onto-{{anchor}}/{{matching}}/{{method}}.log",
    benchmark:
        f"{BENCH}/merge/{{task}}/{{source}}-onto-{{anchor}}/{{matching}}/{{method}}.tsv"
    threads: 1
    resources:
        gpu=lambda wildcards: 1 if wildcards.method in ("fisher", "regmean") else 0,
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-merge task={wildcards.task} fusion={wildcards.method} "
        "'models=[{input.anchor},{input.source}]' output={output} > {log} 2>&1"
