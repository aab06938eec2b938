# Report: the tables and figures of the experiment registry (experiments.smk, conf/experiments.yaml) from the
# stage results (symfusion-report), beside the paper's numbers, then the audit report of all of them. One rule
# per kind of artefact (tables: CSV + Markdown in results/<profile>/; figures: PNG + CSV in figures/<profile>/),
# the experiment's name being the wildcard; each gets the input files its registry entry declares.


wildcard_constraints:
    table="|".join(TABLE_NAMES),
    figure="|".join(FIGURE_NAMES),


rule table:
    input:
        lambda w: experiment_inputs(w.table),
    output:
        csv=report(f"{RESULTS}/{{table}}.csv", caption="../report/table.rst", category="Tables"),
        md=f"{RESULTS}/{{table}}.md",
    params:
        inputs=quoted_input(),
        output=lambda w, output: hydra_quote(output.csv),
        caption=lambda w: REGISTRY[w.table]["caption"],
    log:
        f"{LOGS}/report/{{table}}.log",
    benchmark:
        f"{BENCH}/report/{{table}}.tsv"
    conda:
        ENV
    shell:
        "symfusion-report "
        "artefact={wildcards.table:q} inputs={params.inputs:q} output={params.output:q} > {log:q} 2>&1"


rule figure:
    input:
        lambda w: experiment_inputs(w.figure),
    output:
        png=report(f"{FIGURES}/{{figure}}.png", caption="../report/figure.rst", category="Figures"),
        csv=f"{FIGURES}/{{figure}}.csv",
    params:
        inputs=quoted_input(),
        output=lambda w, output: hydra_quote(output.png),
        caption=lambda w: REGISTRY[w.figure]["caption"],
    log:
        f"{LOGS}/report/{{figure}}.log",
    benchmark:
        f"{BENCH}/report/{{figure}}.tsv"
    conda:
        ENV
    shell:
        "symfusion-report "
        "artefact={wildcards.figure:q} inputs={params.inputs:q} output={params.output:q} > {log:q} 2>&1"


rule report:
    input:
        [artefact_file(name) for name in DEFAULT_EXPERIMENTS],
    output:
        md=report(f"{RESULTS}/report.md", caption="../report/report.rst", category="Report"),
        provenance=f"{RESULTS}/provenance.json",
    params:
        inputs=quoted_input(),
        output=lambda w, output: hydra_quote(output.md),
    log:
        f"{LOGS}/report/report.log",
    benchmark:
        f"{BENCH}/report/report.tsv"
    conda:
        ENV
    shell:
        "symfusion-report "
        "artefact=report inputs={params.inputs:q} output={params.output:q} > {log:q} 2>&1"
