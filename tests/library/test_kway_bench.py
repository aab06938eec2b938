"""benchmarks/bench_kway.py --summary: one table over groups of ViT runs or of decoder runs, with paired differences."""
from __future__ import annotations

import json
import math

import pytest

from tests.benchmark_scripts import load_benchmark

bench = load_benchmark("bench_kway")


def run(tmp_path, name: str, shift: float, decoder: bool = False):
    def scored(loss: float) -> dict:
        return {"loss": loss, **({"perplexity": math.exp(loss)} if decoder else {"accuracy": 1 - loss / 4})}
    rows = {way: {"centroid": scored(loss + shift), "barrier": barrier + shift, "seconds": 1.0}
            for way, loss, barrier in (("naive", 2.0, 1.6), ("anchor", 1.0, 0.5), ("universe", 0.9, 0.4),
                                       ("universe_anchor", 1.0, 0.5))}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"cpu": "test CPU", "names": [name], "rows": rows, "best": scored(0.5),
                                "ensemble": scored(0.45), "pairwise_cpu": [0.5, 0.5], "cpu_all_in": {}}))
    return path


@pytest.mark.parametrize("decoder", [False, True])
def test_the_summary_pairs_the_universe_with_anchor_matching_over_groups(tmp_path, capsys, decoder):
    paths = [run(tmp_path, f"g{i}", shift, decoder) for i, shift in enumerate((0.0, 0.1, 0.2))]
    bench.summary(paths)
    out = capsys.readouterr().out
    assert ("centroid accuracy %" if not decoder else "centroid perplexity") in out
    # the universe's loss is 0.1 below anchor matching's in every group: the interval is the one value
    paired = next(line for line in out.splitlines() if line.startswith("paired universe - anchor:"))
    if decoder:
        assert "centroid loss -0.1000 [-0.1000, -0.1000] nats" in paired
    else:
        assert "centroid accuracy 2.50 [2.50, 2.50] points" in paired
    assert "barrier -0.1000 [-0.1000, -0.1000]" in paired
    share = 100 * 0.4 / 1.6
    row = next(line for line in out.splitlines() if line.startswith("| universe | g0 |"))
    assert row.endswith(f"| {share:.1f} |")


def test_the_summary_refuses_ViT_and_decoder_runs_together(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.summary([run(tmp_path, "v", 0.0), run(tmp_path, "d", 0.0, decoder=True)])
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("error: --summary tabulates runs of one kind")


def base_args(tmp_path, base, **kwargs):
    defaults = dict(learned_only=True, out=tmp_path / "added.json", base=base, names=["g0"], anchor_synthetic=True,
                    synthetic=False, no_anchor_learned=True, no_kway_learned=True, untie=False)
    return type("Args", (), {**defaults, **kwargs})()


def test_base_adds_rows_that_the_summary_then_pairs(tmp_path, capsys):
    # --learned-only --base G.json: G's rows and the new ones in one record, which --summary tabulates and pairs
    base = run(tmp_path, "g0", 0.0)
    args = base_args(tmp_path, base)
    bench.check_base(args)
    added = {"anchor_synthetic": {"centroid": {"loss": 0.8, "accuracy": 0.8}, "barrier": 0.3}}
    record = bench.with_base(base, {"cpu": "test CPU", "names": ["g0"], "rows": added,
                                    "cpu_all_in": {"anchor_synthetic": 12.5}})
    assert set(record["rows"]) == {"naive", "anchor", "universe", "universe_anchor", "anchor_synthetic"}
    assert record["rows"]["anchor"] == json.loads(base.read_text())["rows"]["anchor"]
    assert record["cpu_all_in"]["anchor_synthetic"] == 12.5 and record["added"]["rows"] == ["anchor_synthetic"]
    args.out.write_text(json.dumps(record))
    bench.summary([args.out])
    out = capsys.readouterr().out
    assert "paired anchor_synthetic - anchor: barrier -0.2000" in out


@pytest.mark.parametrize("change,message", [
    ({"names": ["other"]}, "is not a full run on other"),
    ({"learned_only": False}, "--base needs --learned-only"),
    ({"out": None}, "--base needs --learned-only"),
    ({"synthetic": True, "anchor_synthetic": False}, None),
])
def test_base_refuses_another_groups_run_or_a_missing_out(tmp_path, capsys, change, message):
    base = run(tmp_path, "g0", 0.0)
    if message is None:                           # a row the base already has: refused before anything runs
        record = json.loads(base.read_text())
        record["rows"]["synthetic"] = record["rows"]["universe"]
        base.write_text(json.dumps(record))
        message = "already has the rows synthetic"
    with pytest.raises(SystemExit) as stop:
        bench.check_base(base_args(tmp_path, base, **change))
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_base_refuses_to_write_over_itself(tmp_path, capsys):
    base = run(tmp_path, "g0", 0.0)
    before = base.read_text()
    with pytest.raises(SystemExit):
        bench.check_base(base_args(tmp_path, base, out=base))
    assert base.read_text() == before and capsys.readouterr().err.startswith("error: --base needs")


def test_a_groups_learned_only_runs_join_its_full_run_in_the_summary(tmp_path, capsys):
    # the summary puts together the runs of one group (the same names), whichever comes first
    full = [run(tmp_path, f"g{i}", shift) for i, shift in enumerate((0.0, 0.1, 0.2))]
    extras = []
    for i in range(3):
        extras.append(tmp_path / f"g{i}_learned.json")
        extras[-1].write_text(json.dumps({"cpu": "test CPU", "names": [f"g{i}"], "steps": 200, "batches": 200,
                                          "rows": {"learned": {"centroid": {"loss": 0.6, "accuracy": 0.85},
                                                               "barrier": 0.1, "cpu_seconds": 7.0}}}))
    paths = [extras[0], *full, *extras[1:]]          # the first group's extra run before its full run
    bench.summary(paths)
    out = capsys.readouterr().out
    assert out.startswith("3 groups (g0; g1; g2)")
    assert "paired learned - universe: barrier" in out and "learned: 7.0 [7.0, 7.0] CPU s all-in" in out


def test_a_way_measured_twice_for_a_group_or_a_group_without_a_full_run_is_refused(tmp_path, capsys):
    full = run(tmp_path, "g0", 0.0)
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps({"names": ["g0"], "rows": {"anchor": {"centroid": {"loss": 1.0}, "barrier": 0.5}}}))
    lone = tmp_path / "lone.json"
    lone.write_text(json.dumps({"names": ["g9"], "rows": {"learned": {"centroid": {"loss": 1.0}, "barrier": 0.5}}}))
    copied = tmp_path / "copied.json"                 # a --base copy of the same row is the same measurement
    copied.write_text(json.dumps({"names": ["g0"], "rows": {"anchor": json.loads(full.read_text())["rows"]["anchor"]}}))
    bench.summary([full, copied])
    assert "1 groups (g0)" in capsys.readouterr().out
    for paths, message in (([full, twice], "g0 has the rows anchor in two runs that differ"),
                           ([full, lone], "g9: no full run")):
        with pytest.raises(SystemExit) as stop:
            bench.summary(paths)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.startswith("error: --summary") and message in err
