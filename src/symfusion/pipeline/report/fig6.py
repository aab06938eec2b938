"""Figure 6: eval-loss change vs unmatched when matching one attention layer, or the last k layers, with paired 95% intervals.

(a) the single attention layer matched, (b) the number of trailing layers matched; plotted as the change
from the unmatched loss (below zero: matching helps), each with the 95% interval of a paired bootstrap over
the test examples. The CSV has the absolute losses, the changes with their intervals and verdicts, and the
task's score in points (x100, as Table 1).
"""
from __future__ import annotations

from pathlib import Path

from symfusion.errors import SymfusionError
from symfusion.pipeline.report.effects import effect_counts, paired
from symfusion.pipeline.report.registry import Experiment
from symfusion.pipeline.report.results import (INTEGER, NUMBER, OPTIONAL_NUMBER, PER_EXAMPLE, RESULT_FILE, STRING,
                                               Built, array, csv_text, figure_files, model_name, percent, plt,
                                               read_csv_rows, read_json, record)

SHAPES = {RESULT_FILE: record({"rows": array(record(
    {"task": STRING, "setting": {"enum": ["none", "single", "tail"]}, "k": INTEGER, "loss": NUMBER},
    score=OPTIONAL_NUMBER, per_example=PER_EXAMPLE), 1)})}


def loss_change(row: dict, base: dict, task: str) -> dict:
    """A sweep row's loss change vs the unmatched merge with its paired bootstrap interval (none for the
    unmatched row itself, or for a sweep written without per-example losses)."""
    if row is base or "loss" not in row.get("per_example", {}) or "loss" not in base.get("per_example", {}):
        return {}
    found = paired("loss", [(row["per_example"], base["per_example"], task)])
    return {"loss_change": row["loss"] - base["loss"], "change_low": found["low"], "change_high": found["high"],
            "change_verdict": found["verdict"]}


def build(sweep_paths: list[str], experiment: Experiment) -> Built:
    """(a) eval-loss change vs the single attention layer matched, (b) vs the number of trailing layers matched."""
    rows = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=False)
    for path in sweep_paths:
        data = read_json(path)
        model = model_name(path)
        for task in dict.fromkeys(r["task"] for r in data["rows"]):
            task_rows = [r for r in data["rows"] if r["task"] == task]
            base = next((r for r in task_rows if r["setting"] == "none"), None)
            if base is None:
                raise SymfusionError(f"{path}: task {task} has no unmatched (setting none) row to compare with; "
                                     "pass the layer sweep's own output")
            task_csv = [{"model": model, "task": task, "setting": r["setting"], "k": r["k"], "loss": r["loss"],
                         "score": percent(r.get("score")), **loss_change(r, base, task)} for r in task_rows]
            for ax, setting, label in ((axes[0], "single", "index of the single attention layer matched"),
                                       (axes[1], "tail", "number of trailing attention layers matched")):
                chosen = [r for r in task_csv if r["setting"] == setting]
                changes = [r["loss"] - base["loss"] for r in chosen]
                errors = None
                if all("change_low" in r for r in chosen):
                    errors = [[c - r["change_low"] for c, r in zip(changes, chosen)],
                              [r["change_high"] - c for c, r in zip(changes, chosen)]]
                ax.errorbar([r["k"] for r in chosen], changes, yerr=errors, marker="o", capsize=2,
                            label=f"{task} ({model}; unmatched loss {base['loss']:.4f})")
                ax.set_xlabel(label)
            rows += task_csv
    axes[0].set_title("(a) single-layer matching")
    axes[1].set_title("(b) tail-layers matching")
    for ax in axes:
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_ylabel("eval loss change vs no matching (95% CI)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, title="task (model; loss without matching)", title_fontsize=8)
    fig.suptitle("Figure 6: evaluation loss when matching a subset of attention layers (simple averaging)")
    return Built(rows, {**figure_files(fig), ".csv": csv_text(rows)})


def summary(csv_path: Path, experiment: Experiment) -> list[str]:
    rows = [r for r in read_csv_rows(csv_path) if r.get("loss_change")]
    if not rows:
        return []
    largest = max(rows, key=lambda r: abs(float(r["loss_change"])))
    return [f"Figure 6: each layer subset's eval-loss change vs unmatched: {effect_counts(rows, 'change_verdict')}; "
            f"the largest {float(largest['loss_change']):+.3g} ({largest['task']}, {largest['setting']} {largest['k']})."]
