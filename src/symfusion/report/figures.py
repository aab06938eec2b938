"""Figures of the report (3: ablation bars, 4: distances, 5: loss barriers), each with its numbers as CSV."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from symfusion.report.results import METHOD_LABELS, VARIANT_LABELS, read_json, write_csv  # noqa: E402
from symfusion.report.tables import merged_accuracies  # noqa: E402

FIG3_ORDER = ["none", "ffn_only", "attn_only", "rotation_no_rescale", "rotation"]
FIG4_ORDER = ["none", "git_rebasin", "ot_ffn", "rotation_no_rescale", "rotation"]
FIG5_ORDER = ["none", "attn_only", "ffn_only", "rotation"]
FIG5_LABELS = {"none": "unmatched", "attn_only": "attention matched", "ffn_only": "FFN matched",
               "rotation": "fully matched"}


def save_figure(fig, png: str | Path) -> None:
    """PNG and PDF beside each other, written via temp names."""
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    for path in (png, png.with_suffix(".pdf")):
        tmp = path.with_name(f".tmp-{path.name}")
        fig.savefig(tmp, dpi=150, bbox_inches="tight", format=path.suffix[1:])
        tmp.replace(path)
    plt.close(fig)


def fig3_ablation(eval_paths: list[str], png: str | Path) -> list[dict]:
    """Grouped bars: each fusion method x {w/o match, w/o ATTN, w/o FFN, w/o rescale, match}."""
    ours = merged_accuracies(eval_paths)
    methods = [m for m in METHOD_LABELS if (m, "none") in ours]
    rows = [{"method": m, "variant": v, "accuracy": 100 * ours[(m, v)]["metrics"]["accuracy"]}
            for m in methods for v in FIG3_ORDER if (m, v) in ours]
    fig, ax = plt.subplots(figsize=(10, 4.2))
    width = 0.8 / len(FIG3_ORDER)
    for j, variant in enumerate(FIG3_ORDER):
        values = [100 * ours[(m, variant)]["metrics"]["accuracy"] for m in methods]
        ax.bar([i + (j - 2) * width for i in range(len(methods))], values, width, label=VARIANT_LABELS[variant])
    ax.set_xticks(range(len(methods)), [METHOD_LABELS[m] for m in methods])
    ax.set_ylabel("test accuracy of the merged model (%)")
    ax.set_title("Figure 3: ablation of matching components per fusion method")
    ax.legend(ncols=5, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    ax.grid(axis="y", alpha=0.3)
    save_figure(fig, png)
    write_csv(rows, Path(png).with_suffix(".csv"))
    return rows


def fig4_distance(match_dirs: list[str], png: str | Path) -> list[dict]:
    """Bars: Euclidean distance between the end models after each matching method."""
    results = {read_json(d)["matching"]: read_json(d) for d in match_dirs}
    order = [m for m in FIG4_ORDER if m in results]
    rows = [{"matching": m, "distance": results[m]["distance_after"],
             **{f"distance_{k}": v for k, v in results[m]["distance_after_by_module"].items() if k != "total"}}
            for m in order]
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = ["no matching" if m == "none" else VARIANT_LABELS[m] if m not in ("rotation", "rotation_no_rescale")
              else ("ours" if m == "rotation" else "ours w/o rescale") for m in order]
    bars = ax.bar(labels, [r["distance"] for r in rows], color="tab:blue")
    ax.bar_label(bars, fmt="%.3g", fontsize=8)
    ax.set_ylabel("Euclidean distance between end models")
    ax.set_title("Figure 4: distance between the two end models after matching")
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel("matching applied to the source model before measuring")
    ax.grid(axis="y", alpha=0.3)
    save_figure(fig, png)
    write_csv(rows, Path(png).with_suffix(".csv"))
    return rows


def fig5_barrier(barrier_paths: list[str], png: str | Path) -> list[dict]:
    """Loss along theta(alpha) = alpha*A + (1-alpha)*B for B unmatched / partly / fully matched."""
    results = {read_json(p)["matching"]: read_json(p) for p in barrier_paths}
    rows = []
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for matching in [m for m in FIG5_ORDER if m in results]:
        data = results[matching]
        alphas = [p["alpha"] for p in data["path"]]
        losses = [p["loss"] for p in data["path"]]
        ax.plot(alphas, losses, marker="o", markersize=3,
                label=f"{FIG5_LABELS[matching]} (barrier {data['barrier']:.3f})")
        rows += [{"matching": matching, **p, "barrier": data["barrier"]} for p in data["path"]]
    ax.set_xlabel("alpha  (0 = source model B, 1 = anchor model A)")
    ax.set_ylabel("test loss (cross-entropy)")
    ax.set_title("Figure 5: loss along the linear path between the end models")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    save_figure(fig, png)
    write_csv(rows, Path(png).with_suffix(".csv"))
    return rows
