# Evaluation of the end models: test-split metrics, one JSON each (merged models are evaluated by the merge
# rules in the same process). A NER model is also scored on the out-of-domain NER set.


rule evaluate_end_model:
    input:
        lambda w: model_dir(w.track, w.group, w.name),
    output:
        f"{RESULTS}/{{track}}/{{group}}/eval/end/{{name}}.json",
    params:
        task=end_model_task,
        tasks=lambda w: ",".join(end_model_eval_tasks(w)),
        profile=PROFILE,
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
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-evaluate task={params.task} profile={params.profile} model_dir={input} "
        "'tasks=[{params.tasks}]' output={output} > {log} 2>&1"
