# Matching: move the source end model onto the anchor end model (symfusion-match), both tracks.


rule match:
    input:
        source=lambda w: model_dir(w.track, w.group, w.source),
        anchor=lambda w: model_dir(w.track, w.group, w.anchor),
    output:
        directory(f"{RESULTS}/{{track}}/{{group}}/matched/{{source}}-onto-{{anchor}}/{{matching}}"),
    params:
        source=quoted_input("source"),
        anchor=quoted_input("anchor"),
        output=quoted_output,
        data_task=match_data_task,             # full_symmetry_learned reads the source's task; others null
        profile=PROFILE,
    log:
        f"{LOGS}/{{track}}/{{group}}/match/{{source}}-onto-{{anchor}}/{{matching}}.log",
    benchmark:
        f"{BENCH}/{{track}}/{{group}}/match/{{source}}-onto-{{anchor}}/{{matching}}.tsv"
    threads: 1
    conda:
        ENV
    shell:
        "symfusion-match "
        "source={params.source:q} anchor={params.anchor:q} output={params.output:q} "
        "matching={wildcards.matching:q} data_task={params.data_task:q} profile={params.profile:q} > {log:q} 2>&1"
