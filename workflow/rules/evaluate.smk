# Evaluation: test-split metrics of the end models, one JSON each (merged models are evaluated by merge_evaluate).


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
