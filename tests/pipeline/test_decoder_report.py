"""Table D1 / D2 and Figure D from synthetic decoder results with closed-form answers: token-weighted losses, each
effect vs no matching with its paired interval and verdict, mergekit's row beside symfusion's, the end models and the
unigram baseline; barrier changes whose interval collapses exactly when the loss per token is the same in every block."""
import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from symfusion.errors import SymfusionError
from symfusion.pipeline.report.artefacts import run_report, summary_lines
from symfusion.pipeline.report.audit import table_section
from symfusion.pipeline.report.compare import compare_run
from symfusion.pipeline.report.registry import experiment

TOKENS = [127, 63, 127, 31, 127, 95, 127, 127]         # blocks of different lengths: token weighting matters


def lm_result(task: str, per_token: list[float]) -> dict:
    """An evaluation's result on a causal_lm task: each block's summed loss is its tokens x its loss per token."""
    losses = [t * x for t, x in zip(TOKENS, per_token)]
    loss = math.fsum(losses) / sum(TOKENS)
    return {"task": task, "kind": "causal_lm", "metric": "perplexity", "split": "test",
            "metrics": {"loss": loss, "perplexity": math.exp(loss), "n": len(TOKENS), "tokens": sum(TOKENS)},
            "per_example": {"loss": losses, "tokens": list(TOKENS)}}


def write(path: Path, data: dict) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return str(path)


def merged(root: Path, method: str, matching: str, per_token: dict[str, list[float]], client: str | None = None,
           **extra) -> str:
    """A merged model's evaluation as symfusion-merge writes it (per test set)."""
    source = root / "models" / "seed1" if matching == "none" else root / "matched" / "seed1-onto-seed0" / matching
    data = {"method": method, "matching": matching, "merged_models": [str(root / "models" / "seed0"), str(source)],
            "results": [lm_result(task, values) for task, values in per_token.items()], **extra}
    if client:
        data["client"] = client
    folder = root / "eval" / "seed1-onto-seed0" / matching / (client or "")
    return write(folder / f"{method}.json", data)


BASE = [5.0, 5.2, 4.8, 5.5, 5.1, 4.9, 5.3, 5.0]
NOISE = [0.02, -0.03, 0.01, -0.02, 0.03, -0.01, 0.02, -0.02]     # mixed signs: no detectable change


@pytest.fixture
def decoder_inputs(tmp_path):
    """Table D1's inputs for one pair: rotation adds 0.14 nats per token to every block (hurts, exactly), full_symmetry
    subtracts 0.05 (helps), git_rebasin adds mixed noise (no detectable change); mergekit's simple merge after
    full_symmetry equals symfusion's up to 1e-7; two end models and the task's data manifest."""
    shifts = {"none": [0.0] * 8, "git_rebasin": NOISE, "rotation": [0.14] * 8, "full_symmetry": [-0.05] * 8}
    paths = []
    for matching, shift in shifts.items():
        for method, offset in (("simple", 0.0), ("fisher", -0.2), ("regmean", -0.1)):
            values = [b + s + offset for b, s in zip(BASE, shift)]
            paths.append(merged(tmp_path, method, matching, {"lm_english": values}))
    kit = [b - 0.05 + 1e-7 for b in BASE]
    paths.append(merged(tmp_path, "simple", "full_symmetry", {"lm_english": kit}, client="mergekit",
                        mergekit={"max_abs_difference_vs_symfusion": 6.0e-8, "within_float32_rounding_of_symfusion": True}))
    for seed, level in ((0, 4.0), (1, 4.1)):
        paths.append(write(tmp_path / "eval" / "end" / f"seed{seed}.json", {
            "method": "end_model", "matching": "none", "model": str(tmp_path / "models" / f"seed{seed}"),
            "results": [lm_result("lm_english", [level] * 8)]}))
    paths.append(write(tmp_path / "data" / "lm_english.json", {
        "task": "lm_english", "kind": "causal_lm",
        "unigram_baseline": {"test": {"loss": 6.5, "perplexity": math.exp(6.5), "tokens": sum(TOKENS)}}}))
    return tmp_path, paths


def test_table_d1_gives_token_weighted_losses_effects_with_intervals_and_verdicts(decoder_inputs):
    root, paths = decoder_inputs
    rows = run_report("table_decoder", paths, str(root / "table_decoder.csv"))
    merges = {(r["method"], r["matching"], r["client"]): r for r in rows if r.get("method")}
    weighted = float(np.dot(TOKENS, BASE) / sum(TOKENS))
    plain = merges[("simple", "none", "symfusion")]
    assert plain["loss"] == pytest.approx(weighted) and plain["perplexity"] == pytest.approx(math.exp(weighted))
    assert "effect" not in plain
    rotation = merges[("simple", "rotation", "symfusion")]
    assert rotation["effect"] == pytest.approx(0.14)
    assert rotation["effect_low"] == pytest.approx(0.14) and rotation["effect_high"] == pytest.approx(0.14)
    assert rotation["ours_effect"] == "hurts"
    full = merges[("regmean", "full_symmetry", "symfusion")]
    assert full["effect"] == pytest.approx(-0.05) and full["ours_effect"] == "helps"
    noisy = merges[("fisher", "git_rebasin", "symfusion")]
    assert noisy["effect_low"] < 0 < noisy["effect_high"] and noisy["ours_effect"] == "no detectable change"
    assert noisy["effect"] == pytest.approx(float(np.dot(TOKENS, NOISE) / sum(TOKENS)))
    kit = merges[("simple", "full_symmetry", "mergekit")]
    assert kit["vs_symfusion"] == pytest.approx(1e-7, abs=1e-12) and kit["within_float32_rounding"] is True
    assert kit["effect"] == pytest.approx(-0.05 + 1e-7) and kit["model"] == "simple, by mergekit"
    # order: methods as the entry orders them, matchings as it declares them, mergekit right after symfusion's merge
    order = [(r.get("method"), r.get("matching"), r.get("client")) for r in rows]
    assert order[:5] == [("simple", m, "symfusion") for m in ("none", "git_rebasin", "rotation", "full_symmetry")] + [
        ("simple", "full_symmetry", "mergekit")]
    assert [r["model"] for r in rows[-3:]] == ["end model seed0", "end model seed1", "unigram baseline"]
    assert rows[-1]["perplexity"] == pytest.approx(math.exp(6.5)) and rows[-3]["loss"] == pytest.approx(4.0)
    markdown = (root / "table_decoder.md").read_text()
    assert "+0.140 [+0.140, +0.140]" in markdown and "refuse decoder layouts" in markdown
    assert "agree with symfusion's simple merge of the same folders to float32 rounding" in markdown
    (line,) = [x for x in summary_lines(root, root) if x.startswith("Table D1")]
    assert "7 of 10 effects detectable (4 help, 3 hurt)" in line and "seed0 54.6" in line
    assert "mergekit's simple merge equals symfusion's to float32 rounding" in line and "unigram baseline 665.1" in line


def test_mergekit_is_compared_with_symfusions_merge_of_the_same_pairs(decoder_inputs):
    """mergekit merges the first pair only (its registry entry: pairs: first); symfusion's merges cover every pair.
    Its loss is compared with symfusion's merge of that pair, not with the mean over all of them."""
    root, paths = decoder_inputs
    for method in ("simple", "fisher", "regmean"):
        for matching in ("none", "git_rebasin", "rotation", "full_symmetry"):
            data = json.loads(Path(next(p for p in paths if p.endswith(f"/{matching}/{method}.json"))).read_text())
            data["merged_models"] = [str(root / "models" / "seed0"),
                                     str(root / ("models/seed2" if matching == "none" else f"matched/seed2-onto-seed0/{matching}"))]
            for result in data["results"]:
                result["per_example"]["loss"] = [x + 0.3 * n for x, n in zip(result["per_example"]["loss"], TOKENS)]
                result["metrics"]["loss"] += 0.3                                # 0.3 nats per token worse
            paths.append(write(root / "eval" / "seed2-onto-seed0" / matching / f"{method}.json", data))
    rows = run_report("table_decoder", paths, str(root / "table_decoder.csv"))
    kit = next(r for r in rows if r.get("client") == "mergekit")
    assert kit["vs_symfusion"] == pytest.approx(1e-7, abs=1e-12) and kit["pairs"] == 1
    own = next(r for r in rows if (r.get("method"), r.get("matching"), r.get("client")) == ("simple", "full_symmetry", "symfusion"))
    assert own["pairs"] == 2 and own["loss"] == pytest.approx(kit["loss"] + 0.15, abs=1e-6)


def test_table_d1_refuses_a_matching_its_entry_does_not_declare(decoder_inputs):
    root, paths = decoder_inputs
    paths.append(merged(root, "simple", "attn_only", {"lm_english": BASE}))
    with pytest.raises(SymfusionError, match="attn_only.*does not declare"):
        run_report("table_decoder", paths, str(root / "table_decoder.csv"))
    assert not (root / "table_decoder.csv").exists()


def test_table_d2_scores_every_merge_on_each_domain_with_its_own_effects(tmp_path):
    """Each fine-tune's merge is scored on both domains: one row and one effect per domain (full_symmetry helps on one,
    hurts on the other); no unigram baseline (SmolLM2's tokens are not the task tokenizer's)."""
    paths = []
    for matching, shifts in (("none", (0.0, 0.0)), ("rotation", (0.0, 0.0)), ("full_symmetry", (-0.1, 0.2))):
        for method in ("simple", "fisher", "regmean"):
            paths.append(merged(tmp_path, method, matching, {"lm_debates": [b + shifts[0] for b in BASE],
                                                             "lm_plots": [b + 1 + shifts[1] for b in BASE]}))
    for name in ("lm_debates", "lm_plots"):
        paths.append(write(tmp_path / "eval" / "end" / f"{name}.json", {
            "method": "end_model", "matching": "none", "model": str(tmp_path / "models" / name),
            "results": [lm_result("lm_debates", [3.0] * 8), lm_result("lm_plots", [3.5] * 8)]}))
    rows = run_report("table_decoder_smollm2", paths, str(tmp_path / "table_decoder_smollm2.csv"))
    assert [r["test_set"] for r in rows] == ["lm_debates"] * 11 + ["lm_plots"] * 11
    full = {r["test_set"]: r for r in rows if r.get("matching") == "full_symmetry" and r["method"] == "simple"}
    assert full["lm_debates"]["ours_effect"] == "helps" and full["lm_plots"]["ours_effect"] == "hurts"
    same = [r for r in rows if r.get("matching") == "rotation"]
    assert all(r["effect"] == 0 and r["ours_effect"] == "no detectable change" for r in same)
    lines = [x for x in summary_lines(tmp_path, tmp_path) if x.startswith("Table D2")]
    assert [x.split(":")[0] for x in lines] == ["Table D2 (lm_debates)", "Table D2 (lm_plots)"]


def barrier(root: Path, matching: str, bump: float, per_block_noise: bool) -> str:
    """A decoder's loss path: every block's loss per token is the point's loss (plus, optionally, block noise)."""
    alphas = [0.0, 0.5, 1.0]
    rng = np.random.default_rng(len(matching))
    points = []
    for alpha in alphas:
        level = 4.0 + (bump if alpha == 0.5 else 0.0)
        per_token = [level + (rng.normal(0, 0.3) if per_block_noise else 0.0) for _ in TOKENS]
        result = lm_result("lm_english", per_token)
        points.append({"alpha": alpha, "loss": result["metrics"]["loss"], "per_example": result["per_example"]})
    losses = [p["loss"] for p in points]
    source = root / "models" / "seed1" if matching == "none" else root / "matched" / "seed1-onto-seed0" / matching
    return write(root / "barrier" / f"{matching}.json", {
        "task": "lm_english", "examples": None, "matching": matching, "source": str(source),
        "anchor": str(root / "models" / "seed0"), "barrier": max(losses) - min(losses),
        "barrier_linear": losses[1] - (losses[0] + losses[2]) / 2, "path": points})


def test_figure_d_gives_both_barriers_and_token_weighted_change_intervals(tmp_path):
    """With the same loss per token in every block the barrier is the same on every resample of blocks, so the
    change's interval collapses to the change itself: true of the token-weighted mean only (the blocks differ in
    length), which is what a causal LM's loss is."""
    paths = [barrier(tmp_path, "none", 1.0, False), barrier(tmp_path, "rotation", 1.3, False),
             barrier(tmp_path, "full_symmetry", 0.4, True)]
    rows = run_report("figD_decoder_barrier", paths, str(tmp_path / "figD_decoder_barrier.png"))
    rotation = next(r for r in rows if r["matching"] == "rotation")
    assert rotation["barrier_change"] == pytest.approx(0.3)
    assert rotation["change_low"] == pytest.approx(0.3) and rotation["change_high"] == pytest.approx(0.3)
    assert rotation["change_verdict"] == "hurts"
    full = next(r for r in rows if r["matching"] == "full_symmetry")
    assert full["change_low"] < full["barrier_change"] < full["change_high"]
    assert (tmp_path / "figD_decoder_barrier.pdf").is_file()
    with open(tmp_path / "figD_decoder_barrier.csv") as handle:
        assert {"barrier", "barrier_linear", "change_low", "change_high"} <= set(next(csv.reader(handle)))
    (line,) = [x for x in summary_lines(tmp_path, tmp_path) if x.startswith("Figure D")]
    assert "rotation 1.300 (above line 1.300; 1 pair), change +0.300 [+0.300, +0.300] hurts" in line


def test_an_on_demand_table_is_named_with_its_command_and_not_missed_by_compare(tmp_path):
    results = tmp_path / "results" / "mini"
    results.mkdir(parents=True)
    section = table_section(results, experiment("table_decoder_smollm2"))
    assert "Not produced in this profile" not in section
    assert f"snakemake --cores 2 {results}/table_decoder_smollm2.csv --config profile=mini" in section
    reference = tmp_path / "reference"
    reference.mkdir()
    (reference / "table_decoder_smollm2.csv").write_text("test_set,loss\nlm_debates,3.0\n")
    (reference / "table_decoder.csv").write_text("test_set,loss\nlm_english,5.0\n")
    problems, _ = compare_run(results, tmp_path, reference, tmp_path, 0.5)
    assert problems == ["table_decoder.csv: missing from the run "
                        f"({results / 'table_decoder.csv'}); the reference has it"]
