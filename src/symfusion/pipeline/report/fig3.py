"""Figure 3: merged ViT accuracy per fusion method under each declared matching (the ablation), bars with 95% intervals.

One group of bars per fusion method (the entry's order), one bar per matching its inputs declare (in that
order, labelled by each matching's label); each matching's effect on a method vs w/o match comes with its
paired interval in the CSV. With several model pairs, numbers are means over pairs.
"""
from __future__ import annotations

from pathlib import Path

from symfusion.pipeline.report.effects import (VISION_EVALS, accuracy_cell, accuracy_effect, accuracy_interval,
                                               effect_columns, effect_counts, evaluations_of, merged_evaluations)
from symfusion.pipeline.report.registry import Experiment
from symfusion.pipeline.report.results import Built, csv_text, figure_files, method_label, plt, read_csv_rows

SHAPES = VISION_EVALS
BASELINE = "none"          # each matching's effect is against the unmatched merge


def fig3_rows(eval_paths: list[str], experiment: Experiment) -> tuple[list[str], list[dict]]:
    """(methods, rows): every method x declared matching, its mean accuracy and interval, its effect vs none."""
    ours = merged_evaluations(eval_paths)
    experiment.check_shown("merged_evals", [matching for _, matching in ours])
    methods = experiment.ordered_methods(m for m, matching in ours if matching == BASELINE)
    rows = []
    for m in methods:
        for v in experiment.matchings("merged_evals"):
            found = evaluations_of(ours, m, v, experiment.name)
            low, high = accuracy_interval(found)
            row = {"method": m, "variant": v, **accuracy_cell(found, "accuracy"), "low": low, "high": high}
            if v != BASELINE:
                effect = accuracy_effect(found, ours[(m, BASELINE)])
                row.update({**effect_columns(effect, "effect"), "verdict": effect["verdict"]})
            rows.append(row)
    return methods, rows


def build(eval_paths: list[str], experiment: Experiment) -> Built:
    """Grouped bars with 95% intervals: each fusion method x its declared matchings (w/o match ... match)."""
    methods, rows = fig3_rows(eval_paths, experiment)
    order = experiment.matchings("merged_evals")
    fig, ax = plt.subplots(figsize=(10, 4.2))
    width = 0.8 / len(order)
    for j, variant in enumerate(order):
        chosen = [next(r for r in rows if r["method"] == m and r["variant"] == variant) for m in methods]
        values = [r["accuracy"] for r in chosen]
        errors = [[r["accuracy"] - r["low"] for r in chosen], [r["high"] - r["accuracy"] for r in chosen]]
        ax.bar([i + (j - (len(order) - 1) / 2) * width for i in range(len(methods))], values, width,
               label=experiment.label(variant), yerr=errors, capsize=2, error_kw={"elinewidth": 0.8})
    ax.set_xticks(range(len(methods)), [method_label(m) for m in methods])
    ax.set_ylabel("test accuracy of the merged model (%)")
    ax.set_title("Figure 3: ablation of matching components per fusion method (95% bootstrap intervals)")
    ax.legend(ncols=min(len(order), 5), fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    ax.grid(axis="y", alpha=0.3)
    return Built(rows, {**figure_files(fig), ".csv": csv_text(rows)})


def summary(csv_path: Path, experiment: Experiment) -> list[str]:
    rows = [r for r in read_csv_rows(csv_path) if r["variant"] != BASELINE]
    return [f"Figure 3: each matching variant vs none, per fusion method: {effect_counts(rows, 'verdict')}."]
