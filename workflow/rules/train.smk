# Training: one end model per (track, group, name): a ViT from scratch per seed (vision), or the
# pretrained encoder fine-tuned on one dataset (lang). The task's own trainer decides which.


rule train:
    input:
        lambda w: data_file(end_model_task(w)),
    output:
        directory(f"{RESULTS}/{{track}}/{{group}}/models/{{name}}"),
    params:
        task=end_model_task,
        model=end_model_model,
        seed=end_model_seed,
        profile=PROFILE,
        output=quoted_output,
    log:
        f"{LOGS}/{{track}}/{{group}}/train/{{name}}.log",
    benchmark:
        f"{BENCH}/{{track}}/{{group}}/train/{{name}}.tsv"
    threads: end_model_threads
    priority: 10        # the end models head every long chain of the DAG: start them first
    resources:
        gpu=1,
    conda:
        ENV
    shell:
        "symfusion-train "
        "task={params.task:q} model={params.model:q} profile={params.profile:q} seed={params.seed:q} "
        "output={params.output:q} threads={threads} > {log:q} 2>&1"
