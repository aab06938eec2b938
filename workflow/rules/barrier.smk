# Loss barriers: loss and accuracy along the linear path between the anchor and the (matched) source;
# beside them, the multi-model matching of the two end ViTs (beyond the paper).


rule barrier:
    input:
        anchor=model_dir("vision", "{group}", "{anchor}"),
        source=matched_dir("vision", "{group}", "{source}", "{anchor}", "{matching}"),
    output:
        f"{RESULTS}/vision/{{group}}/barrier/{{source}}-onto-{{anchor}}/{{matching}}.json",
    params:
        points=VISION["barrier_points"],
        profile=PROFILE,
        examples=VISION["barrier_examples"] or "null",
        anchor=quoted_input("anchor"),
        source=quoted_input("source"),
        output=quoted_output,
    log:
        f"{LOGS}/vision/{{group}}/barrier/{{source}}-onto-{{anchor}}/{{matching}}.log",
    benchmark:
        f"{BENCH}/vision/{{group}}/barrier/{{source}}-onto-{{anchor}}/{{matching}}.tsv"
    threads: 1
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-barrier "
        "task={wildcards.group:q} profile={params.profile:q} anchor={params.anchor:q} source={params.source:q} "
        "points={params.points:q} examples={params.examples:q} output={params.output:q} > {log:q} 2>&1"


# Beyond the paper (Appendix D) on independently trained models: the end ViTs matched by
# anchor vs barycentric matching, and joint vs sequential rotation+rescaling (no models written).
rule vision_multimodel:
    input:
        lambda w: [model_dir("vision", w.group, m) for m in VISION_MODELS],
    output:
        f"{RESULTS}/vision/{{group}}/multimodel.json",
    params:
        models=quoted_input(),
        output=quoted_output,
    log:
        f"{LOGS}/vision/{{group}}/multimodel.log",
    benchmark:
        f"{BENCH}/vision/{{group}}/multimodel.tsv"
    threads: 1
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-multimodel "
        "models={params.models:q} matching=rotation output={params.output:q} > {log:q} 2>&1"
