# Language track: fine-tune one model per dataset, match and merge pairs (Table 1 in-domain) and the
# whole NER group (Table 1 out-of-domain), sweep layer subsets (Figure 6). Paths: results/<profile>/lang/<model>/.
# Pairwise merges copy each evaluated task's head; grouped NER merges fuse the heads (one shared label space).


rule finetune:
    input:
        f"{RESULTS}/data/{{dataset}}.json",
    output:
        directory(f"{LANG_RESULTS}/{{lmodel}}/models/{{dataset}}"),
    params:
        profile=PROFILE,
        seed=LANG.get("seed", 0),
    log:
        f"{LOGS}/lang/{{lmodel}}/finetune/{{dataset}}.log",
    benchmark:
        f"{BENCH}/lang/{{lmodel}}/finetune/{{dataset}}.tsv"
    threads: LANG.get("train_threads", 1)
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-train task={wildcards.dataset} model={wildcards.lmodel} "
        "profile={params.profile} seed={params.seed} output={output} threads={threads} > {log} 2>&1"


rule lang_match:
    input:
        source=f"{LANG_RESULTS}/{{lmodel}}/models/{{source}}",
        anchor=f"{LANG_RESULTS}/{{lmodel}}/models/{{anchor}}",
    output:
        directory(f"{LANG_RESULTS}/{{lmodel}}/matched/{{source}}-onto-{{anchor}}/{{matching}}"),
    log:
        f"{LOGS}/lang/{{lmodel}}/match/{{source}}-onto-{{anchor}}/{{matching}}.log",
    benchmark:
        f"{BENCH}/lang/{{lmodel}}/match/{{source}}-onto-{{anchor}}/{{matching}}.tsv"
    threads: 1
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-match source={input.source} anchor={input.anchor} "
        "output={output} matching={wildcards.matching} > {log} 2>&1"


rule lang_merge_pair:
    input:
        anchor=f"{LANG_RESULTS}/{{lmodel}}/models/{{anchor}}",
        source=lambda w: lang_source_dir(w.lmodel, w.source, w.anchor, w.matching),
        source_head=f"{LANG_RESULTS}/{{lmodel}}/models/{{source}}",
    output:
        [f"{LANG_RESULTS}/{{lmodel}}/eval/{{source}}-onto-{{anchor}}/{{matching}}/{method}.json" for method in LANG_METHODS],
    params:
        profile=PROFILE,
        methods=",".join(LANG_METHODS),
        options=lambda w: method_options(w.lmodel, w.anchor),
        eval_dir=lambda w, output: os.path.dirname(output[0]),
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
        "OMP_NUM_THREADS={threads} symfusion-merge task={wildcards.anchor} 'methods=[{params.methods}]' "
        "{params.options} profile={params.profile} 'models=[{input.anchor},{input.source}]' "
        "'tasks=[{wildcards.anchor},{wildcards.source}]' 'eval_tasks=[{wildcards.anchor},{wildcards.source}]' "
        "'eval_heads=[{input.anchor},{input.source_head}]' eval_dir={params.eval_dir} > {log} 2>&1"


rule lang_merge_group:
    input:
        anchor=lambda w: lang_model_dir(w.lmodel, LANG["ner"][0]),
        sources=lambda w: [lang_source_dir(w.lmodel, s, LANG["ner"][0], w.matching) for s in LANG["ner"][1:]],
    output:
        [f"{LANG_RESULTS}/{{lmodel}}/eval_group/ner/{{matching}}/{method}.json" for method in LANG_METHODS],
    params:
        profile=PROFILE,
        ood=LANG_OOD,
        methods=",".join(LANG_METHODS),
        options=lambda w: method_options(w.lmodel, LANG["ner"][0]),
        models=lambda w, input: ",".join([input.anchor] + list(input.sources)),
        tasks=",".join(LANG.get("ner", [])),
        eval_dir=lambda w, output: os.path.dirname(output[0]),
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
        "OMP_NUM_THREADS={threads} symfusion-merge task={params.ood} 'methods=[{params.methods}]' {params.options} "
        "profile={params.profile} 'models=[{params.models}]' 'tasks=[{params.tasks}]' eval_dir={params.eval_dir} "
        "> {log} 2>&1"


rule lang_evaluate_end_model:
    input:
        f"{LANG_RESULTS}/{{lmodel}}/models/{{dataset}}",
    output:
        f"{LANG_RESULTS}/{{lmodel}}/eval/end/{{dataset}}.json",
    params:
        profile=PROFILE,
        tasks=lambda w: ",".join([w.dataset] + ([LANG_OOD] if w.dataset in LANG.get("ner", []) else [])),
    log:
        f"{LOGS}/lang/{{lmodel}}/evaluate/end/{{dataset}}.log",
    benchmark:
        f"{BENCH}/lang/{{lmodel}}/evaluate/end/{{dataset}}.tsv"
    threads: 1
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-evaluate task={wildcards.dataset} profile={params.profile} "
        "model_dir={input} 'tasks=[{params.tasks}]' output={output} > {log} 2>&1"


rule layer_sweep:
    input:
        anchor=lambda w: lang_model_dir(w.lmodel, LANG["glue"][0]),
        source=lambda w: lang_model_dir(w.lmodel, LANG["glue"][1]),
    output:
        f"{LANG_RESULTS}/{{lmodel}}/layers.json",
    params:
        profile=PROFILE,
        tasks=",".join(LANG.get("glue", [])),
        matching=LANG.get("matching", "attn_only_no_rescale"),
        examples=LANG.get("sweep_examples") or "null",
    log:
        f"{LOGS}/lang/{{lmodel}}/layers.log",
    benchmark:
        f"{BENCH}/lang/{{lmodel}}/layers.tsv"
    threads: 2
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-layers anchor={input.anchor} source={input.source} "
        "'tasks=[{params.tasks}]' matching={params.matching} examples={params.examples} profile={params.profile} "
        "output={output} > {log} 2>&1"


# Beyond the paper (Appendix D's open problems): the NER group matched by anchor vs barycentric
# (generalized Procrustes) matching, simple-merged and evaluated out of domain; joint vs sequential
# rotation+rescaling for every pair.
rule multimodel:
    input:
        lambda w: [lang_model_dir(w.lmodel, d) for d in LANG["ner"]],
    output:
        report=f"{LANG_RESULTS}/{{lmodel}}/multimodel.json",
        models=temp(directory(f"{LANG_RESULTS}/{{lmodel}}/barycenter/ner")),
    params:
        models=lambda w, input: ",".join(input),
        matching=LANG.get("matching", "attn_only_no_rescale"),
    log:
        f"{LOGS}/lang/{{lmodel}}/multimodel.log",
    benchmark:
        f"{BENCH}/lang/{{lmodel}}/multimodel.tsv"
    threads: 2
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-multimodel 'models=[{params.models}]' matching={params.matching} "
        "matching.multi=barycenter output={output.report} output_models={output.models} > {log} 2>&1"


rule multimodel_merge:
    input:
        f"{LANG_RESULTS}/{{lmodel}}/barycenter/ner",
    output:
        f"{LANG_RESULTS}/{{lmodel}}/eval_barycenter/ner/simple.json",
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
        "OMP_NUM_THREADS={threads} symfusion-merge task={params.ood} 'methods=[simple]' profile={params.profile} "
        "'models=[{params.models}]' eval_dir={params.eval_dir} > {log} 2>&1"
