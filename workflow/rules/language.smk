# Language track: its end models are fine-tuned by `train` and matched by `match` (results/<profile>/lang/
# <model>/); here: pairwise merges (Table 1 in-domain), the merge of the whole NER group (Table 1
# out-of-domain), the layer-subset sweep (Figure 6) and group matching (beyond the paper).
# Pairwise merges copy each evaluated task's head; grouped NER merges fuse the heads (one shared label space).


rule lang_merge_pair:
    input:
        anchor=model_dir("lang", "{lmodel}", "{anchor}"),
        source=lambda w: source_dir("lang", w.lmodel, w.source, w.anchor, w.matching),
        source_head=model_dir("lang", "{lmodel}", "{source}"),
        statistics=lambda w: unmoved_statistics("lang", w.lmodel, unmoved([w.anchor, w.source], w.matching)),
    output:
        [f"{RESULTS}/lang/{{lmodel}}/eval/{{source}}-onto-{{anchor}}/{{matching}}/{method}.json" for method in LANG_METHODS],
    params:
        profile=PROFILE,
        methods=",".join(LANG_METHODS),
        options=lambda w: method_options(w.lmodel, w.anchor),
        eval_dir=lambda w, output: os.path.dirname(output[0]),
        statistics=statistics_option,
    log:
        f"{LOGS}/lang/{{lmodel}}/merge/{{source}}-onto-{{anchor}}/{{matching}}.log",
    benchmark:
        f"{BENCH}/lang/{{lmodel}}/merge/{{source}}-onto-{{anchor}}/{{matching}}.tsv"
    threads: 1
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-merge task={wildcards.anchor} 'methods=[{params.methods}]' "
        "{params.options} profile={params.profile} 'models=[{input.anchor},{input.source}]' "
        "'tasks=[{wildcards.anchor},{wildcards.source}]' 'eval_tasks=[{wildcards.anchor},{wildcards.source}]' "
        "'eval_heads=[{input.anchor},{input.source_head}]' {params.statistics} eval_dir={params.eval_dir} > {log} 2>&1"


rule lang_merge_group:
    input:
        anchor=model_dir("lang", "{lmodel}", LANG["ner"][0]),
        sources=lambda w: [source_dir("lang", w.lmodel, s, LANG["ner"][0], w.matching) for s in LANG["ner"][1:]],
        statistics=lambda w: unmoved_statistics("lang", w.lmodel, unmoved(LANG["ner"], w.matching)),
    output:
        [f"{RESULTS}/lang/{{lmodel}}/eval_group/ner/{{matching}}/{method}.json" for method in LANG_METHODS],
    params:
        profile=PROFILE,
        ood=LANG_OOD,
        methods=",".join(LANG_METHODS),
        options=lambda w: method_options(w.lmodel, LANG["ner"][0]),
        models=lambda w, input: ",".join([input.anchor] + list(input.sources)),
        tasks=",".join(LANG["ner"]),
        eval_dir=lambda w, output: os.path.dirname(output[0]),
        statistics=statistics_option,
    log:
        f"{LOGS}/lang/{{lmodel}}/merge_group/ner/{{matching}}.log",
    benchmark:
        f"{BENCH}/lang/{{lmodel}}/merge_group/ner/{{matching}}.tsv"
    threads: 1
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-merge task={params.ood} 'methods=[{params.methods}]' {params.options} "
        "profile={params.profile} 'models=[{params.models}]' 'tasks=[{params.tasks}]' {params.statistics} eval_dir={params.eval_dir} "
        "> {log} 2>&1"


rule layer_sweep:
    input:
        anchor=model_dir("lang", "{lmodel}", LANG["glue"][0]),
        source=model_dir("lang", "{lmodel}", LANG["glue"][1]),
    output:
        f"{RESULTS}/lang/{{lmodel}}/layers.json",
    params:
        profile=PROFILE,
        tasks=",".join(LANG["glue"]),
        matching=LANG["matching"],
        examples=LANG.get("sweep_examples") or "null",
    log:
        f"{LOGS}/lang/{{lmodel}}/layers.log",
    benchmark:
        f"{BENCH}/lang/{{lmodel}}/layers.tsv"
    threads: LANG["train_threads"]  # as many as a fine-tuning (mini: 1; two such jobs share a 2-core machine)
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-layers anchor={input.anchor} source={input.source} "
        "'tasks=[{params.tasks}]' matching={params.matching} examples={params.examples} profile={params.profile} "
        "output={output} > {log} 2>&1"


# Beyond the paper (Appendix D's open problems): the NER group matched by anchor vs barycentric
# (generalized Procrustes) matching, simple-merged and evaluated out of domain; joint vs sequential
# rotation+rescaling for every pair.
rule multimodel:
    input:
        lambda w: [model_dir("lang", w.lmodel, d) for d in LANG["ner"]],
    output:
        report=f"{RESULTS}/lang/{{lmodel}}/multimodel.json",
        models=temp(directory(f"{RESULTS}/lang/{{lmodel}}/barycenter/ner")),
    params:
        models=comma_joined,
        matching=LANG["matching"],
    log:
        f"{LOGS}/lang/{{lmodel}}/multimodel.log",
    benchmark:
        f"{BENCH}/lang/{{lmodel}}/multimodel.tsv"
    threads: LANG["train_threads"]  # as many as a fine-tuning (mini: 1; two such jobs share a 2-core machine)
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-multimodel 'models=[{params.models}]' matching={params.matching} "
        "matching.multi=barycenter output={output.report} output_models={output.models} > {log} 2>&1"


rule multimodel_merge:
    input:
        rules.multimodel.output.models,
    output:
        f"{RESULTS}/lang/{{lmodel}}/eval_barycenter/ner/simple.json",
    params:
        models=lambda w, input: ",".join(f"{input[0]}/{i}" for i in range(len(LANG["ner"]))),
        profile=PROFILE,
        ood=LANG_OOD,
        eval_dir=lambda w, output: os.path.dirname(output[0]),
    log:
        f"{LOGS}/lang/{{lmodel}}/merge_barycenter/ner/simple.log",
    benchmark:
        f"{BENCH}/lang/{{lmodel}}/merge_barycenter/ner/simple.tsv"
    threads: 1
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-merge task={params.ood} 'methods=[simple]' profile={params.profile} "
        "'models=[{params.models}]' eval_dir={params.eval_dir} > {log} 2>&1"
