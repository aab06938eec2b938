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
