# Beyond the paper (issue 58): the track's k end models merged into one. Each way of moving all k into one basis, then
# its centroid merge and simplex barrier (symfusion-kway, pipeline/kway.py): `anchor` (each model onto the first by a
# pairwise matching: the match rule's folders; matching none = naive averaging), `barycenter` (the paper's grouped
# matching, symfusion-multimodel matching.multi=barycenter), `universe` (symfusion-align-many: all k into one shared
# basis; a matching that reads data reads the track's train batches); beside them the end models, their best and their
# logit ensemble, and the end models' losses on the barrier's examples (kway_ends, once per track; each way reads
# them). The tracks: vision and decoder (KWAY_TRACKS; the barycentric matching vision only: symfusion-multimodel's
# grouped matching refuses decoders). Only an experiment built on demand reads these (conf/experiments.yaml
# table_kway, fig_kway).
# The helper functions: kway_inputs.smk.

rule align_many:
    wildcard_constraints:
        track=KWAY_TRACKS,
    input:
        lambda w: track_models(w.track, w.group),
    output:
        directory(f"{RESULTS}/{{track}}/{{group}}/aligned_many/{{matching}}"),
    params:
        models=quoted_input(),
        output=quoted_output,
        data_task=kway_data_task,
        profile=PROFILE,
    log:
        f"{LOGS}/{{track}}/{{group}}/align_many/{{matching}}.log",
    benchmark:
        f"{BENCH}/{{track}}/{{group}}/align_many/{{matching}}.tsv"
    threads: 1
    conda:
        ENV
    shell:
        "symfusion-align-many "
        "models={params.models:q} output={params.output:q} matching={wildcards.matching:q} "
        "data_task={params.data_task:q} profile={params.profile:q} > {log:q} 2>&1"


rule kway_barycenter:
    wildcard_constraints:
        track="vision",
    input:
        lambda w: track_models(w.track, w.group),
    output:
        report=f"{RESULTS}/{{track}}/{{group}}/kway_barycenter/{{matching}}.json",
        models=directory(f"{RESULTS}/{{track}}/{{group}}/kway_barycenter/{{matching}}"),
    params:
        models=quoted_input(),
        report=lambda w, output: hydra_quote(output.report),
        output_models=lambda w, output: hydra_quote(output.models),
    log:
        f"{LOGS}/{{track}}/{{group}}/kway_barycenter/{{matching}}.log",
    benchmark:
        f"{BENCH}/{{track}}/{{group}}/kway_barycenter/{{matching}}.tsv"
    threads: 1
    conda:
        ENV
    shell:
        "symfusion-multimodel "
        "models={params.models:q} matching={wildcards.matching:q} matching.multi=barycenter output={params.report:q} "
        "output_models={params.output_models:q} > {log:q} 2>&1"


rule kway_score:
    wildcard_constraints:
        track=KWAY_TRACKS,
        way="|".join(KWAY_WAYS),
    input:
        ends=lambda w: track_models(w.track, w.group),
        models=lambda w: kway_inputs(w.track, w.group, w.way, w.matching),
        line=lambda w: rules.kway_ends.output[0].format(track=w.track, group=w.group),
    output:
        f"{RESULTS}/{{track}}/{{group}}/kway/{{way}}/{{matching}}.json",
    params:
        ends=quoted_input("ends"),
        line=quoted_input("line"),
        models=kway_models,
        task=lambda w: task_of(w.track, w.group, TRACKS[w.track].models[0]),
        examples=barrier_examples,
        name=lambda w: hydra_quote(f"{w.way}/{w.matching}"),
        output=quoted_output,
        profile=PROFILE,
    log:
        f"{LOGS}/{{track}}/{{group}}/kway/{{way}}/{{matching}}.log",
    benchmark:
        f"{BENCH}/{{track}}/{{group}}/kway/{{way}}/{{matching}}.tsv"
    threads: 1
    conda:
        ENV
    shell:
        "symfusion-kway "
        "task={params.task:q} profile={params.profile:q} ends={params.ends:q} models={params.models:q} "
        "examples={params.examples:q} way={params.name:q} line={params.line:q} output={params.output:q} "
        "> {log:q} 2>&1"


rule kway_ends:
    wildcard_constraints:
        track=KWAY_TRACKS,
    input:
        lambda w: track_models(w.track, w.group),
    output:
        f"{RESULTS}/{{track}}/{{group}}/kway/ends.json",
    params:
        ends=quoted_input(),
        task=lambda w: task_of(w.track, w.group, TRACKS[w.track].models[0]),
        examples=barrier_examples,
        output=quoted_output,
        profile=PROFILE,
    log:
        f"{LOGS}/{{track}}/{{group}}/kway/ends.log",
    benchmark:
        f"{BENCH}/{{track}}/{{group}}/kway/ends.tsv"
    threads: 1
    conda:
        ENV
    shell:
        "symfusion-kway "
        "task={params.task:q} profile={params.profile:q} ends={params.ends:q} examples={params.examples:q} "
        "output={params.output:q} > {log:q} 2>&1"
