# Evaluation: test-split metrics of end models and merged models, one JSON each.


rule evaluate_merged:
    input:
        f"{RESULTS}/merged/{{task}}/{{source}}-onto-{{anchor}}/{{matching}}/{{method}}",
    output:
        f"{RESULTS}/eval/{{task}}/{{source}}-onto-{{anchor}}/{{matching}}/{{method}}.json",
    log:
        f"{LOGS}/evaluate/{{task}}/{{source}}-onto-{{anchor}}/{{matching}}/{{method}}.log",
    benchmark:
        f"{BENCH}/evaluate/{{task}}/{{source}}-onto-{{anchor}}/{{matching}}/{{method}}.tsv"
    threads: 1
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-evaluate task={wildcards.task} model_dir={input} output={output} > {log} 2>&1"


rule evaluate_end_model:
    input:
        f"{RESULTS}/models/{{task}}/{{source}}",
    output:
        f"{RESULTS}/eval/{{task}}/end_models/{{source}}.json",
    log:
        f"{LOGS}/evaluate/{{task}}/end_models/{{source}}.log",
    benchmark:
        f"{BENCH}/evaluate/{{task}}/end_models/{{source}}.tsv"
    threads: 1
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-evaluate task={wildcards.task} model_dir={input} output={output} > {log} 2>&1"
