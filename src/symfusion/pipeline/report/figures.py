"""Figures of the report (3: ablation bars, 4: distances, 5: loss barriers), each with its numbers as CSV.

Figure 3's bars carry 95% bootstrap intervals, and each matching's effect on a method (vs w/o match) its
paired interval; Figure 5 gives both barrier definitions (the paper's range first) and the paired interval
of each matching's barrier change. With several model pairs, numbers are means over pairs.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from symfusion.pipeline.report.results import (METHOD_LABELS, VARIANT_LABELS, percent, read_json, save_figure,  # noqa: E402
                                      write_csv)
from symfusion.pipeline.report.tables import (accuracy_effect, accuracy_interval, mean_accuracy,  # noqa: E402
                                     merged_evaluations)
from symfusion.pipeline.uncertainty import RESAMPLES, interval, resamples, verdict  # noqa: E402

FIG3_ORDER = ["none", "ffn_only", "attn_only", "rotation_no_rescale", "rotation"]
FIG4_ORDER = ["none", "git_rebasin", "ot_ffn", "rotation_no_rescale", "rotation"]
FIG5_ORDER = ["none", "attn_only", "ffn_only", "rotation"]
FIG5_LABELS = {"none": "unmatched", "attn_only": "attention matched", "ffn_only": "FFN matched",
               "rotation": "fully matched"}


def fig3_ablation(eval_paths: list[str], png: str | Path) -> list[dict]:
    """Grouped bars with 95% intervals: each fusion method x {w/o match, w/o ATTN, w/o FFN, w/o rescale, match}."""
    ours = merged_evaluations(eval_paths)
    methods = [m for m in METHOD_LABELS if (m, "none") in ours]
    rows = []
    for m in methods:
        for v in FIG3_ORDER:
            if (m, v) not in ours:
                continue
            low, high = accuracy_interval(ours[(m, v)])
            row = {"method": m, "variant": v, "accuracy": mean_accuracy(ours[(m, v)]), "low": low, "high": high}
            if v != "none":
                found = accuracy_effect(ours[(m, v)], ours[(m, "none")])
                row.update({"effect": found["effect"], "effect_low": found["low"], "effect_high": found["high"],
                            "verdict": found["verdict"]})
            rows.append(row)
    fig, ax = plt.subplots(figsize=(10, 4.2))
    width = 0.8 / len(FIG3_ORDER)
    for j, variant in enumerate(FIG3_ORDER):
        chosen = [next(r for r in rows if r["method"] == m and r["variant"] == variant) for m in methods]
        values = [r["accuracy"] for r in chosen]
        errors = [[r["accuracy"] - r["low"] for r in chosen], [r["high"] - r["accuracy"] for r in chosen]]
        ax.bar([i + (j - 2) * width for i in range(len(methods))], values, width, label=VARIANT_LABELS[variant],
               yerr=errors, capsize=2, error_kw={"elinewidth": 0.8})
    ax.set_xticks(range(len(methods)), [METHOD_LABELS[m] for m in methods])
    ax.set_ylabel("test accuracy of the merged model (%)")
    ax.set_title("Figure 3: ablation of matching components per fusion method (95% bootstrap intervals)")
    ax.legend(ncols=5, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    ax.grid(axis="y", alpha=0.3)
    save_figure(fig, png)
    write_csv(rows, Path(png).with_suffix(".csv"))
    return rows


def fig4_distance(match_dirs: list[str], png: str | Path) -> list[dict]:
    """Bars: Euclidean distance between the end models after each matching method (mean over pairs)."""
    by_matching = defaultdict(list)
    for folder in match_dirs:
        data = read_json(folder)
        by_matching[data["matching"]].append(data)
    order = [m for m in FIG4_ORDER if m in by_matching]
    rows = []
    for m in order:
        runs = by_matching[m]
        row = {"matching": m, "distance": statistics.fmean(r["distance_after"] for r in runs)}
        modules = [k for k in runs[0]["distance_after_by_module"] if k != "total"]
        row.update({f"distance_{k}": statistics.fmean(r["distance_after_by_module"].get(k, 0.0) for r in runs)
                    for k in modules})
        if len(runs) > 1:
            row["spread_over_pairs"] = statistics.stdev(r["distance_after"] for r in runs)
        rows.append(row)
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = ["no matching" if m == "none" else VARIANT_LABELS[m] if m not in ("rotation", "rotation_no_rescale")
              else ("ours" if m == "rotation" else "ours w/o rescale") for m in order]
    bars = ax.bar(labels, [r["distance"] for r in rows], color="tab:blue",
                  yerr=[r.get("spread_over_pairs", 0.0) for r in rows] if len(by_matching[order[0]]) > 1 else None)
    ax.bar_label(bars, fmt="%.3g", fontsize=8)
    ax.set_ylabel("Euclidean distance between end models")
    ax.set_title("Figure 4: distance between the two end models after matching")
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel("matching applied to the source model before measuring")
    ax.grid(axis="y", alpha=0.3)
    save_figure(fig, png)
    write_csv(rows, Path(png).with_suffix(".csv"))
    return rows


def path_losses(data: dict) -> np.ndarray:
    """(alphas, examples) per-example losses along a barrier path."""
    return np.asarray([point["per_example"]["loss"] for point in data["path"]], dtype=float)


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


def fig5_barrier(barrier_paths: list[str], png: str | Path) -> list[dict]:
    """Loss along theta(alpha) = alpha*A + (1-alpha)*B for B unmatched / partly / fully matched; both barrier
    definitions, and each matching's barrier change vs unmatched with its paired bootstrap interval."""
    by_pair = defaultdict(dict)
    for path in barrier_paths:
        data = read_json(path)
        by_pair[barrier_pair(data)][data["matching"]] = data
    pairs = sorted(by_pair)
    rows = []
    changes = defaultdict(list)                     # matching -> per pair (point, resampled) barrier change
    for pair in pairs:
        runs = by_pair[pair]
        baseline = runs.get("none")
        index = None
        if baseline is not None:
            losses = path_losses(baseline)
            index = resamples(losses.shape[1], f"{baseline['task']}:{baseline.get('examples')}")
            base_resampled = barrier_resamples(losses, index)
        for matching in [m for m in FIG5_ORDER if m in runs]:
            data = runs[matching]
            if baseline is not None and matching != "none":
                resampled = barrier_resamples(path_losses(data), index) - base_resampled
                changes[matching].append((data["barrier"] - baseline["barrier"], resampled))
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
    fig, ax = plt.subplots(figsize=(6.5, 4))
    first = by_pair[pairs[0]]
    for matching in [m for m in FIG5_ORDER if m in first]:
        data = first[matching]
        change = summary.get(matching)
        interval_text = f", vs unmatched {change['change']:+.3f} [{change['low']:+.3f}, {change['high']:+.3f}]" \
            if change else ""
        ax.plot([p["alpha"] for p in data["path"]], [p["loss"] for p in data["path"]], marker="o", markersize=3,
                label=f"{FIG5_LABELS[matching]} (LB {data['barrier']:.3f}; above line {data['barrier_linear']:.3f}"
                      f"{interval_text})")
    ax.set_xlabel("alpha  (0 = source model B, 1 = anchor model A)")
    ax.set_ylabel("test loss (cross-entropy)")
    ax.set_title("Figure 5: loss along the linear path between the end models" +
                 (f"\n(paths of {pairs[0]}; changes vs unmatched: means over {len(pairs)} pairs)" if len(pairs) > 1 else ""),
                 fontsize=None if len(pairs) == 1 else 10)
    ax.legend(fontsize=6.5)
    ax.grid(alpha=0.3)
    save_figure(fig, png)
    write_csv(rows, Path(png).with_suffix(".csv"))
    return rows


__all__ = ["fig3_ablation", "fig4_distance", "fig5_barrier", "plt", "RESAMPLES"]
