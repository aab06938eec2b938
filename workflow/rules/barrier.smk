# Loss barriers: loss and accuracy along the linear path between the anchor and the (matched) source;
# beside them, the multi-model matching of the two end ViTs (beyond the paper).


rule barrier:
    input:
        anchor=model_dir("vision", "{task}", "{anchor}"),
        source=matched_dir("vision", "{task}", "{source}", "{anchor}", "{matching}"),
    output:
        f"{RESULTS}/vision/{{task}}/barrier/{{source}}-onto-{{anchor}}/{{matching}}.json",
    params:
        points=VISION["barrier_points"],
        profile=PROFILE,
        examples=VISION["barrier_examples"] or "null",
    log:
        f"{LOGS}/vision/{{task}}/barrier/{{source}}-onto-{{anchor}}/{{matching}}.log",
    benchmark:
        f"{BENCH}/vision/{{task}}/barrier/{{source}}-onto-{{anchor}}/{{matching}}.tsv"
    threads: 1
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-barrier task={wildcards.task} profile={params.profile} anchor={input.anchor} "
        "source={input.source} points={params.points} examples={params.examples} output={output} > {log} 2>&1"


# Beyond the paper (Appendix D) on independently trained models: the end ViTs matched by
# anchor vs barycentric matching, and joint vs sequential rotation+rescaling (no models written).
rule vision_multimodel:
    input:
        lambda w: [model_dir("vision", w.task, m) for m in VISION_MODELS],
    output:
        f"{RESULTS}/vision/{{task}}/multimodel.json",
    params:
        models=comma_joined,
    log:
        f"{LOGS}/vision/{{task}}/multimodel.log",
    benchmark:
        f"{BENCH}/vision/{{task}}/multimodel.tsv"
    threads: 1
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-multimodel 'models=[{params.models}]' matching=rotation "
        "output={output} > {log} 2>&1"
