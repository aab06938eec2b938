"""Table 3: mean seconds per stage and model family (fine-tuning per dataset, matching and merging per pair), beside the paper's A100 timings.

Read from the end models' train.json, the matched folders' match.json and the merged models' evaluations
(their merge seconds, matched merges only). One merge row per fusion method of the entry's `methods` (and
any other method the inputs time, after them).
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from statistics import mean

from symfusion.pipeline.report.registry import Experiment
from symfusion.pipeline.report.results import (NUMBER, OPTIONAL_NUMBER, RESULT_FILE, STRING, Built, csv_text,
                                               inputs_list, markdown_table, model_name, read_csv_rows, read_json,
                                               read_paper_table, record, result_file, signed_markdown)

SHAPES = {"train.json": record({"seconds": NUMBER}), "match.json": record({"seconds": NUMBER}),
          RESULT_FILE: record({"method": STRING, "matching": STRING}, merge_seconds=OPTIONAL_NUMBER)}
STAGES = ("finetune", "matching")


def family_of_folder(folder: Path) -> str:
    """minilm / vit / roberta_base ...: the language model's name, or 'vit' for vision results."""
    return model_name(str(folder)) if "lang" in folder.parts else "vit"


def timing_rows(paths: list[str]) -> dict[tuple[str, str], list[float]]:
    """(stage, family) -> seconds, from train.json, match.json and merged models' eval JSON."""
    seconds = defaultdict(list)
    for path in map(Path, paths):
        kind, _ = result_file(path)
        data = read_json(path)
        if kind == "train.json":
            seconds[("finetune", family_of_folder(path))].append(data["seconds"])
        elif kind == "match.json":
            seconds[("matching", family_of_folder(path))].append(data["seconds"])
        elif kind == RESULT_FILE and data.get("merge_seconds") is not None and data["matching"] != "none":
            seconds[(f"merge_{data['method']}", family_of_folder(path))].append(data["merge_seconds"])
    return seconds


def build(paths: list[str], experiment: Experiment) -> Built:
    """Mean seconds per stage and family (fine-tuning per dataset, matching and merging per pair)."""
    seconds = timing_rows(paths)
    families = sorted({f for _, f in seconds})
    paper = {r["stage"]: r for r in read_paper_table(experiment.paper)} if experiment.paper else {}
    timed = [stage[len("merge_"):] for stage, _ in seconds if stage.startswith("merge_")]
    rows = []
    for stage in (*STAGES, *(f"merge_{m}" for m in experiment.ordered_methods([*experiment.methods, *timed]))):
        row = {"stage": stage}
        row.update({f"ours_{f}": mean(seconds[(stage, f)]) if seconds[(stage, f)] else None for f in families})
        row.update({f"ours_{f}_n": len(seconds[(stage, f)]) for f in families})
        row.update({f"paper_{k}": (float(v) if v else None) for k, v in paper.get(stage, {}).items() if k != "stage"})
        rows.append(row)
    text = ("# Table 3: mean seconds per stage (ours on this machine, 2 CPU cores; the paper on an A100 80GB)\n\n"
            + markdown_table(rows) + "\nOurs: fine-tuning per dataset (vit: training from scratch, which the paper "
            "does not report), matching and merging per model pair (matched pairs). `_n` = runs averaged.\n\n"
            + inputs_list(paths))
    return Built(rows, {".csv": csv_text(rows), ".md": signed_markdown(text)})


def summary(csv_path: Path, experiment: Experiment) -> list[str]:
    rows = {r["stage"]: r for r in read_csv_rows(csv_path)}
    cells = [f"{k[5:]} {float(v):.2f}s" for k, v in rows.get("matching", {}).items()
             if k.startswith("ours_") and not k.endswith("_n") and v]
    return ["Table 3: matching one pair takes " + ", ".join(cells) + " here."] if cells else []
