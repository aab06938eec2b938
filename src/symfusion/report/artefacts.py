"""symfusion-report: one artefact (table or figure) from the result files it is given."""
from __future__ import annotations

from pathlib import Path

from symfusion.errors import SymfusionError
from symfusion.report import audit, figures, language, tables

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
    return ARTEFACTS[artefact](list(inputs), output)
