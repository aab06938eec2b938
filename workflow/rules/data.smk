# Data: check the task's source and record its fixed, seeded splits (sizes, checksums).


rule data:
    output:
        f"{RESULTS}/data/{{task}}.json",
    params:
        profile=PROFILE,
    log:
        f"{LOGS}/data/{{task}}.log",
    benchmark:
        f"{BENCH}/data/{{task}}.tsv"
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-data task={wildcards.task} profile={params.profile} output={output} > {log} 2>&1"
