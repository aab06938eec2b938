# Matching: move the source end model onto the anchor end model (symfusion-match).


rule match:
    input:
        source=f"{RESULTS}/models/{{task}}/{{source}}",
        anchor=f"{RESULTS}/models/{{task}}/{{anchor}}",
    output:
        directory(f"{RESULTS}/matched/{{task}}/{{source}}-onto-{{anchor}}/{{matching}}"),
    log:
        f"{LOGS}/match/{{task}}/{{source}}-onto-{{anchor}}/{{matching}}.log",
    benchmark:
        f"{BENCH}/match/{{task}}/{{source}}-onto-{{anchor}}/{{matching}}.tsv"
    threads: 1
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-match source={input.source} anchor={input.anchor} output={output} "
        "matching={wildcards.matching} > {log} 2>&1"
