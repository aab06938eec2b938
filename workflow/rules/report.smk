# Report: tables and figures from the stage results (symfusion-report), beside the paper's numbers, then the
# audit report. One rule per kind of artefact (tables: CSV + Markdown in results/<profile>/; figures: PNG +
# CSV in figures/<profile>/), the artefact being the wildcard; each gets its input files explicitly.


# artefact -> (symfusion-report's artefact name, its input files)
TABLES = {
    "table1": ("table1", table1_inputs()),
    "table2": ("table2", vision_evals(TABLE2_MATCHINGS) + [end_eval("vision", VISION_TASK, m) for m in VISION_MODELS]),
    "table3": ("table3", table3_inputs()),
    "multimodel": ("multimodel", multimodel_inputs()),
}
FIGURES_INPUTS = {
    "fig3_ablation": ("fig3", vision_evals(FIG3_MATCHINGS)),
    "fig4_distance": ("fig4", [matched_dir("vision", VISION_TASK, s, a, m) for s, a in VISION_PAIRS
                               for m in FIG4_MATCHINGS]),
    "fig5_barrier": ("fig5", [rules.barrier.output[0].format(task=VISION_TASK, source=s, anchor=a, matching=m)
                              for s, a in VISION_PAIRS for m in FIG5_MATCHINGS]),
    "fig6_layers": ("fig6", [rules.layer_sweep.output[0].format(lmodel=m) for m in LANG_MODELS]),
}
VISION_ARTEFACTS = [f"{RESULTS}/table2.csv", f"{RESULTS}/multimodel.csv"] + [
    f"{FIGURES}/{name}.png" for name in ("fig3_ablation", "fig4_distance", "fig5_barrier")]
LANGUAGE_ARTEFACTS = [f"{RESULTS}/table1.csv", f"{RESULTS}/table3.csv", f"{FIGURES}/fig6_layers.png"] if LANG_MODELS else []


wildcard_constraints:
    table="|".join(TABLES),
    figure="|".join(FIGURES_INPUTS),


rule table:
    input:
        lambda w: TABLES[w.table][1],
    output:
        csv=report(f"{RESULTS}/{{table}}.csv", caption="../report/table.rst", category="Tables"),
        md=f"{RESULTS}/{{table}}.md",
    params:
        artefact=lambda w: TABLES[w.table][0],
        inputs=comma_joined,
    log:
        f"{LOGS}/report/{{table}}.log",
    benchmark:
        f"{BENCH}/report/{{table}}.tsv"
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-report artefact={params.artefact} 'inputs=[{params.inputs}]' "
        "output={output.csv} > {log} 2>&1"


rule figure:
    input:
        lambda w: FIGURES_INPUTS[w.figure][1],
    output:
        png=report(f"{FIGURES}/{{figure}}.png", caption="../report/figure.rst", category="Figures"),
        csv=f"{FIGURES}/{{figure}}.csv",
    params:
        artefact=lambda w: FIGURES_INPUTS[w.figure][0],
        inputs=comma_joined,
    log:
        f"{LOGS}/report/{{figure}}.log",
    benchmark:
        f"{BENCH}/report/{{figure}}.tsv"
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-report artefact={params.artefact} 'inputs=[{params.inputs}]' "
        "output={output.png} > {log} 2>&1"


rule report:
    input:
        VISION_ARTEFACTS + LANGUAGE_ARTEFACTS,
    output:
        md=report(f"{RESULTS}/report.md", caption="../report/report.rst", category="Report"),
        provenance=f"{RESULTS}/provenance.json",
    params:
        inputs=comma_joined,
    log:
        f"{LOGS}/report/report.log",
    benchmark:
        f"{BENCH}/report/report.tsv"
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} MKL_NUM_THREADS={threads} OPENBLAS_NUM_THREADS={threads} symfusion-report artefact=report 'inputs=[{params.inputs}]' output={output.md} > {log} 2>&1"
