"""The report stage (symfusion-report): one table, figure or the report of conf/experiments.yaml from its result files (pipeline/report/)."""
from __future__ import annotations

from dataclasses import dataclass

from symfusion.pipeline.command import PATH, Command, command, listing, option, text
from symfusion.pipeline.report.artefacts import run_report


@command("report")
@dataclass(frozen=True)
class Report(Command):
    """symfusion-report artefact=NAME inputs=[FILES] output=PATH: an entry of conf/experiments.yaml (a table: output=X.csv,
    a figure: output=X.png), or artefact=report (output=report.md)"""
    artefact: str = option(PATH, "an entry of conf/experiments.yaml (e.g. table2, fig3_ablation), or report")
    inputs: list[str] = option(listing(text(), 1), "the result files it reads")
    output: str = option(PATH, "a table: X.csv, a figure: X.png, the report: report.md")

    def run(self, cfg) -> None:
        rows = run_report(self.artefact, self.inputs, self.output)
        print(f"{self.artefact}: {len(rows)} rows -> {self.output}")
