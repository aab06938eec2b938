"""benchmarks/bench_decoder_oracle.py: its variants parse to the matching configs they name (mistakes refused before any
computation), the oracle's data may come from the test split only inside the benchmark, and a path it scores runs from
the matched source's function to the anchor's, untied where the preset unties."""
import pytest
import torch

from benchmark_scripts import load_benchmark
from symfusion.errors import SymfusionError
from symfusion.io.untie import is_tied
from symfusion.pipeline.tasks.base import statistics_split
from symfusion.pipeline.tasks.lm_models import evaluate_causal_lm
from tiny_decoders import tiny_decoder

bench = load_benchmark("bench_decoder_oracle")


def test_variants_parse_to_their_presets_with_the_settings_given():
    assert bench.parse_variant("none") == (None, "train", 200)
    config, split, batches = bench.parse_variant("full_symmetry_untie_learned:split=test,refine_steps=1000")
    assert (config.untie, config.refine, config.refine_steps, split, batches) == (True, "loss", 1000, "test", 200)
    config, split, batches = bench.parse_variant("full_symmetry_learned:refine_group=general,refine_lr=0.05,batches=16")
    assert (config.untie, config.refine_group, config.refine_lr, batches) == (False, "general", 0.05, 16)
    assert bench.parse_variant("full_symmetry_untie")[0].refine == "none"


@pytest.mark.parametrize("variant", ["none:refine_steps=2", "full_symmetry:split=test", "full_symmetry_learned:steps=9",
                                     "full_symmetry_learned:split=holdout", "full_symmetry_learned:refine_steps",
                                     "full_symmetry_learned:refine_group=affine"])
def test_a_mistaken_variant_is_refused_with_one_line(variant):
    with pytest.raises(SystemExit, match="variant"):
        bench.parse_variant(variant)


def test_the_test_split_is_readable_only_inside_the_oracle_block():
    with bench.readable_test_split():
        assert statistics_split("test") == "test"
    with pytest.raises(SymfusionError, match="test"):
        statistics_split("test")


def blocks_and_evaluate(tied: list):
    """Random blocks, and an evaluation that records whether each model it scores ties its lm_head."""
    blocks = torch.randint(0, 97, (6, 12), generator=torch.Generator().manual_seed(0))

    def evaluate(model):
        tied.append(is_tied(model))
        return evaluate_causal_lm(model, blocks, batch_size=3)
    return blocks, evaluate


@pytest.mark.parametrize("variant", ["none", "full_symmetry", "full_symmetry_untie",
                                     "full_symmetry_untie_learned:refine_steps=3"])
def test_a_scored_path_runs_from_the_source_s_function_to_the_anchor_s(variant):
    source, anchor = tiny_decoder("llama", seed=0, tie_word_embeddings=True), \
        tiny_decoder("llama", seed=1, tie_word_embeddings=True)
    tied = []
    blocks, evaluate = blocks_and_evaluate(tied)
    ends = [evaluate(m)["loss"] for m in (source, anchor)]
    tied.clear()
    config, _, _ = bench.parse_variant(variant)
    data = [{"input_ids": blocks[i:i + 3], "labels": blocks[i:i + 3]} for i in (0, 3)] if config and config.needs_data \
        else None
    result, report = bench.scored_path(source, anchor, config, data, evaluate)
    losses = [p["loss"] for p in result["path"]]
    assert [p["alpha"] for p in result["path"]][0] == 0.0 and len(losses) == 11
    assert losses[0] == pytest.approx(ends[0], rel=1e-4) and losses[-1] == pytest.approx(ends[1], rel=1e-4)
    assert result["barrier"] == pytest.approx(max(losses) - min(losses))
    assert is_tied(anchor) and "transform" not in report             # the caller's anchor left tied
    untie = variant.startswith("full_symmetry_untie")
    assert tied == [not untie] * 11                                 # an untied source's path: between untied models
    assert report.get("matching_config", {}).get("untie", False) is untie and report["match_cpu_seconds"] >= 0
