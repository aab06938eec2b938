"""Figure 5: loss along the linear path between the end models for each declared matching, with both barrier definitions and each barrier change's paired interval.

One curve per matching the entry's inputs declare (in that order; the entry's `labels:` or each matching's
label). The CSV has every point of every path, both barriers (the paper's range first), and each
matching's barrier change vs unmatched with the paired bootstrap interval over the test examples; with
several model pairs the changes are means over pairs.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

from symfusion.errors import SymfusionError
from symfusion.pipeline.report.registry import Experiment
from symfusion.pipeline.report.results import (NUMBER, OPTIONAL_NUMBER, RESULT_FILE, STRING, Built, array, csv_text,
                                               figure_files, percent, plt, read_csv_rows, read_json, record)
from symfusion.pipeline.uncertainty import interval, resamples, verdict

SHAPES = {RESULT_FILE: record({
    "task": STRING, "matching": STRING, "source": STRING, "anchor": STRING, "barrier": NUMBER, "barrier_linear": NUMBER,
    "path": array(record({"alpha": NUMBER, "loss": NUMBER, "per_example": record({"loss": array(NUMBER, 1)})},
                         accuracy=OPTIONAL_NUMBER), 2)})}
BASELINE = "none"


def path_losses(data: dict) -> np.ndarray:
    """(alphas, examples) per-example losses along a barrier path."""
    losses = [point["per_example"]["loss"] for point in data["path"]]
    if len({len(row) for row in losses}) != 1:
        raise SymfusionError(f"the {data['matching']} path scored different examples at different points; "
                             "pass the barrier stage's own output")
    return np.asarray(losses, dtype=float)


def barrier_resamples(losses: np.ndarray, index: np.ndarray) -> np.ndarray:
    """The paper's barrier (range of the mean loss over alphas) on each resample of examples, (B,)."""
    means = np.stack([row[index].mean(axis=1) for row in losses])                   # (alphas, B)
    return means.max(axis=0) - means.min(axis=0)


def barrier_pair(data: dict) -> str:
    """The model pair of a barrier result, `<source>-onto-<anchor>`, whichever way its source was given: a
    matched copy (matched/<pair>/<matching>, the pipeline's source for every matching, `none` included) or
    the end model itself (models/<source>)."""
    source = Path(data["source"])
    if source.name == data["matching"]:
        return source.parent.name
    return f"{source.name}-onto-{Path(data['anchor']).name}"


def fig5_rows(barrier_paths: list[str], experiment: Experiment) -> tuple[dict, list[str], list[dict], dict]:
    """(results by pair and matching, pairs, rows of every path point, summary of each matching's change)."""
    by_pair = defaultdict(dict)
    for path in barrier_paths:
        data = read_json(path)
        by_pair[barrier_pair(data)][data["matching"]] = data
    experiment.check_shown("barriers", [m for runs in by_pair.values() for m in runs])
    order = experiment.matchings("barriers")
    pairs = sorted(by_pair)
    rows = []
    changes = defaultdict(list)                     # matching -> per pair (point, resampled) barrier change
    for pair in pairs:
        runs = by_pair[pair]
        baseline = runs.get(BASELINE)
        index = None
        if baseline is not None:
            losses = path_losses(baseline)
            index = resamples(losses.shape[1], f"{baseline['task']}:{baseline.get('examples')}")
            base_resampled = barrier_resamples(losses, index)
        for matching in [m for m in order if m in runs]:
            data = runs[matching]
            if baseline is not None and matching != BASELINE:
                matched = path_losses(data)
                if matched.shape[1] != losses.shape[1]:
                    raise SymfusionError(f"{pair}: the {matching} and {BASELINE} paths scored different examples; "
                                         "pass barrier results of one test set")
                changes[matching].append((data["barrier"] - baseline["barrier"],
                                          barrier_resamples(matched, index) - base_resampled))
            rows += [{"pair": pair, "matching": matching, "alpha": p["alpha"], "loss": p["loss"],
                      "accuracy": percent(p.get("accuracy")), "barrier": data["barrier"],
                      "barrier_linear": data["barrier_linear"]} for p in data["path"]]
    summary = {}
    for matching, found in changes.items():
        point = statistics.fmean(f[0] for f in found)
        low, high = interval(np.mean([f[1] for f in found], axis=0))
        summary[matching] = {"change": point, "low": low, "high": high,
                             "verdict": verdict(low, high, lower_is_better=True)}
    for row in rows:
        if row["matching"] in summary:
            change = summary[row["matching"]]
            row.update({"barrier_change": change["change"], "change_low": change["low"],
                        "change_high": change["high"], "change_verdict": change["verdict"]})
    return by_pair, pairs, rows, summary


def build(barrier_paths: list[str], experiment: Experiment) -> Built:
    """Loss along theta(alpha) = alpha*A + (1-alpha)*B for B unmatched / partly / fully matched; both barrier
    definitions, and each matching's barrier change vs unmatched with its paired bootstrap interval."""
    by_pair, pairs, rows, summary = fig5_rows(barrier_paths, experiment)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    first = by_pair[pairs[0]]
    for matching in [m for m in experiment.matchings("barriers") if m in first]:
        data = first[matching]
        change = summary.get(matching)
        interval_text = f", vs unmatched {change['change']:+.3f} [{change['low']:+.3f}, {change['high']:+.3f}]" \
            if change else ""
        ax.plot([p["alpha"] for p in data["path"]], [p["loss"] for p in data["path"]], marker="o", markersize=3,
                label=f"{experiment.label(matching)} (LB {data['barrier']:.3f}; above line {data['barrier_linear']:.3f}"
                      f"{interval_text})")
    ax.set_xlabel("alpha  (0 = source model B, 1 = anchor model A)")
    ax.set_ylabel("test loss (cross-entropy)")
    ax.set_title("Figure 5: loss along the linear path between the end models" +
                 (f"\n(paths of {pairs[0]}; changes vs unmatched: means over {len(pairs)} pairs)" if len(pairs) > 1 else ""),
                 fontsize=None if len(pairs) == 1 else 10)
    ax.legend(fontsize=6.5)
    ax.grid(alpha=0.3)
    return Built(rows, {**figure_files(fig), ".csv": csv_text(rows)})


def summary(csv_path: Path, experiment: Experiment) -> list[str]:
    """Mean barriers per matching over the pairs, each change with its interval, and the lowest."""
    rows = read_csv_rows(csv_path)
    per_matching = defaultdict(dict)                  # matching -> pair -> a row of its path (barriers per path)
    for r in rows:
        per_matching[r["matching"]][r["pair"]] = r
    pairs = len({r["pair"] for r in rows})
    means = {m: {k: sum(float(r[k]) for r in found.values()) / len(found) for k in ("barrier", "barrier_linear")}
             for m, found in per_matching.items()}
    barriers = {m: mean["barrier"] for m, mean in means.items()}
    cells = []
    for matching, found in per_matching.items():
        r = next(iter(found.values()))                # the change and its interval: one per matching
        cell = f"{matching} {barriers[matching]:.3f} (above line {means[matching]['barrier_linear']:.3f})"
        if r.get("barrier_change"):
            cell += (f", change {float(r['barrier_change']):+.3f} [{float(r['change_low']):+.3f}, "
                     f"{float(r['change_high']):+.3f}] {r['change_verdict']}")
        cells.append(cell)
    if not barriers:
        return []
    lowest = min(barriers, key=barriers.get)
    over = f", means over {pairs} model pairs" if pairs > 1 else ""
    return [f"Figure 5: loss barriers (the paper's: max - min along the path{over}) " + "; ".join(cells) +
            f"; lowest: {lowest} ({'as' if lowest == 'rotation' else 'unlike'} the paper, where full "
            "matching gives the lowest barrier)."]
