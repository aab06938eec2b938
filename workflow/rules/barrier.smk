# Loss barriers: loss and accuracy along the linear path between the anchor and the (matched) source.


rule barrier:
    input:
        anchor=f"{RESULTS}/models/{{task}}/{{anchor}}",
        source=f"{RESULTS}/matched/{{task}}/{{source}}-onto-{{anchor}}/{{matching}}",
    output:
        f"{RESULTS}/barrier/{{task}}/{{source}}-onto-{{anchor}}/{{matching}}.json",
    params:
        points=VISION["barrier_points"],
        examples=VISION.get("barrier_examples") or "null",
    log:
        f"{LOGS}/barrier/{{task}}/{{source}}-onto-{{anchor}}/{{matching}}.log",
    benchmark:
        f"{BENCH}/barrier/{{task}}/{{source}}-onto-{{anchor}}/{{matching}}.tsv"
    threads: 1
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-barrier task={wildcards.task} anchor={input.anchor} source={input.source} "
        "points={params.points} examples={params.examples} output={output} > {log} 2>&1"
