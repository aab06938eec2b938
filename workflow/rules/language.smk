# Language track: its end models are fine-tuned by `train` and matched by `match` (results/<profile>/lang/
# <model>/, the model being the track's group), its pairwise merges (Table 1 in-domain; each evaluated task with its
# own head) by `lang_merge_pair` (merge.smk); here: the merge of the whole NER group (Table 1 out-of-domain; the
# heads fused: one shared label space), the layer-subset sweep (Figure 6) and group matching (beyond the paper).


rule lang_merge_group:
    input:
        anchor=model_dir("lang", "{group}", LANG["ner"][0]),
        sources=lambda w: [source_dir("lang", w.group, s, LANG["ner"][0], w.matching) for s in LANG["ner"][1:]],
        statistics=lambda w: unmoved_statistics("lang", w.group, unmoved(LANG["ner"], w.matching)),
    output:
        [f"{RESULTS}/lang/{{group}}/eval_group/ner/{{matching}}/{method}.json" for method in TRACKS["lang"].methods],
    params:
        profile=PROFILE,
        ood=LANG["ner_ood"],
        methods=hydra_list(TRACKS["lang"].methods),
        options=lambda w: merge_options("lang", w.group, LANG["ner"][0]),
        models=lambda w, input: hydra_list([input.anchor] + list(input.sources)),
        tasks=hydra_list(LANG["ner"]),
        eval_dir=quoted_dirname,
        statistics=statistics_option,
    log:
        f"{LOGS}/lang/{{group}}/merge_group/ner/{{matching}}.log",
    benchmark:
        f"{BENCH}/lang/{{group}}/merge_group/ner/{{matching}}.tsv"
    threads: 1
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "symfusion-merge "
        "task={params.ood:q} methods={params.methods:q} method_options={params.options:q} profile={params.profile:q} "
        "models={params.models:q} tasks={params.tasks:q} statistics={params.statistics:q} "
        "eval_dir={params.eval_dir:q} > {log:q} 2>&1"


rule layer_sweep:
    input:
        anchor=model_dir("lang", "{group}", LANG["glue"][0]),
        source=model_dir("lang", "{group}", LANG["glue"][1]),
    output:
        f"{RESULTS}/lang/{{group}}/layers.json",
    params:
        profile=PROFILE,
        tasks=hydra_list(LANG["glue"]),
        matching=LANG["matching"],
        examples=LANG.get("sweep_examples") or "null",
        anchor=quoted_input("anchor"),
        source=quoted_input("source"),
        output=quoted_output,
    log:
        f"{LOGS}/lang/{{group}}/layers.log",
    benchmark:
        f"{BENCH}/lang/{{group}}/layers.tsv"
    threads: LANG["train_threads"]  # as many as a fine-tuning (mini: 1; two such jobs share a 2-core machine)
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "symfusion-layers "
        "anchor={params.anchor:q} source={params.source:q} tasks={params.tasks:q} matching={params.matching:q} "
        "examples={params.examples:q} profile={params.profile:q} output={params.output:q} > {log:q} 2>&1"


# Beyond the paper (Appendix D's open problems): the NER group matched by anchor vs barycentric
# (generalized Procrustes) matching, simple-merged and evaluated out of domain; joint vs sequential
# rotation+rescaling for every pair.
rule multimodel:
    input:
        lambda w: [model_dir("lang", w.group, d) for d in LANG["ner"]],
    output:
        report=f"{RESULTS}/lang/{{group}}/multimodel.json",
        models=temp(directory(f"{RESULTS}/lang/{{group}}/barycenter/ner")),
    params:
        models=quoted_input(),
        matching=LANG["matching"],
        report=lambda w, output: hydra_quote(output.report),
        output_models=lambda w, output: hydra_quote(output.models),
    log:
        f"{LOGS}/lang/{{group}}/multimodel.log",
    benchmark:
        f"{BENCH}/lang/{{group}}/multimodel.tsv"
    threads: LANG["train_threads"]  # as many as a fine-tuning (mini: 1; two such jobs share a 2-core machine)
    conda:
        ENV
    shell:
        "symfusion-multimodel "
        "models={params.models:q} matching={params.matching:q} matching.multi=barycenter output={params.report:q} "
        "output_models={params.output_models:q} > {log:q} 2>&1"


rule multimodel_merge:
    input:
        rules.multimodel.output.models,
    output:
        f"{RESULTS}/lang/{{group}}/eval_barycenter/ner/simple.json",
    params:
        models=lambda w, input: hydra_list(f"{input[0]}/{i}" for i in range(len(LANG["ner"]))),
        profile=PROFILE,
        ood=LANG["ner_ood"],
        eval_dir=quoted_dirname,
    log:
        f"{LOGS}/lang/{{group}}/merge_barycenter/ner/simple.log",
    benchmark:
        f"{BENCH}/lang/{{group}}/merge_barycenter/ner/simple.tsv"
    threads: 1
    conda:
        ENV
    shell:
        "symfusion-merge "
        "task={params.ood:q} methods='[simple]' profile={params.profile:q} models={params.models:q} "
        "eval_dir={params.eval_dir:q} > {log:q} 2>&1"
