"""benchmarks/bench_glmc.py and its driver (benchmarks/glmc/glmc_driver.py, run in Generalized LMC's environment):
the driver scores a curve exactly as symfusion's causal_lm task does, and both refuse a mistake with one line."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from benchmark_scripts import BENCHMARKS, load_benchmark
from symfusion.interpolation import alpha_grid, barrier_height, barrier_range, loss_path
from symfusion.pipeline.report.spread import over_pairs
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


class StandIn(torch.nn.Module):
    """Their GPTMerger's interface (proj, set_sampler, forward), not its code: the raw weights of model0 and model1
    interpolated at the sampled coefficient, model1's token embedding mapped by the trainable proj["residual"]."""

    def __init__(self, model0, model1, token_freqs=None, permutations_only=False, iterations=15):
        super().__init__()
        self.seen = (token_freqs, permutations_only, iterations)
        self.parts = [model0, model1]                 # a list, not submodules: proj alone is trained and saved
        self.proj = torch.nn.ParameterDict({"residual": torch.nn.Parameter(torch.eye(model0.config.n_embd))})
        self.sampled = []
        self.set_sampler(None)

    def set_sampler(self, sampler_type, fixed_coeff=0.5):
        self.sampler = (lambda: 0.4 + 0.2 * torch.rand(()).item()) if sampler_type == "narrow_uniform" else (
            lambda: fixed_coeff)

    def forward(self, input_ids=None, labels=None):
        a, b = ({k: v.detach() for k, v in m.named_parameters()} for m in self.parts)
        b["transformer.wte.weight"] = b["transformer.wte.weight"] @ self.proj["residual"]
        c = self.sampler()
        self.sampled.append(c)
        merged = {k: c * v + (1 - c) * b[k] for k, v in a.items()}
        return torch.func.functional_call(self.parts[0], merged, (input_ids,), {"labels": labels})


class StandInWrapper(torch.nn.Module):
    def __init__(self, config, merger_model):
        super().__init__()
        self.config, self.merger_model = config, merger_model

    def forward(self, input_ids=None, labels=None):
        return self.merger_model(input_ids=input_ids, labels=labels)


def test_the_learned_form_trains_the_projections_keeps_the_best_checkpoint_and_sweeps_from_the_source(tmp_path,
                                                                                                       monkeypatch):
    module = driver()
    monkeypatch.setitem(module.THEIR_TRAINING, "eval_steps", 2)     # their 50 and 25, scaled to a 4-step run
    monkeypatch.setitem(module.THEIR_TRAINING, "save_steps", 2)
    monkeypatch.setitem(module.THEIR_TRAINING, "logging_steps", 1)
    anchor, source = tiny_decoder("gpt2", seed=0).eval(), tiny_decoder("gpt2", seed=1).eval()
    g = torch.Generator().manual_seed(0)
    data = {"train": torch.randint(0, 97, (40, 16), generator=g), "validation": torch.randint(0, 97, (6, 16), generator=g),
            "blocks": torch.randint(0, 97, (5, 16), generator=g)}
    data["token_freqs"] = load_benchmark("bench_glmc").token_frequencies(data["train"], 97)
    args = SimpleNamespace(iterations=3, trainer_dir=str(tmp_path / "trainer"), learned_max_steps=4, batch_size=2)
    made = []
    their = {"GPTMerger": lambda *m, **kw: made.append(StandIn(*m, **kw)) or made[-1], "GPTMergerWrapper": StandInWrapper,
             "project": None, "MatrixType": None}
    alphas = alpha_grid(3)
    rows, record = module.learned_curve(their, anchor, source, data, alphas, args)
    merger = made[0]
    assert merger.seen[0] is data["token_freqs"] and merger.seen[1:] == (False, 3)
    assert merger.parts[0] is not anchor and merger.parts[1] is not source              # copies: ours untouched
    assert record["steps"] == record["max_steps"] == 4 and record["train_blocks"] == 40
    assert record["token_freqs"] == int((data["token_freqs"] > 0).sum())
    evals = [e["eval_loss"] for e in record["log"] if "eval_loss" in e]
    assert len(evals) == 2 and record["best_eval_loss"] == min(evals)
    best = load_file(str(Path(record["best_checkpoint"]) / "model.safetensors"))
    assert torch.equal(merger.proj["residual"].detach(), best["merger_model.proj.residual"])  # the best one, loaded
    assert record["moved"]["residual"]["change"] == pytest.approx(float((best["merger_model.proj.residual"]
                                                                         - torch.eye(64)).norm()))
    assert record["moved"]["residual"]["change"] > 0
    assert [len(r) for r in rows] == [5, 5, 5] and merger.sampled[-9:] == [0.0] * 3 + [0.5] * 3 + [1.0] * 3
    assert all(0.4 <= c <= 0.6 for c in merger.sampled[:-9])                # trained (and validated) on their sampler
    assert rows[-1] == pytest.approx(driver().block_losses(anchor, data["blocks"], 2), rel=1e-6)  # alpha = 1: model0
    unmapped = driver().block_losses(source, data["blocks"], 2)              # alpha = 0: model1 through the learned map
    assert rows[0] == pytest.approx(unmapped, rel=1e-2) and all(a != b for a, b in zip(rows[0], unmapped))


def test_our_inputs_to_their_learned_merger(tmp_path):
    bench = load_benchmark("bench_glmc")
    train = torch.tensor([[3, 3, 1], [0, 3, 5]])
    assert bench.token_frequencies(train, 7).tolist() == [1, 1, 0, 3, 0, 1, 0]

    class Task:
        def blocks(self, split, tokenizer):
            return {"train": train, "validation": train[:1] + 1}[split]

    test = torch.arange(6).reshape(2, 3)
    assert set(bench.driver_inputs(Task(), [0] * 7, test, learned=False)) == {"blocks"}
    inputs = bench.driver_inputs(Task(), [0] * 7, test, learned=True)
    assert torch.equal(inputs["blocks"], test) and torch.equal(inputs["train"], train)
    assert torch.equal(inputs["validation"], train[:1] + 1) and inputs["token_freqs"].tolist() == [1, 1, 0, 3, 0, 1, 0]
    dataset = driver().Blocks(test)
    assert len(dataset) == 2 and all(torch.equal(dataset[i]["input_ids"], test[i]) and torch.equal(
        dataset[i]["labels"], test[i]) for i in range(2))
    blocks = tmp_path / "blocks.safetensors"
    save_file({"blocks": test}, str(blocks))
    for extra, line in (([], "error: the learned form needs --trainer-dir, a new folder"),
                        (["--trainer-dir", str(tmp_path)], "error: the learned form needs --trainer-dir, a new folder"),
                        (["--trainer-dir", str(tmp_path / "t")],
                         f"error: the learned form needs 'train' and 'validation' blocks in {blocks}")):
        done = subprocess.run([sys.executable, str(DRIVER), "--checkout", str(tmp_path), "--anchor", "a", "--source",
                               "b", "--blocks", str(blocks), "--output", str(tmp_path / "out.json"), "--forms",
                               "learned", *extra], capture_output=True, text=True)
        assert done.returncode == 2 and done.stderr.strip().splitlines() == [line]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocks.safetensors"]


def test_ours_from_an_earlier_run_only_when_its_unmatched_curve_is_this_one(tmp_path, monkeypatch):
    bench = load_benchmark("bench_glmc")
    now = {"unmatched": {"loss": [4.0, 5.0, 4.5]}}

    def unmatched_only(args, task, anchor, source, work):
        assert args.ours == [] and work is None                              # nothing matched, nothing written
        return now

    monkeypatch.setattr(bench, "ours", unmatched_only)
    earlier = {"unmatched": {"loss": [4.0, 5.0, 4.5]}, "full_symmetry": {"loss": [4.0, 4.2, 4.5], "barrier": 0.2},
               "full_symmetry_learned": {"loss": [4.0, 4.1, 4.5]}}
    args = SimpleNamespace(ours=["full_symmetry"], points=3)
    assert bench.reused(args, None, "a", "b", earlier, "b:a") == {"unmatched": now["unmatched"],
                                                                  "full_symmetry": earlier["full_symmetry"]}
    moved = {**earlier, "unmatched": {"loss": [4.0, 5.0 + 1e-6, 4.5]}}
    with pytest.raises(SystemExit, match="error: --ours-from's unmatched curve of b:a is not this one"):
        bench.reused(args, None, "a", "b", moved, "b:a")
    with pytest.raises(SystemExit, match="error: --ours-from has no full_symmetry for b:a"):
        bench.reused(args, None, "a", "b", {"unmatched": earlier["unmatched"]}, "b:a")
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "merger.py").write_text("")
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_glmc.py"), "--glmc-checkout", str(tmp_path),
                           "--glmc-python", sys.executable, "--models", str(model), str(model), "--work",
                           str(tmp_path / "w"), "--ours-from", str(tmp_path / "none.json")], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [f"error: --ours-from {tmp_path / 'none.json'} "
                                                                         "is no file"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "merger.py"]


def test_combine_glmc_tables_pairs_from_several_runs_and_refuses_a_repeated_pair(tmp_path):
    spec = importlib.util.spec_from_file_location("combine_glmc", BENCHMARKS / "glmc" / "combine_glmc.py")
    combine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(combine)

    def cell(b):
        return {"barrier": b + 0.01, "barrier_linear": b}
    results = {"s1:s0": {"unmatched": cell(1.0), "learned": cell(0.2), "full_symmetry_learned": cell(0.25)},
               "s2:s0": {"unmatched": cell(0.8), "learned": cell(0.3), "full_symmetry_learned": cell(0.2)},
               "s2:s1": {"unmatched": cell(0.9), "learned": cell(0.1), "full_symmetry_learned": cell(0.15)}}
    lines = combine.tables(results, combine.CURVES)
    mean = over_pairs({"a": 0.2, "b": 0.3, "c": 0.1})
    share = over_pairs({"a": 20.0, "b": 37.5, "c": 100 * 0.1 / 0.9})
    assert (f"| learned | 0.200 | 0.300 | 0.100 | {mean['mean']:.3f} [{mean['low']:.3f}, {mean['high']:.3f}] | "
            f"{share['mean']:.1f} [{share['low']:.1f}, {share['high']:.1f}]% |") in lines
    d = over_pairs({"a": 0.05, "b": -0.1, "c": 0.05})
    assert (f"full_symmetry_learned - learned (barrier_linear): +0.050 / -0.100 / +0.050; mean {d['mean']:+.3f} "
            f"[{d['low']:+.3f}, {d['high']:+.3f}]") in lines
    assert not any(line.startswith("| weight_matching") or line.startswith("learned - weight") for line in lines)
    runs = []
    for i, pair in enumerate(results):
        runs.append(tmp_path / f"r{i}.json")
        runs[-1].write_text(json.dumps({"results": {pair: results[pair]}}))
    done = subprocess.run([sys.executable, str(BENCHMARKS / "glmc" / "combine_glmc.py"), *map(str, runs)],
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.splitlines() == lines        # the three files' pairs, merged
    done = subprocess.run([sys.executable, str(BENCHMARKS / "glmc" / "combine_glmc.py"), str(runs[0]), str(runs[0])],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [f"error: {runs[0]} repeats pair(s) s1:s0"]
