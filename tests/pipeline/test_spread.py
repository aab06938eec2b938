"""Numbers over several model pairs (report/spread.py): mean, sd, se and t interval; verdicts that hold over pairs; Table 2
and the barrier figures per pair and over pairs, with the paper's matchings on the first pair only."""
import json
import math

import pytest
from scipy import stats

from symfusion.pipeline.report.artefacts import run_report, summary_lines
from symfusion.pipeline.report.registry import experiment
from symfusion.pipeline.report.spread import NO_CHANGE, over_pairs, verdict_over_pairs
from symfusion.pipeline.report.table2 import table2_rows

from test_report_figures import barrier_result


def test_over_pairs_is_the_mean_the_sample_sd_the_se_and_the_t_interval():
    values = {"a": 1.0, "b": 2.0, "c": 4.0}
    found = over_pairs(values)
    sd = math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2)
    half = stats.t.ppf(0.975, 2) * sd / math.sqrt(3)
    assert found["pairs"] == 3 and found["mean"] == pytest.approx(7 / 3)
    assert found["sd"] == pytest.approx(sd) and found["se"] == pytest.approx(sd / math.sqrt(3))
    assert (found["low"], found["high"]) == pytest.approx((7 / 3 - half, 7 / 3 + half))
    one = over_pairs({"a": 5.0})
    assert one["pairs"] == 1 and one["mean"] == 5.0 and one["sd"] is None and one["low"] is None


def test_an_effect_helps_over_pairs_only_when_it_holds_in_every_pair_and_in_the_t_interval():
    steady = over_pairs({"a": 2.0, "b": 2.1, "c": 1.9})
    assert verdict_over_pairs(steady, ["helps"] * 3) == "helps"
    assert verdict_over_pairs(steady, ["helps", "helps", NO_CHANGE]) == NO_CHANGE      # one pair does not show it
    wobbly = over_pairs({"a": 2.0, "b": -1.5, "c": 3.0})                                 # the t interval spans 0
    assert verdict_over_pairs(wobbly, ["helps", "hurts", "helps"]) == NO_CHANGE
    lower = over_pairs({"a": -0.5, "b": -0.6, "c": -0.55})
    assert verdict_over_pairs(lower, ["helps"] * 3, lower_is_better=True) == "helps"     # a loss that drops
    assert verdict_over_pairs(lower, ["hurts"] * 3) == "hurts"                            # an accuracy that drops
    assert verdict_over_pairs(lower, ["helps"] * 3) == NO_CHANGE                          # verdicts must agree
    assert verdict_over_pairs(over_pairs({"a": 2.0}), ["hurts"]) == "hurts"                # one pair: its own


def evaluation(folder, pair, matching, accuracy, n=2000):
    """A simple merge's evaluation of one pair (the pair read off its source folder)."""
    correct = [1] * int(n * accuracy) + [0] * (n - int(n * accuracy))
    source, anchor = pair.split("-onto-")
    path = folder / f"{pair}-{matching}.json"
    path.write_text(json.dumps({
        "method": "simple", "matching": matching, "metrics": {"accuracy": int(n * accuracy) / n},
        "merged_models": [f"models/{anchor}", f"models/{source}" if matching == "none"
                          else f"matched/{pair}/{matching}"],
        "results": [{"task": "digits", "per_example": {"correct": correct, "loss": [0.0] * n}}]}))
    return str(path)


def test_table2_gives_each_cell_over_its_pairs_and_the_papers_columns_on_the_first_pair(tmp_path):
    first, others = "seed1-onto-seed0", ["seed2-onto-seed0", "seed2-onto-seed1"]
    paths = [evaluation(tmp_path, first, m, a) for m, a in
             (("none", 0.5), ("rotation_no_rescale", 0.55), ("rotation", 0.56), ("full_symmetry", 0.7),
              ("full_symmetry_learned", 0.8))]
    for pair, shift in zip(others, (0.02, -0.01)):
        paths += [evaluation(tmp_path, pair, m, a + shift) for m, a in
                  (("none", 0.5), ("rotation", 0.56), ("full_symmetry", 0.7), ("full_symmetry_learned", 0.8))]
    (row,) = table2_rows(paths, experiment("table2"))
    assert row["ours_no_rescale_pairs"] == 1 and "ours_no_rescale_sd" not in row           # first pair only
    assert row["ours_full_symmetry_pairs"] == 3
    per_pair = [row[f"ours_full_symmetry_{p}"] for p in [first] + others]
    assert per_pair == pytest.approx([70.0, 72.0, 69.0])
    assert row["ours_full_symmetry"] == pytest.approx(sum(per_pair) / 3)
    assert row["ours_full_symmetry_se"] == pytest.approx(over_pairs(dict(enumerate(per_pair)))["se"])
    assert row["effect_full_symmetry"] == pytest.approx(20.0)                              # every pair: +20
    assert row["effect_full_symmetry_pairs"] == 3 and row["effect_full_symmetry_sd"] == pytest.approx(0.0, abs=1e-9)
    assert row["ours_effect_full_symmetry"] == "helps"
    assert row["effect_pairs"] == 3 and row["effect"] == pytest.approx(6.0)                # rotation: all 3 pairs
    md = tmp_path / "table2.md"
    run_report("table2", paths, str(md.with_suffix(".csv")))
    text = md.read_text()
    assert "Per model pair" in text and "(3)" in text and "pairs [" in text
    lines = summary_lines(tmp_path, tmp_path)
    assert any("over 3 model pairs" in x for x in lines if x.startswith("Table 2 (vision)"))
    assert any("`full_symmetry` vs none: simple 70.33 +- 0.88 se (3 pairs, +20.00 helps)" in x for x in lines)


def test_barrier_changes_are_given_per_pair_with_their_spread_and_the_verdict_over_pairs(tmp_path):
    paths = []
    for k, pair in enumerate(("seed1-onto-seed0", "seed2-onto-seed0", "seed2-onto-seed1")):
        for matching, bump in (("none", 1.0), ("full_symmetry", 0.2)):
            folder = tmp_path / "p" / str(k)
            path, _ = barrier_result(folder, matching, tmp_path / "matched" / pair / matching, bump=bump, seed=10 * k)
            paths.append(path)
    rows = run_report("fig5_barrier", paths, str(tmp_path / "fig5_barrier.png"))
    full = [r for r in rows if r["matching"] == "full_symmetry"]
    assert {r["pair"] for r in full} == {"seed1-onto-seed0", "seed2-onto-seed0", "seed2-onto-seed1"}
    own = {r["pair"]: r["pair_change"] for r in full}
    assert full[0]["barrier_change"] == pytest.approx(sum(own.values()) / 3)
    assert full[0]["barrier_change_pairs"] == 3
    assert full[0]["barrier_change_pairs_low"] < full[0]["barrier_change"] < full[0]["barrier_change_pairs_high"] < 0
    assert full[0]["change_verdict"] == "helps"
    line = next(x for x in summary_lines(tmp_path, tmp_path) if x.startswith("Figure 5"))
    assert "3 pairs" in line and "pairs [" in line
    peers = [x for x in summary_lines(tmp_path, tmp_path) if "Generalized LMC" in x]
    assert any("ViT on CIFAR-10" in x and "1.69" in x for x in peers)
    assert any("Above the straight line" in x and "data-free" in x for x in peers)
