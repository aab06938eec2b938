"""Loss paths, shared by the barrier figures (Figure 5, Figure D): every path's points, both barriers, each matching's barrier change vs unmatched with its paired interval, the plot.

A barrier result (the barrier stage's JSON) holds the loss along theta(alpha) = alpha*A + (1-alpha)*B with each
test example's loss at every point; a causal LM's examples are blocks, each with its summed loss and its predicted
tokens, so a point's loss is the token-weighted mean. The barrier change of a matching (its barrier minus the
unmatched path's) gets a paired bootstrap interval: the same resamples of examples for both paths; with several
model pairs the change is the mean over pairs (its interval that of the mean), reported per pair too, with its spread
over pairs and the verdict that holds over pairs (spread.py).
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

from symfusion.errors import SymfusionError
from symfusion.pipeline.report.registry import Experiment
from symfusion.pipeline.report.results import (NUMBER, OPTIONAL_NUMBER, RESULT_FILE, STRING, array, percent, plt,
                                               read_csv_rows, read_json, read_paper_table, record)
from symfusion.pipeline.report.spread import over_pairs, spread_columns, verdict_over_pairs
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
    if len({len(row) for row in losses}) != 1 or any(t is not None and len(t) != len(row) for t, row in zip(tokens, losses)):
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
    examples = {}                                   # matching -> the fewest test examples of its paths
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
                examples[matching] = min(examples.get(matching, losses[0].shape[1]), losses[0].shape[1])
                changes[matching].append((pair, data["barrier"] - baseline["barrier"],
                                          barrier_resamples(matched, index) - base_resampled))
            rows += [{"pair": pair, "matching": matching, "alpha": p["alpha"], "loss": p["loss"],
                      "accuracy": percent(p.get("accuracy")), "barrier": data["barrier"],
                      "barrier_linear": data["barrier_linear"]} for p in data["path"]]
    summary = {}
    for matching, found in changes.items():
        point = statistics.fmean(f[1] for f in found)
        low, high = interval(np.mean([f[2] for f in found], axis=0))
        per_pair = {pair: (change, *interval(resampled)) for pair, change, resampled in found}
        spread = over_pairs({pair: change for pair, (change, _, _) in per_pair.items()})
        summary[matching] = {"change": point, "low": low, "high": high, "per_pair": per_pair, "spread": spread,
                             "verdict": verdict_over_pairs(spread, [verdict(lo, hi, lower_is_better=True,
                                                                            examples=examples[matching])
                                                                    for _, lo, hi in per_pair.values()],
                                                           lower_is_better=True)}
    for row in rows:
        if row["matching"] in summary:
            change = summary[row["matching"]]
            row.update({"barrier_change": change["change"], "change_low": change["low"],
                        "change_high": change["high"], "change_verdict": change["verdict"]})
            row.update(spread_columns("barrier_change", change["spread"]))
            if len(pairs) > 1:
                own, own_low, own_high = change["per_pair"][row["pair"]]
                row.update({"pair_change": own, "pair_change_low": own_low, "pair_change_high": own_high})
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
    """(one cell per matching: its mean barrier and above-line barrier over its pairs (+- se over several), and its
    change with its interval and the verdict over pairs; mean barrier per matching; number of pairs) from a barrier
    figure's CSV."""
    rows = read_csv_rows(csv_path)
    per_matching = defaultdict(dict)                  # matching -> pair -> a row of its path (barriers per path)
    for r in rows:
        per_matching[r["matching"]][r["pair"]] = r
    pairs = len({r["pair"] for r in rows})
    spreads = {m: {k: over_pairs({p: float(r[k]) for p, r in found.items()}) for k in ("barrier", "barrier_linear")}
               for m, found in per_matching.items()}
    cells = []
    for matching, found in per_matching.items():
        r = next(iter(found.values()))                # the change and its interval: one per matching
        barrier, linear = spreads[matching]["barrier"], spreads[matching]["barrier_linear"]
        cell = f"{matching} {barrier['mean']:.3f}"
        cell += f" +- {barrier['se']:.3f}" if barrier["pairs"] > 1 else ""
        cell += f" (above line {linear['mean']:.3f}; {barrier['pairs']} pair{'s' if barrier['pairs'] > 1 else ''})"
        if r.get("barrier_change"):
            cell += (f", change {float(r['barrier_change']):+.3f} [{float(r['change_low']):+.3f}, "
                     f"{float(r['change_high']):+.3f}]")
            if r.get("barrier_change_pairs_low"):
                cell += (f" pairs [{float(r['barrier_change_pairs_low']):+.3f}, "
                         f"{float(r['barrier_change_pairs_high']):+.3f}]")
            cell += f" {r['change_verdict']}"
        cells.append(cell)
    return cells, {m: spread["barrier"]["mean"] for m, spread in spreads.items()}, pairs


def peer_lines(csv_path: Path, track: str) -> list[str]:
    """Generalized LMC's published barriers (conf/paper/glmc.csv: Theus et al., arXiv 2506.22712; max over the path
    minus the straight line between the end losses) beside ours in the same definition: unmatched, data-free and
    learned whole-symmetry matching, each as a share of the unmatched barrier."""
    ours = defaultdict(dict)
    for r in read_csv_rows(csv_path):
        ours[r["matching"]][r["pair"]] = float(r["barrier_linear"])
    mean = {m: statistics.fmean(v.values()) for m, v in ours.items()}
    if BASELINE not in mean:
        return []
    share = (lambda m: f" ({100 * mean[m] / mean[BASELINE]:.0f}%)") if mean[BASELINE] > 0 else (lambda m: "")
    shares = [f"{label} {mean[m]:.2f}{share(m)}"
              for m, label in (("full_symmetry", "data-free"), ("full_symmetry_learned", "learned")) if m in mean]
    lines = [f"Above the straight line (Generalized LMC's definition), ours over {len(ours[BASELINE])} pair(s): "
             f"unmatched {mean[BASELINE]:.2f}" + "".join(f"; {s}" for s in shares) + "."]
    for row in read_paper_table("glmc"):
        if row["track"] == track:
            base, wm, learned = (float(row[k]) for k in ("vanilla", "weight_matching", "learned"))
            lines.append(f"Generalized LMC (Theus et al., arXiv 2506.22712), {row['setting']}, as published: vanilla "
                         f"{base:.2f}; weight matching {wm:.2f} ({100 * wm / base:.0f}%); learned {learned:.2f} "
                         f"({100 * learned / base:.0f}%){'; ' + row['note'] if row.get('note') else ''}.")
    return lines
