"""The learned k-way refinement (matching/universe_learned.py) through align_many(matching=..., data=...): every
refined model computes its source's function (float64), the centroid's loss on the training batches does not rise
from the data-free universe (and falls here), one seed gives the same bits, folders come out as k standard folders,
and bad arguments or data are one SymfusionError line with nothing written."""
import copy
import dataclasses
import json

import pytest
import torch
import transformers as tf

import symfusion
from symfusion.arch import layout_of
from symfusion.errors import SymfusionError
from symfusion.matching import matching_config
from symfusion.symmetry import apply_transform
from test_residual_matching import vit_batches
from test_residual_symmetry import build, relative_change
from tiny_models import randomize

STEPS = 30
# the task loss alone (no distillation), so the centroid's loss is what the refinement lowers
LEARNED = dataclasses.replace(matching_config("full_symmetry_learned"), refine_steps=STEPS, refine_lr=0.01, refine_distill=0.0,
                              refine_minimax=())
FAMILIES = [("enc", "vit", {}), ("dec", "llama", {"num_key_value_heads": 2})]


def batches(model, family: str) -> list[dict]:
    if family == "vit":
        return [{k: v.float() if v.is_floating_point() else v for k, v in b.items()} for b in vit_batches(model)]
    gen = torch.Generator().manual_seed(0)
    return [{"input_ids": (ids := torch.randint(0, model.config.vocab_size, (4, 12), generator=gen)), "labels": ids}
            for _ in range(3)]


def centroid_loss(models, states, data) -> float:
    """The task loss of the equal-weight mixture of `states`, mean over `data` (float64)."""
    work = copy.deepcopy(models[0]).double().eval()
    work.load_state_dict({k: sum(s[k].double() for s in states) / len(states) if v.is_floating_point() else v
                          for k, v in states[0].items()})
    with torch.no_grad():
        return sum(work(**{k: v.double() if v.is_floating_point() else v for k, v in b.items()}).loss.item()
                   for b in data) / len(data)


def assert_each_keeps_its_function(kind, family, overrides, models, aligned, report) -> None:
    """Every aligned model is its source moved by its transform, which keeps the source's function in float64."""
    layout = layout_of(models[0].config, models[0].state_dict())
    for model, moved, transform in zip(models, aligned, report["transforms"]):
        expected = apply_transform(model.state_dict(), layout, transform)
        assert all(torch.equal(expected[k].to(v.dtype), v) for k, v in moved.state_dict().items())
        wide = build(kind, family, overrides, dtype=torch.float64, seed=1)
        wide.load_state_dict({k: v.double() if v.is_floating_point() else v for k, v in model.state_dict().items()})
        assert relative_change(wide, transform) < 1e-9
    assert all(c["relative_output_change_float64"] <= c["tolerance_float64"] for c in report["checks"])


@pytest.mark.parametrize("kind,family,overrides", FAMILIES, ids=["vit", "llama-gqa"])
def test_the_refined_models_keep_their_functions_and_the_centroid_loss_falls(kind, family, overrides):
    models = [build(kind, family, overrides, dtype=torch.float32, seed=s) for s in (1, 2, 3)]
    data = batches(models[0], family)
    start, _ = symfusion.align_many(models, max_rounds=1)
    aligned, report = symfusion.align_many(models, matching=LEARNED, data=data, max_rounds=1)
    refine = report["refine"]
    assert refine["kept"] == "refined" and refine["steps"] == STEPS and refine["batches"] == len(data) and refine["inputs"] == "data"
    assert refine["centroid_loss_after"] < refine["centroid_loss_before"]
    # measured independently, in float64, on the training batches: the learned centroid is no worse than the start's
    before = centroid_loss(models, [m.state_dict() for m in start], data)
    after = centroid_loss(models, [m.state_dict() for m in aligned], data)
    assert after < before, (before, after)
    assert_each_keeps_its_function(kind, family, overrides, models, aligned, report)
    # the unfolding gains were learned
    assert all(any(not torch.equal(g, torch.ones_like(g)) for g in t.residual.gains.values())
               for t in report["transforms"])


def test_the_same_seed_gives_the_same_bits():
    models = [build("enc", "vit", {}, dtype=torch.float32, seed=s) for s in (4, 5, 6)]
    data = batches(models[0], "vit")
    one, two = (symfusion.align_many(models, matching=LEARNED, data=data, max_rounds=1)[0] for _ in range(2))
    assert all(torch.equal(x.state_dict()[k], v) for a, b in zip(one, two) for x, y in [(a, b)]
               for k, v in y.state_dict().items())
    other = symfusion.align_many(models, matching=dataclasses.replace(LEARNED, refine_lr=0.02), data=data,
                                 max_rounds=1)[0]
    assert not all(torch.equal(x.state_dict()[k], v) for x, y in zip(one, other) for k, v in y.state_dict().items())


def test_folders_in_k_standard_folders_out(tmp_path):
    vit = dict(image_size=8, patch_size=4, num_channels=1, num_labels=10, hidden_size=16, num_hidden_layers=1,
               num_attention_heads=2, intermediate_size=24)
    paths = []
    for seed in range(3):
        paths.append(tmp_path / f"vit_{seed}")
        randomize(tf.ViTForImageClassification(tf.ViTConfig(**vit)), seed).save_pretrained(str(paths[-1]))
    model = tf.ViTForImageClassification.from_pretrained(str(paths[0]))
    data = batches(model, "vit")
    written, report = symfusion.align_many([str(p) for p in paths], matching=LEARNED, data=data,
                                           output=tmp_path / "out", max_rounds=1)
    pixels = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    for source, folder in zip(paths, written):
        a, b = (tf.ViTForImageClassification.from_pretrained(str(f)).eval() for f in (source, folder))
        with torch.no_grad():
            before, after = a(pixel_values=pixels).logits, b(pixel_values=pixels).logits
        assert (after - before).abs().max() <= 1e-4 * before.abs().max()
    saved = json.loads((tmp_path / "out" / "many.json").read_text())
    assert saved["refine"]["kept"] == report["refine"]["kept"] and saved["refine"]["steps"] == STEPS


@pytest.mark.parametrize("kwargs,message", [
    ({"matching": "full_symmetry_learned"}, "give data="),
    ({"matching": LEARNED, "data": []}, "give data="),
    ({"matching": "full_symmetry", "data": "batches"}, "data must be a list of batches"),
    ({"matching": "full_symmetry", "data": ["x"]}, "data must be a list of batches"),
    ({"data": [{"pixel_values": torch.zeros(2, 3, 8, 8)}]}, "reads the weights only, no data"),
    ({"matching": dataclasses.replace(LEARNED, residual_solve="activations"), "data": [{}]}, "k-way start is data-free"),
    ({"matching": "full_symmetry_synthetic", "data": [{"pixel_values": torch.zeros(2, 3, 8, 8)}]},
     "runs the models on inputs it makes, no data"),
])
def test_bad_arguments_are_one_line(kwargs, message):
    models = [build("enc", "vit", {}, dtype=torch.float32, seed=s) for s in (1, 2)]
    with pytest.raises(SymfusionError) as error:
        symfusion.align_many(models, max_rounds=0, **kwargs)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_folders_with_bad_data_write_nothing(tmp_path):
    paths = []
    for seed in range(2):
        paths.append(tmp_path / f"vit_{seed}")
        randomize(tf.ViTForImageClassification(tf.ViTConfig(image_size=8, patch_size=4, num_channels=1, num_labels=3,
                                                            hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                                            intermediate_size=12)), seed).save_pretrained(str(paths[-1]))
    unlabelled = [{"pixel_values": torch.randn(2, 1, 8, 8)}]
    for data in (None, unlabelled):
        with pytest.raises(SymfusionError) as error:
            symfusion.align_many([str(p) for p in paths], matching=LEARNED, data=data, output=tmp_path / "out",
                                 max_rounds=0)
        assert "\n" not in str(error.value) and ("labels" in str(error.value) or "give data=" in str(error.value))
        assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["vit_0", "vit_1"]


SYNTHETIC = dataclasses.replace(matching_config("full_symmetry_synthetic"), refine_steps=30, refine_lr=0.05)
SYNTHETIC_STEPS = {"vit": 30, "llama": 12}     # the decoder's text is written by 3 models in turn: fewer steps


@pytest.mark.parametrize("kind,family,overrides", FAMILIES, ids=["vit", "llama-gqa"])
def test_the_synthetic_refinement_reads_no_data_and_keeps_every_function(kind, family, overrides):
    # full_symmetry_synthetic through align_many: the learned k-way refinement distilled on inputs it makes (smooth
    # noise, or text the k models write in turn); every model keeps its function in float64; one seed, one result
    models = [build(kind, family, overrides, dtype=torch.float32, seed=s) for s in (1, 2, 3)]
    steps = SYNTHETIC_STEPS[family]
    synthetic = dataclasses.replace(SYNTHETIC, refine_steps=steps)
    aligned, report = symfusion.align_many(models, matching=synthetic, max_rounds=1)
    refine = report["refine"]
    assert refine["steps"] == steps and refine["batches"] == steps and refine["distill"] == 1.0
    assert refine["inputs"] == f"synthetic {'images' if family == 'vit' else 'text'} (matching/synthetic.py)"
    assert refine["kept"] in ("refined", "universe")
    assert_each_keeps_its_function(kind, family, overrides, models, aligned, report)
    again, _ = symfusion.align_many(models, matching=synthetic, max_rounds=1)
    assert all(torch.equal(a.state_dict()[k], v) for a, b in zip(again, aligned) for k, v in b.state_dict().items())
    if kind == "enc":        # the refinement moved the maps: not the data-free universe's models
        start, _ = symfusion.align_many(models, max_rounds=1)
        assert refine["kept"] == "refined"
        assert not all(torch.equal(a.state_dict()[k], v) for a, b in zip(start, aligned)
                       for k, v in b.state_dict().items())


def test_an_encoder_classifier_is_refused_the_synthetic_refinement_in_one_line(tmp_path):
    models = [build("enc", "bert", {}, dtype=torch.float32, seed=s) for s in (1, 2)]
    with pytest.raises(SymfusionError, match="cannot write") as error:
        symfusion.align_many(models, matching=SYNTHETIC)
    assert "\n" not in str(error.value)
    for i, model in enumerate(models):
        model.save_pretrained(tmp_path / f"bert_{i}")
    with pytest.raises(SymfusionError, match="cannot write"):
        symfusion.align_many([tmp_path / "bert_0", tmp_path / "bert_1"], matching=SYNTHETIC, output=tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert_0", "bert_1"]
