"""Figure 4: Euclidean distance between the end models after each declared matching (mean over pairs), bars.

One bar per matching the entry's inputs declare (in that order; `labels:` of the entry or each matching's
label), with the distance per module group in the CSV; with several pairs, each pair's distance, the spread over
pairs (sd, se, the t interval: spread.py) and error bars of one sd.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from symfusion.pipeline.report.effects import pair_of_folder
from symfusion.pipeline.report.registry import Experiment
from symfusion.pipeline.report.spread import over_pairs, spread_columns
from symfusion.pipeline.report.results import (NUMBER, STRING, Built, csv_text, figure_files, plt, read_csv_rows,
                                               read_json, record)

SHAPES = {"match.json": record({"matching": STRING, "distance_after": NUMBER,
                                "distance_after_by_module": {"type": "object", "additionalProperties": NUMBER}})}


def fig4_rows(match_dirs: list[str], experiment: Experiment) -> tuple[list[str], list[dict], int]:
    """(matchings shown, rows, pairs): the mean distance after each declared matching the inputs have."""
    by_matching = defaultdict(list)
    for folder in match_dirs:
        data = read_json(folder)
        by_matching[data["matching"]].append((pair_of_folder(folder), data))
    experiment.check_shown("matched", by_matching)
    order = [m for m in experiment.matchings("matched") if m in by_matching]
    rows = []
    for m in order:
        runs = [r for _, r in by_matching[m]]
        spread = over_pairs({pair: r["distance_after"] for pair, r in by_matching[m]})
        row = {"matching": m, "distance": spread["mean"]}
        modules = [k for k in runs[0]["distance_after_by_module"] if k != "total"]
        row.update({f"distance_{k}": statistics.fmean(r["distance_after_by_module"].get(k, 0.0) for r in runs)
                    for k in modules})
        row.update(spread_columns("distance", spread))
        if len(runs) > 1:
            row.update({f"distance_{pair}": r["distance_after"] for pair, r in sorted(by_matching[m], key=lambda x: x[0])})
        rows.append(row)
    return order, rows, len(by_matching[order[0]]) if order else 0


def build(match_dirs: list[str], experiment: Experiment) -> Built:
    """Bars: Euclidean distance between the end models after each matching method (mean over pairs)."""
    order, rows, pairs = fig4_rows(match_dirs, experiment)
    fig, ax = plt.subplots(figsize=(7, 4))
    bars = ax.bar([experiment.label(m) for m in order], [r["distance"] for r in rows], color="tab:blue",
                  yerr=[r.get("distance_sd") or 0.0 for r in rows] if pairs > 1 else None)
    ax.bar_label(bars, fmt="%.3g", fontsize=8)
    ax.set_ylabel("Euclidean distance between end models")
    ax.set_title("Figure 4: distance between the two end models after matching"
                 + (f"\n(means over {pairs} pairs; error bars: sd over pairs)" if pairs > 1 else ""))
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel("matching applied to the source model before measuring")
    ax.grid(axis="y", alpha=0.3)
    return Built(rows, {**figure_files(fig), ".csv": csv_text(rows)})


def summary(csv_path: Path, experiment: Experiment) -> list[str]:
    rows = {r["matching"]: float(r["distance"]) for r in read_csv_rows(csv_path)}
    if "none" not in rows or "rotation" not in rows:
        return []
    order = " < ".join(sorted(rows, key=rows.get))
    return [f"Figure 4: distance {rows['none']:.2f} unmatched -> {rows['rotation']:.2f} with rotation "
            f"matching; order {order}."]
