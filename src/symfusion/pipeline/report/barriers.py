"""Loss paths, shared by the barrier figures (Figure 5, Figure D): every path's points, both barriers, each matching's barrier change vs unmatched with its paired interval, the plot.

A barrier result (the barrier stage's JSON) holds the loss along theta(alpha) = alpha*A + (1-alpha)*B with each
test example's loss at every point; a causal LM's examples are blocks, each with its summed loss and its predicted
tokens, so a point's loss is the token-weighted mean. The barrier change of a matching (its barrier minus the
unmatched path's) gets a paired bootstrap interval: the same resamples of examples for both paths; with several
model pairs the changes are means over pairs.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

from symfusion.errors import SymfusionError
from symfusion.pipeline.report.registry import Experiment
from symfusion.pipeline.report.results import (NUMBER, OPTIONAL_NUMBER, RESULT_FILE, STRING, array, percent, plt,
                                               read_csv_rows, read_json, record)
from symfusion.pipeline.uncertainty import interval, resamples, verdict

SHAPES = {RESULT_FILE: record({
    "task": STRING, "matching": STRING, "source": STRING, "anchor": STRING, "barrier": NUMBER, "barrier_linear": NUMBER,
    "path": array(record({"alpha": NUMBER, "loss": NUMBER, "per_example": record({"loss": array(NUMBER, 1)},
                                                                                  tokens=array(NUMBER, 1))},
                         accuracy=OPTIONAL_NUMBER), 2)})}
BASELINE = "none"


def path_losses(data: dict) -> tuple[np.ndarray, np.ndarray | None]:
    """((alphas, examples) per-example losses along a barrier path, their (alphas, examples) token counts or None)."""
    losses = [point["per_example"]["loss"] for point in data["path"]]
    tokens = [point["per_example"].get("tokens") for point in data["path"]]
    if len({len(row) for row in losses}) != 1 or any(t is not None and len(t) != len(l) for t, l in zip(tokens, losses)):
        raise SymfusionError(f"the {data['matching']} path scored different examples at different points; "
                             "pass the barrier stage's own output")
    if all(t is None for t in tokens):
        return np.asarray(losses, dtype=float), None
    if any(t is None for t in tokens):
        raise SymfusionError(f"the {data['matching']} path gives token counts at some points only; "
                             "pass the barrier stage's own output")
    return np.asarray(losses, dtype=float), np.asarray(tokens, dtype=float)


def barrier_resamples(losses: tuple[np.ndarray, np.ndarray | None], index: np.ndarray) -> np.ndarray:
    """The paper's barrier (range of the mean loss over alphas) on each resample of examples, (B,); a causal LM's
    mean is token-weighted (each block's summed loss over its tokens)."""
    values, tokens = losses
    if tokens is None:
        means = np.stack([row[index].mean(axis=1) for row in values])                          # (alphas, B)
    else:
        means = np.stack([row[index].sum(axis=1) / count[index].sum(axis=1) for row, count in zip(values, tokens)])
    return means.max(axis=0) - means.min(axis=0)


def barrier_pair(data: dict) -> str:
    """The model pair of a barrier result, `<source>-onto-<anchor>`, whichever way its source was given: a
    matched copy (matched/<pair>/<matching>, the pipeline's source for every matching, `none` included) or
    the end model itself (models/<source>)."""
    source = Path(data["source"])
    if source.name == data["matching"]:
        return source.parent.name
    return f"{source.name}-onto-{Path(data['anchor']).name}"


def barrier_rows(barrier_paths: list[str], experiment: Experiment) -> tuple[dict, list[str], list[dict], dict]:
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
            index = resamples(losses[0].shape[1], f"{baseline['task']}:{baseline.get('examples')}")
            base_resampled = barrier_resamples(losses, index)
        for matching in [m for m in order if m in runs]:
            data = runs[matching]
            if baseline is not None and matching != BASELINE:
                matched = path_losses(data)
                if matched[0].shape[1] != losses[0].shape[1]:
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


def plot_paths(experiment: Experiment, by_pair: dict, pairs: list[str], summary: dict, title: str, ylabel: str):
    """The loss paths of the first pair, one curve per declared matching; each legend entry gives both barriers and
    the change vs unmatched with its interval. Returns the figure."""
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
    ax.set_ylabel(ylabel)
    ax.set_title(title + (f"\n(paths of {pairs[0]}; changes vs unmatched: means over {len(pairs)} pairs)"
                          if len(pairs) > 1 else ""), fontsize=None if len(pairs) == 1 else 10)
    ax.legend(fontsize=6.5)
    ax.grid(alpha=0.3)
    return fig


def summary_cells(csv_path: Path) -> tuple[list[str], dict[str, float], int]:
    """(one cell per matching: its mean barrier, above-line barrier and change with its interval; mean barrier per
    matching; number of pairs) from a barrier figure's CSV."""
    rows = read_csv_rows(csv_path)
    per_matching = defaultdict(dict)                  # matching -> pair -> a row of its path (barriers per path)
    for r in rows:
        per_matching[r["matching"]][r["pair"]] = r
    pairs = len({r["pair"] for r in rows})
    means = {m: {k: sum(float(r[k]) for r in found.values()) / len(found) for k in ("barrier", "barrier_linear")}
             for m, found in per_matching.items()}
    cells = []
    for matching, found in per_matching.items():
        r = next(iter(found.values()))                # the change and its interval: one per matching
        cell = f"{matching} {means[matching]['barrier']:.3f} (above line {means[matching]['barrier_linear']:.3f})"
        if r.get("barrier_change"):
            cell += (f", change {float(r['barrier_change']):+.3f} [{float(r['change_low']):+.3f}, "
                     f"{float(r['change_high']):+.3f}] {r['change_verdict']}")
        cells.append(cell)
    return cells, {m: mean["barrier"] for m, mean in means.items()}, pairs
