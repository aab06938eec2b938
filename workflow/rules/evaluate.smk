# Evaluation of the end models: test-split metrics, one JSON each (merged models are evaluated by the merge
# rules in the same process). A NER model is also scored on the out-of-domain NER set.


rule evaluate_end_model:
    input:
        lambda w: model_dir(w.track, w.group, w.name),
    output:
        f"{RESULTS}/{{track}}/{{group}}/eval/end/{{name}}.json",
    params:
        task=end_model_task,
        tasks=lambda w: hydra_list(end_model_eval_tasks(w)),
        profile=PROFILE,
        model_dir=quoted_input(0),
        output=quoted_output,
    log:
        f"{LOGS}/{{track}}/{{group}}/evaluate/end/{{name}}.log",
    benchmark:
        f"{BENCH}/{{track}}/{{group}}/evaluate/end/{{name}}.tsv"
    threads: 1
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "symfusion-evaluate "
        "task={params.task:q} profile={params.profile:q} model_dir={params.model_dir:q} tasks={params.tasks:q} "
        "output={params.output:q} > {log:q} 2>&1"
