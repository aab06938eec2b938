# Loss barriers: loss (and accuracy) along the linear path between the anchor and the (matched) source, for the
# vision and decoder tracks; beside them, the multi-model matching of the end ViTs (beyond the paper).


rule barrier:
    wildcard_constraints:
        track="|".join(("vision",) + DECODER_TRACKS),
    input:
        anchor=model_dir("{track}", "{group}", "{anchor}"),
        source=lambda w: source_dir(w.track, w.group, w.source, w.anchor, w.matching),
    output:
        f"{RESULTS}/{{track}}/{{group}}/barrier/{{source}}-onto-{{anchor}}/{{matching}}.json",
    params:
        profile=PROFILE,
        task=lambda w: task_of(w.track, w.group, w.anchor),
        points=lambda w: TRACKS[w.track].barrier["points"],
        examples=barrier_examples,
        anchor=quoted_input("anchor"),
        source=quoted_input("source"),
        output=quoted_output,
    log:
        f"{LOGS}/{{track}}/{{group}}/barrier/{{source}}-onto-{{anchor}}/{{matching}}.log",
    benchmark:
        f"{BENCH}/{{track}}/{{group}}/barrier/{{source}}-onto-{{anchor}}/{{matching}}.tsv"
    threads: 1
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "symfusion-barrier "
        "task={params.task:q} profile={params.profile:q} anchor={params.anchor:q} source={params.source:q} "
        "points={params.points:q} examples={params.examples:q} output={params.output:q} > {log:q} 2>&1"


# Beyond the paper (Appendix D) on independently trained models: the end ViTs matched by
# anchor vs barycentric matching, and joint vs sequential rotation+rescaling (no models written).
rule vision_multimodel:
    input:
        lambda w: [model_dir("vision", w.group, m) for m in TRACKS["vision"].models],
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
        "symfusion-multimodel "
        "models={params.models:q} matching=rotation output={params.output:q} > {log:q} 2>&1"
