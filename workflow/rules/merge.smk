# Merging: fuse the anchor with the (matched) source by every fusion method of the track and evaluate each merged
# model, in one process per pair and matching (Fisher / Gram / OT statistics use the matched models; no merged folder
# is kept). One rule per set of methods: vision's six, the language track's and the decoders' three; the language
# track's group merge is in language.smk.


# Fisher / Gram statistics of an end model that several merges fuse unmoved (sharing.smk: shares_statistics),
# computed once on its own task's statistic batches; a merge reads them instead of computing them again
# (symfusion-merge checks that they are of the same weights, data and options, bit for bit the same result).
# Methods of the track without a per-model statistic are skipped by symfusion-statistics.
rule statistics:
    input:
        model_dir("{track}", "{group}", "{name}"),
    output:
        temp(f"{RESULTS}/{{track}}/{{group}}/statistics/{{name}}.safetensors"),
    params:
        task=end_model_task,
        profile=PROFILE,
        methods=lambda w: hydra_list(TRACKS[w.track].methods),
        options=lambda w: merge_options(w.track, w.group, w.name),
        model_dir=quoted_input(0),
        output=quoted_output,
    log:
        f"{LOGS}/{{track}}/{{group}}/statistics/{{name}}.log",
    benchmark:
        f"{BENCH}/{{track}}/{{group}}/statistics/{{name}}.tsv"
    threads: 1
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "symfusion-statistics "
        "task={params.task:q} profile={params.profile:q} model_dir={params.model_dir:q} methods={params.methods:q} "
        "method_options={params.options:q} output={params.output:q} > {log:q} 2>&1"


# The merges of a pair under one matching, per track: vision's six methods here, the language track's and the
# decoders' three in the rules below, which are this one with their own tracks and outputs.
rule merge_evaluate:
    wildcard_constraints:
        **merge_constraints(MERGE_RULES["merge_evaluate"]),
    input:
        anchor=model_dir("{track}", "{group}", "{anchor}"),
        source=lambda w: source_dir(w.track, w.group, w.source, w.anchor, w.matching),
        heads=merge_heads,
        statistics=lambda w: unmoved_statistics(w.track, w.group, unmoved([w.anchor, w.source], w.matching)),
    output:
        merge_outputs(MERGE_RULES["merge_evaluate"]),
    params:
        profile=PROFILE,
        task=lambda w: task_of(w.track, w.group, w.anchor),
        methods=lambda w: hydra_list(TRACKS_PY.pair_methods(TRACKS[w.track], (w.source, w.anchor))),
        options=lambda w: merge_options(w.track, w.group, w.anchor),
        models=lambda w, input: hydra_list([input.anchor, input.source]),
        tasks=merge_statistic_tasks,
        eval_tasks=lambda w: hydra_list(TRACKS[w.track].pair_tasks(w.group, w.source, w.anchor)),
        heads=lambda w, input: hydra_list(input.heads) if input.heads else "null",
        eval_dir=quoted_dirname,
        statistics=statistics_option,
    log:
        f"{LOGS}/{{track}}/{{group}}/merge/{{source}}-onto-{{anchor}}/{{matching}}.log",
    benchmark:
        f"{BENCH}/{{track}}/{{group}}/merge/{{source}}-onto-{{anchor}}/{{matching}}.tsv"
    threads: 1
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "symfusion-merge "
        "task={params.task:q} methods={params.methods:q} method_options={params.options:q} profile={params.profile:q} "
        "models={params.models:q} tasks={params.tasks:q} eval_tasks={params.eval_tasks:q} "
        "eval_heads={params.heads:q} statistics={params.statistics:q} eval_dir={params.eval_dir:q} > {log:q} 2>&1"


use rule merge_evaluate as lang_merge_pair with:
    wildcard_constraints:
        **merge_constraints(MERGE_RULES["lang_merge_pair"]),
    output:
        merge_outputs(MERGE_RULES["lang_merge_pair"]),


use rule merge_evaluate as decoder_merge with:
    wildcard_constraints:
        **merge_constraints(MERGE_RULES["decoder_merge"]),
    output:
        merge_outputs(MERGE_RULES["decoder_merge"]),


# The pairs after the first, where the profile merges them by fewer methods (more_pairs: the vision and decoder
# tracks): the same merges, their own outputs.
if limited(MERGE_RULES["merge_evaluate"]):

    use rule merge_evaluate as merge_evaluate_more with:
        wildcard_constraints:
            **merge_constraints(MERGE_RULES["merge_evaluate"], more=True),
        output:
            merge_outputs(MERGE_RULES["merge_evaluate"], more=True),


if limited(MERGE_RULES["decoder_merge"]):

    use rule merge_evaluate as decoder_merge_more with:
        wildcard_constraints:
            **merge_constraints(MERGE_RULES["decoder_merge"], more=True),
        output:
            merge_outputs(MERGE_RULES["decoder_merge"], more=True),
