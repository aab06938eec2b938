"""symfusion-report: one artefact of the experiment registry (a table or figure), or the audit report, from the result files it is given.

The artefact's entry in conf/experiments.yaml names its writer, a module of this package with `SHAPES`
(JSON Schema of each kind of input it reads), `build(inputs, experiment) -> Built` and `summary(csv,
experiment)` (its lines in report.md); the writers are imported from the registry's names, so a new table or
figure is one entry and one module. Every input is checked against its writer's shapes, the outputs are
claimed, the artefact is computed, and only then are its files written, all of them swapped in together:
a failure is one error line with nothing written and no earlier output replaced.
"""
from __future__ import annotations

import importlib
from csv import Error as CSVError
import os
from pathlib import Path

from symfusion.errors import SymfusionError
from symfusion.pipeline.report import audit
from symfusion.pipeline.report.registry import REPORT, Experiment, experiment, experiments
from symfusion.pipeline.report.results import check_inputs, claimed, write_claimed

# writer name -> its module (report/<writer>.py), for every writer the registry names
WRITERS = {name: importlib.import_module(f"{__package__}.{name}")
           for name in dict.fromkeys(e.writer for e in experiments().values())}


def writer_of(entry: Experiment):
    return WRITERS[entry.writer]


def run_report(artefact: str, inputs: list[str], output: str) -> list:
    """Write one artefact (a registry entry's name, or `report` for report.md) from `inputs` at `output`."""
    entry = None if artefact == REPORT else experiment(artefact)
    if not inputs:
        raise SymfusionError(f"artefact={artefact} needs inputs=[...] (result files of the stages)")
    if not output:
        raise SymfusionError("output=PATH is required")
    output = Path(output)
    suffix = ".md" if entry is None else entry.suffix
    if output.suffix != suffix:
        raise SymfusionError(f"artefact={artefact} writes {suffix} (and its twins): give output=PATH{suffix}")
    missing = [p for p in inputs if not Path(p).exists()]
    if missing:
        raise SymfusionError(f"{len(missing)} input(s) missing, first {missing[0]}; run the pipeline stage that writes it")
    if entry is not None:
        check_inputs(inputs, writer_of(entry).SHAPES, entry.name)
    files = [output, output.parent / "provenance.json"] if entry is None else entry.files(output)
    with claimed(files, list(inputs)) as claims:
        if entry is None:
            everything = list(experiments().values())
            built = audit.build_report(list(inputs), output, everything, summary_lines(
                output.parent, audit.figures_folder(inputs, output.parent.name), audit.given(inputs)))
        else:
            built = writer_of(entry).build(list(inputs), entry)
        write_claimed(claims, output, built)
    return built.rows


def summary_lines(results: Path, figures: Path, inputs: set[str] | None = None) -> list[str]:
    """Every artefact's summary lines, in the registry's order, from the CSVs of the artefacts among `inputs` (real
    paths of a table's CSV or a figure's PNG: audit.given; None: every one the folders hold); a file lying in the
    folder but not given is not read."""
    lines = []
    for entry in experiments().values():
        csv = (results if entry.kind == "table" else figures) / f"{entry.name}.csv"
        if (inputs is not None and os.path.realpath(csv.with_suffix(entry.suffix)) not in inputs) or not csv.exists():
            continue
        try:
            lines += writer_of(entry).summary(csv, entry)
        except (KeyError, ValueError, TypeError, IndexError, AttributeError, ZeroDivisionError, CSVError) as error:
            raise SymfusionError(f"{csv} is not the {entry.name} that symfusion-report writes ({error!r:.80}); "
                                 "rebuild it") from error
    return lines
