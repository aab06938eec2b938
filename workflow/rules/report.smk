# Report: tables and figures from the stage results (symfusion-report), beside the paper's numbers.
# Each artefact gets its input files explicitly; every result JSON names its own run.


rule table2:
    input:
        vision_evals(TABLE2_MATCHINGS)
        + [f"{RESULTS}/eval/{VISION_TASK}/end_models/{m}.json" for m in (ANCHOR_ID, SOURCE_ID)],
    output:
        csv=report(f"{RESULTS}/table2.csv", caption="../report/table2.rst", category="Tables"),
        md=f"{RESULTS}/table2.md",
    params:
        inputs=comma_joined,
    log:
        f"{LOGS}/report/table2.log",
    benchmark:
        f"{BENCH}/report/table2.tsv"
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-report artefact=table2 'inputs=[{params.inputs}]' output={output.csv} > {log} 2>&1"


rule fig3_ablation:
    input:
        vision_evals(FIG3_MATCHINGS),
    output:
        png=report(f"{FIGURES}/fig3_ablation.png", caption="../report/fig3.rst", category="Figures"),
        csv=f"{FIGURES}/fig3_ablation.csv",
    params:
        inputs=comma_joined,
    log:
        f"{LOGS}/report/fig3.log",
    benchmark:
        f"{BENCH}/report/fig3.tsv"
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-report artefact=fig3 'inputs=[{params.inputs}]' output={output.png} > {log} 2>&1"


rule fig4_distance:
    input:
        [f"{RESULTS}/matched/{VISION_TASK}/{VISION_PAIR}/{m}" for m in FIG4_MATCHINGS],
    output:
        png=report(f"{FIGURES}/fig4_distance.png", caption="../report/fig4.rst", category="Figures"),
        csv=f"{FIGURES}/fig4_distance.csv",
    params:
        inputs=comma_joined,
    log:
        f"{LOGS}/report/fig4.log",
    benchmark:
        f"{BENCH}/report/fig4.tsv"
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-report artefact=fig4 'inputs=[{params.inputs}]' output={output.png} > {log} 2>&1"


rule fig5_barrier:
    input:
        [f"{RESULTS}/barrier/{VISION_TASK}/{VISION_PAIR}/{m}.json" for m in FIG5_MATCHINGS],
    output:
        png=report(f"{FIGURES}/fig5_barrier.png", caption="../report/fig5.rst", category="Figures"),
        csv=f"{FIGURES}/fig5_barrier.csv",
    params:
        inputs=comma_joined,
    log:
        f"{LOGS}/report/fig5.log",
    benchmark:
        f"{BENCH}/report/fig5.tsv"
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-report artefact=fig5 'inputs=[{params.inputs}]' output={output.png} > {log} 2>&1"


rule table1:
    input:
        table1_inputs(),
    output:
        csv=report(f"{RESULTS}/table1.csv", caption="../report/table1.rst", category="Tables"),
        md=f"{RESULTS}/table1.md",
    params:
        inputs=comma_joined,
    log:
        f"{LOGS}/report/table1.log",
    benchmark:
        f"{BENCH}/report/table1.tsv"
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-report artefact=table1 'inputs=[{params.inputs}]' output={output.csv} > {log} 2>&1"


rule table3:
    input:
        table3_inputs(),
    output:
        csv=report(f"{RESULTS}/table3.csv", caption="../report/table3.rst", category="Tables"),
        md=f"{RESULTS}/table3.md",
    params:
        inputs=comma_joined,
    log:
        f"{LOGS}/report/table3.log",
    benchmark:
        f"{BENCH}/report/table3.tsv"
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-report artefact=table3 'inputs=[{params.inputs}]' output={output.csv} > {log} 2>&1"


rule fig6_layers:
    input:
        [f"{LANG_RESULTS}/{m}/layers.json" for m in LANG_MODELS],
    output:
        png=report(f"{FIGURES}/fig6_layers.png", caption="../report/fig6.rst", category="Figures"),
        csv=f"{FIGURES}/fig6_layers.csv",
    params:
        inputs=comma_joined,
    log:
        f"{LOGS}/report/fig6.log",
    benchmark:
        f"{BENCH}/report/fig6.tsv"
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-report artefact=fig6 'inputs=[{params.inputs}]' output={output.png} > {log} 2>&1"


rule multimodel_table:
    input:
        multimodel_inputs(),
    output:
        csv=report(f"{RESULTS}/multimodel.csv", caption="../report/multimodel.rst", category="Tables"),
        md=f"{RESULTS}/multimodel.md",
    params:
        inputs=comma_joined,
    log:
        f"{LOGS}/report/multimodel.log",
    benchmark:
        f"{BENCH}/report/multimodel.tsv"
    conda:
        ENV
    shell:
        "OMP_NUM_THREADS={threads} symfusion-report artefact=multimodel 'inputs=[{params.inputs}]' output={output.csv} > {log} 2>&1"


rule report:
    input:
        vision_targets() + language_targets(),
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
        "OMP_NUM_THREADS={threads} symfusion-report artefact=report 'inputs=[{params.inputs}]' output={output.md} > {log} 2>&1"
