"""Figure data of the report: Figure 5 pairs every matching with its unmatched path; scores in points."""
import csv
import json

import numpy as np
import pytest

from symfusion.pipeline.report.artefacts import run_report, summary_lines

ALPHAS = [0.0, 0.5, 1.0]


def barrier_result(tmp_path, matching, source, bump, seed):
    """A barrier result as the barrier stage writes it: per-example losses along the path, barriers of their means."""
    rng = np.random.default_rng(seed)
    losses = [rng.uniform(0.2, 0.6, 40) + (bump if alpha == 0.5 else 0.0) for alpha in ALPHAS]   # (alphas, examples)
    means = [float(np.mean(row)) for row in losses]
    data = {"task": "fashion_mnist", "examples": 40, "matching": matching, "source": str(source),
            "anchor": str(tmp_path / "models" / "seed0"), "barrier": max(means) - min(means), "barrier_linear": 0.0,
            "path": [{"alpha": a, "loss": m, "accuracy": 0.75, "per_example": {"loss": row.tolist()}}
                     for a, m, row in zip(ALPHAS, means, losses)]}
    path = tmp_path / "barrier" / f"{matching}-{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return str(path), data


@pytest.mark.parametrize("unmatched_source", ["matched copy", "end model"])
def test_fig5_pairs_each_matching_with_the_unmatched_path_and_gives_its_change_interval(tmp_path, unmatched_source):
    matched = tmp_path / "matched" / "seed1-onto-seed0"
    none_source = matched / "none" if unmatched_source == "matched copy" else tmp_path / "models" / "seed1"
    none_path, none = barrier_result(tmp_path, "none", none_source, bump=1.0, seed=0)
    rot_path, rot = barrier_result(tmp_path, "rotation", matched / "rotation", bump=0.2, seed=1)
    attn_path, attn = barrier_result(tmp_path, "attn_only", matched / "attn_only", bump=0.9, seed=2)
    rows = run_report("fig5_barrier", [none_path, rot_path, attn_path], str(tmp_path / "fig5_barrier.png"))
    assert {r["pair"] for r in rows} == {"seed1-onto-seed0"}           # one pair, not one per way of naming it
    assert [r["matching"] for r in rows[::3]] == ["none", "attn_only", "rotation"]
    for data in (rot, attn):
        chosen = [r for r in rows if r["matching"] == data["matching"]]
        change = chosen[0]["barrier_change"]
        assert change == pytest.approx(data["barrier"] - none["barrier"])
        assert chosen[0]["change_low"] <= change <= chosen[0]["change_high"]
    rotation = next(r for r in rows if r["matching"] == "rotation")
    assert rotation["change_high"] < 0 and rotation["change_verdict"] == "helps"     # the bump drops 1.0 -> 0.2
    assert "barrier_change" not in rows[0]
    assert all(r["accuracy"] == 75.0 for r in rows)                  # points, as every table
    with open(tmp_path / "fig5_barrier.csv") as handle:
        header = next(csv.reader(handle))
    assert {"barrier_change", "change_low", "change_high"} <= set(header)
    line = next(x for x in summary_lines(tmp_path, tmp_path) if x.startswith("Figure 5"))
    assert "rotation" in line and "hurts" not in line and "lowest: rotation (as the paper" in line


def test_fig6_gives_losses_and_scores_in_points(tmp_path):
    sweep = tmp_path / "lang" / "minilm" / "layers.json"
    sweep.parent.mkdir(parents=True)
    sweep.write_text(json.dumps({"rows": [
        {"task": "debates_party", "setting": "none", "k": 0, "loss": 0.65, "score": 0.25},
        {"task": "debates_party", "setting": "single", "k": 0, "loss": 0.64, "score": 0.26},
        {"task": "debates_party", "setting": "tail", "k": 1, "loss": 0.63, "score": None}]}))
    rows = run_report("fig6_layers", [str(sweep)], str(tmp_path / "fig6_layers.png"))
    assert [r["score"] for r in rows] == [25.0, 26.0, None]
    assert [r["loss"] for r in rows] == [0.65, 0.64, 0.63]
    assert not any("change_low" in r for r in rows)          # a sweep without per-example losses: no intervals


def test_fig6_gives_each_loss_change_its_paired_interval(tmp_path):
    rng = np.random.default_rng(0)
    base = rng.uniform(0.1, 1.5, 120)
    lower = base - 0.05                                        # every example better: a detectable drop
    noisy = base + rng.normal(0.0, 0.2, 120) - 0.001           # a tiny shift in much noise
    noisy[0] -= float(np.mean(noisy) - np.mean(base) + 0.001)  # mean change exactly -0.001

    def row(setting, k, losses):
        return {"task": "ner_plot", "setting": setting, "k": k, "loss": float(np.mean(losses)), "score": 0.5,
                "per_example": {"loss": losses.tolist()}}
    sweep = tmp_path / "lang" / "minilm" / "layers.json"
    sweep.parent.mkdir(parents=True)
    sweep.write_text(json.dumps({"rows": [row("none", 0, base), row("single", 0, lower), row("single", 1, noisy),
                                          row("tail", 1, base)]}))
    rows = run_report("fig6_layers", [str(sweep)], str(tmp_path / "fig6_layers.png"))
    none, drop, shift, same = rows
    assert "loss_change" not in none
    assert drop["loss_change"] == pytest.approx(-0.05)
    assert drop["change_low"] == pytest.approx(-0.05) and drop["change_high"] == pytest.approx(-0.05)
    assert drop["change_verdict"] == "helps"
    assert shift["change_low"] < shift["loss_change"] < 0 < shift["change_high"]
    assert shift["change_verdict"] == "no detectable change"
    assert (same["loss_change"], same["change_low"], same["change_high"]) == (0.0, 0.0, 0.0)
    with open(tmp_path / "fig6_layers.csv") as handle:
        header = next(csv.reader(handle))
    assert {"loss_change", "change_low", "change_high", "change_verdict"} <= set(header)
    line = next(x for x in summary_lines(tmp_path, tmp_path) if x.startswith("Figure 6"))
    assert "1 of 3 effects detectable (1 help, 0 hurt)" in line
    assert "-0.05 (ner_plot, single 0)" in line


def test_fig5_summary_over_several_pairs_gives_mean_barriers(tmp_path):
    paths, barriers = [], {}
    for pair, seed in (("seed1-onto-seed0", 0), ("seed2-onto-seed0", 10)):
        matched = tmp_path / "matched" / pair
        for matching, bump in (("none", 1.0), ("rotation", 0.2)):
            path, data = barrier_result(tmp_path, matching, matched / matching, bump=bump, seed=seed + len(paths))
            paths.append(path)
            barriers.setdefault(matching, []).append(data["barrier"])
    rows = run_report("fig5_barrier", paths, str(tmp_path / "fig5_barrier.png"))
    assert {r["pair"] for r in rows} == {"seed1-onto-seed0", "seed2-onto-seed0"}
    rotation = next(r for r in rows if r["matching"] == "rotation")
    mean = {m: sum(b) / 2 for m, b in barriers.items()}
    assert rotation["barrier_change"] == pytest.approx(mean["rotation"] - mean["none"])
    line = next(x for x in summary_lines(tmp_path, tmp_path) if x.startswith("Figure 5"))
    assert "means over 2 model pairs" in line
    assert f"none {mean['none']:.3f}" in line and f"rotation {mean['rotation']:.3f}" in line
    assert "lowest: rotation (as the paper" in line
