"""symfusion-report: one artefact (table or figure) from the result files it is given."""
from __future__ import annotations

from pathlib import Path

from symfusion.errors import SymfusionError
from symfusion.pipeline.report import audit, figures, language, tables
from symfusion.pipeline.report.results import claimed

# artefact name -> function(inputs, output)
ARTEFACTS = {
    "table2": tables.write_table2,
    "fig3": figures.fig3_ablation,
    "fig4": figures.fig4_distance,
    "fig5": figures.fig5_barrier,
    "table1": language.write_table1,
    "table3": language.write_table3,
    "fig6": language.fig6_layers,
    "multimodel": language.write_multimodel,
    "report": audit.write_report,
}


def run_report(artefact: str, inputs: list[str], output: str) -> list[dict]:
    if artefact not in ARTEFACTS:
        raise SymfusionError(f"unknown artefact {artefact!r}; choose one of {', '.join(ARTEFACTS)}")
    if not inputs:
        raise SymfusionError(f"artefact={artefact} needs inputs=[...] (result files of the stages)")
    if not output:
        raise SymfusionError("output=PATH is required")
    missing = [p for p in inputs if not Path(p).exists()]
    if missing:
        raise SymfusionError(f"{len(missing)} input(s) missing, first {missing[0]}; run the pipeline stage that writes it")
    with claimed(output_files(artefact, Path(output)), list(inputs)):
        return ARTEFACTS[artefact](list(inputs), output)


def output_files(artefact: str, output: Path) -> list[Path]:
    """Every file an artefact writes: tables CSV + Markdown, figures PNG + PDF + CSV, the report + provenance."""
    suffix = ".md" if artefact == "report" else ".png" if artefact.startswith("fig") else ".csv"
    if output.suffix != suffix:
        raise SymfusionError(f"artefact={artefact} writes {suffix} (and its twins): give output=PATH{suffix}")
    if artefact == "report":
        return [output, output.parent / "provenance.json"]
    if artefact.startswith("fig"):
        return [output, output.with_suffix(".pdf"), output.with_suffix(".csv")]
    return [output, output.with_suffix(".md")]
