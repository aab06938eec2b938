"""benchmarks/bench_glmc.py and its driver (benchmarks/glmc/glmc_driver.py, run in Generalized LMC's environment):
the driver scores a curve exactly as symfusion's causal_lm task does, and both refuse a mistake with one line."""
import importlib.util
import subprocess
import sys

import pytest
import torch

from benchmark_scripts import BENCHMARKS, load_benchmark
from symfusion.interpolation import alpha_grid, barrier_height, barrier_range, loss_path
from symfusion.pipeline.tasks.lm_models import evaluate_causal_lm
from tiny_decoders import tiny_decoder

DRIVER = BENCHMARKS / "glmc" / "glmc_driver.py"


def driver():
    spec = importlib.util.spec_from_file_location("glmc_driver", DRIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_driver_scores_blocks_and_the_vanilla_curve_as_our_task_does():
    anchor, source = tiny_decoder("gpt2", seed=0).eval(), tiny_decoder("gpt2", seed=1).eval()
    blocks = torch.randint(0, 97, (7, 16), generator=torch.Generator().manual_seed(0))
    ours = evaluate_causal_lm(anchor, blocks, batch_size=3)["per_example"]["loss"]
    assert driver().block_losses(anchor, blocks, 3) == ours                      # the same sums, to the bit
    assert driver().block_losses(anchor, blocks, 7) == pytest.approx(ours, rel=1e-5)
    alphas = alpha_grid(5)
    rows = driver().vanilla_curve(anchor, source, blocks, alphas, 3)
    tokens = blocks.shape[0] * (blocks.shape[1] - 1)
    theirs = load_benchmark("bench_glmc").curve([sum(r) / tokens for r in rows], alphas)
    path = loss_path(tiny_decoder("gpt2", seed=0), anchor.state_dict(), source.state_dict(),
                     lambda m: evaluate_causal_lm(m, blocks, 3), 5)
    assert theirs["loss"] == pytest.approx([p["loss"] for p in path["path"]], rel=1e-12)
    assert theirs["barrier"] == pytest.approx(path["barrier"], rel=1e-12)
    assert theirs["barrier_linear"] == pytest.approx(barrier_height(alphas, theirs["loss"]), rel=1e-12)
    assert theirs["barrier"] == barrier_range(theirs["loss"]) and theirs["loss"][-1] == pytest.approx(sum(ours) / tokens)


def test_driver_and_bench_refuse_with_one_error_line_and_write_nothing(tmp_path):
    existing = tmp_path / "curves.json"
    existing.write_text("mine")
    done = subprocess.run([sys.executable, str(DRIVER), "--checkout", str(tmp_path), "--anchor", "a", "--source", "b",
                           "--blocks", "c", "--output", str(existing)], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [f"error: {existing} exists; give a new file"]
    assert existing.read_text() == "mine"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_glmc.py"), "--glmc-checkout", str(tmp_path),
                           "--glmc-python", sys.executable, "--models", str(tmp_path), "--work", str(tmp_path / "w")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == ["error: --glmc-checkout has no merger.py"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.json"]
    setup = BENCHMARKS / "glmc" / "setup_glmc.sh"
    for argv, line in (([str(tmp_path), str(tmp_path / "venv")], f"error: {tmp_path} exists; give a new folder for "
                        "their checkout"), ([str(tmp_path / "c"), str(existing)], f"error: {existing} exists; give a "
                        "new folder for the environment"), ([str(BENCHMARKS / "glmc-checkout"), str(tmp_path / "v")],
                        f"error: {BENCHMARKS / 'glmc-checkout'} lies inside this repository; put it outside"),
                       ([str(tmp_path / "c")], "error: usage: setup_glmc.sh CHECKOUT_DIR VENV_DIR [GIT_SOURCE]")):
        done = subprocess.run(["bash", str(setup), *argv], capture_output=True, text=True)
        assert done.returncode == 2 and done.stderr.strip().splitlines() == [line]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.json"] and not (BENCHMARKS / "glmc-checkout").exists()
