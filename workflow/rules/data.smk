# Data: check the task's source and record its fixed, seeded splits (sizes, checksums).


rule data:
    output:
        f"{RESULTS}/data/{{task}}.json",
    params:
        profile=PROFILE,
        output=quoted_output,
    log:
        f"{LOGS}/data/{{task}}.log",
    benchmark:
        f"{BENCH}/data/{{task}}.tsv"
    conda:
        ENV
    shell:
        "symfusion-data "
        "task={wildcards.task:q} profile={params.profile:q} output={params.output:q} > {log:q} 2>&1"
