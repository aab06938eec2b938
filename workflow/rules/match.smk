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


# Beyond the paper (Appendix D) on independently trained models: the two end ViTs matched by
# anchor vs barycentric matching, and joint vs sequential rotation+rescaling (no models written).
rule vision_multimodel:
    input:
        f"{RESULTS}/models/{{task}}/{ANCHOR_ID}",
        f"{RESULTS}/models/{{task}}/{SOURCE_ID}",
    output:
        f"{RESULTS}/multimodel/{{task}}.json",
    params:
        models=comma_joined,
    log:
        f"{LOGS}/multimodel/{{task}}.log",
    benchmark:
        f"{BENCH}/multimodel/{{task}}.tsv"
    threads: 1
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-multimodel 'models=[{params.models}]' matching=rotation "
        "output={output} > {log} 2>&1"
