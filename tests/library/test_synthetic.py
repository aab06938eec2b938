"""The data-free refinement (matching/synthetic.py, matching.refine=synthetic): its images are smooth, standardised
and the same on every read, its text is what the end models write (alternately, seeded); it needs no data, distils
only, keeps the source's function, undoes a planted transform, runs on folders, and a model that reads no images and
writes no text, or a distillation weight other than 1, is refused with one error line."""
import dataclasses

import pytest
import torch

import symfusion
from symfusion.arch import layout_of
from symfusion.errors import SymfusionError
from symfusion.matching import MatchConfig, match_models, matching_config
from symfusion.matching.synthetic import CALL, SyntheticBatches, box_width, sampled_text
from symfusion.measures import distance
from symfusion.symmetry import apply_transform
from test_residual_matching import planted
from test_residual_symmetry import build, relative_change

FEW = dataclasses.replace(matching_config("full_symmetry_synthetic"), refine_steps=20)


def test_the_images_are_smooth_standardised_and_the_same_on_every_read():
    model = build("enc", "vit", {})
    config = model.config
    batches = SyntheticBatches(model, (None, None), 5)
    first = batches[0]
    assert batches.kind == "images" and len(batches) == 5 and len(batches[1:4]) == 3
    assert torch.equal(first["pixel_values"], batches[0]["pixel_values"])
    assert torch.equal(first["pixel_values"], batches[:1][0]["pixel_values"])
    assert torch.equal(first["labels"], batches[-5]["labels"])
    assert not torch.equal(first["pixel_values"], batches[1]["pixel_values"])
    x = first["pixel_values"]                                          # (batch, channels, height, width)
    assert x.shape == (64, config.num_channels, config.image_size, config.image_size)
    assert x.mean((2, 3)).abs().max() < 1e-5 and (x.pow(2).mean((2, 3)) - 1).abs().max() < 1e-5
    neighbours = (x[..., 1:] * x[..., :-1]).mean() / x.pow(2).mean()  # neighbouring pixels' correlation
    assert neighbours > 0.5                                             # white noise: ~0
    assert 0 <= first["labels"].min() and first["labels"].max() < config.num_labels
    with pytest.raises(IndexError):
        batches[5]
    assert [box_width(s) for s in (28, 32, 224)] == [13, 15, 105]


def test_the_text_is_written_by_the_anchor_and_the_source_in_turn_a_call_of_batches_at_a_time():
    anchor, source = (build("dec", "llama", {"num_key_value_heads": 2}, seed=s, dtype=torch.float32) for s in (1, 2))
    count = 2 * CALL + 3                                   # anchor: a full call and 2 batches; source: one and 1
    batches = SyntheticBatches(source, (anchor.state_dict(), source.state_dict()), count, seed=3)
    assert batches.kind == "text"
    length = min(128, anchor.config.max_position_embeddings - 1)
    last = batches[count - 1]["input_ids"]                 # read out of order: the anchor's second call, written first
    ids = [batches[i]["input_ids"] for i in range(count)]
    assert all(x.shape == (8, length) and torch.equal(batches[i]["labels"], x) for i, x in enumerate(ids))
    assert torch.equal(last, ids[-1])
    seed = 3 * 1_000_003                                   # call c of writer w: seed + 2 c + w
    anchor_text = torch.cat([sampled_text(anchor, 8 * CALL, length, seed), sampled_text(anchor, 16, length, seed + 2)])
    source_text = torch.cat([sampled_text(source, 8 * CALL, length, seed + 1),
                             sampled_text(source, 8, length, seed + 3)])
    assert torch.equal(torch.cat(ids[0::2]), anchor_text) and torch.equal(torch.cat(ids[1::2]), source_text)
    assert not torch.equal(ids[0], ids[2])                  # rows of one call are samples of their own
    assert not torch.equal(source_text[:8 * CALL], sampled_text(anchor, 8 * CALL, length, seed + 1))
    again = SyntheticBatches(source, (anchor.state_dict(), source.state_dict()), count, seed=3)
    assert all(torch.equal(again[i]["input_ids"], x) for i, x in enumerate(ids))
    generator_state = torch.random.get_rng_state()                     # the caller's generator left alone
    SyntheticBatches(source, (anchor.state_dict(), source.state_dict()), 1, seed=4)[0]
    assert torch.equal(torch.random.get_rng_state(), generator_state)


def test_k_end_models_write_the_text_in_turn():
    # align_many's k models: batch i written by model i mod k (a pair: the anchor's even, the source's odd batches)
    models = [build("dec", "llama", {"num_key_value_heads": 2}, seed=s, dtype=torch.float32) for s in (1, 2, 3)]
    batches = SyntheticBatches(models[0], [m.state_dict() for m in models], 5, seed=3)
    length = min(128, models[0].config.max_position_embeddings - 1)
    ids = [batches[i]["input_ids"] for i in range(5)]
    seed = 3 * 1_000_003                                   # call c of writer w: seed + k c + w
    assert torch.equal(torch.cat([ids[0], ids[3]]), sampled_text(models[0], 16, length, seed))
    assert torch.equal(torch.cat([ids[1], ids[4]]), sampled_text(models[1], 16, length, seed + 1))
    assert torch.equal(ids[2], sampled_text(models[2], 8, length, seed + 2))


def test_a_model_that_reads_no_images_and_writes_no_text_is_refused_with_one_line_and_nothing_written(tmp_path):
    model = build("enc", "bert", {})
    with pytest.raises(SymfusionError, match="cannot write"):
        SyntheticBatches(model, (None, None), 3)
    with pytest.raises(SymfusionError, match="cannot write"):
        symfusion.align(model, build("enc", "bert", {}, seed=2), matching=FEW)
    model.save_pretrained(tmp_path / "anchor")
    build("enc", "bert", {}, seed=2).save_pretrained(tmp_path / "source")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(SymfusionError, match="cannot write"):
        symfusion.align(tmp_path / "source", tmp_path / "anchor", matching=FEW, output=tmp_path / "out")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("distill", [0.0, 0.5])
def test_a_distillation_weight_other_than_one_is_refused(distill):
    with pytest.raises(SymfusionError, match="refine_distill"):
        MatchConfig(residual="auto", refine="synthetic", refine_distill=distill)
    assert MatchConfig(residual="auto", refine="synthetic", refine_distill=1.0).refine_settings().distill == 1.0
    config = matching_config("full_symmetry_synthetic")
    assert config.refine_distill is None and config.refine_settings().distill == 1.0
    assert not config.needs_data and config.runs_models


@pytest.mark.parametrize("kind,family,overrides,inputs", [("enc", "vit", {}, "images"),
                                                          ("dec", "llama", {"num_key_value_heads": 2}, "text")],
                         ids=["vit", "llama"])
def test_it_needs_no_data_lowers_its_objective_and_keeps_the_function(kind, family, overrides, inputs):
    anchor, source = build(kind, family, overrides, seed=1), build(kind, family, overrides, seed=2)
    matched, report = symfusion.align(source, anchor, matching=FEW)
    refine = report["residual"]["refine"]
    assert refine["inputs"].startswith(f"synthetic {inputs}") and refine["distill"] == 1.0 and refine["batches"] == 20
    assert refine["kept"] == "refined" and refine["midpoint_loss_after"] < refine["midpoint_loss_before"]
    assert relative_change(source, report["transform"]) < 1e-9
    again = symfusion.align(source, anchor, matching=FEW)[1]["transform"]
    assert torch.equal(again.residual.r, report["transform"].residual.r)
    with pytest.raises(SymfusionError, match="refine=synthetic runs the models"):
        state = source.state_dict()
        match_models(state, anchor.state_dict(), layout_of(source.config, state), FEW)


def test_a_planted_transform_is_undone():
    """At the planted element the path is the anchor at every point, so the objective is at its least: the
    refinement cannot lower it and the descent's exact answer is kept."""
    model = build("enc", "vit", {})
    anchor, source_state, layout = planted(model, "orthogonal")
    source = build("enc", "vit", {})
    source.load_state_dict(source_state)
    _, report = symfusion.align(source, model, matching=FEW)
    assert report["residual"]["refine"]["kept"] == "descent"
    moved = apply_transform(source_state, layout, report["transform"])
    assert distance(moved, anchor)["total"] < 1e-8 * distance(source_state, anchor)["total"]


def test_it_runs_on_folders_and_says_so_in_match_json(tmp_path):
    anchor, source = build("enc", "vit", {}, seed=1), build("enc", "vit", {}, seed=2)
    anchor.save_pretrained(tmp_path / "anchor")
    source.save_pretrained(tmp_path / "source")
    out, report = symfusion.align(tmp_path / "source", tmp_path / "anchor", matching=FEW, output=tmp_path / "out")
    assert (out / "match.json").is_file() and report["residual"]["refine"]["inputs"].startswith("synthetic")
    assert report["data"] is None
