"""Whole-group matching does not depend on the weights' last bits: a float32-rounding perturbation of a trained
source leaves the found transform's discrete part (head, FFN and residual permutations) and its residual map
in place, and the descent stops at a fixed point (issue 33)."""
import pytest
import torch
import transformers as tf

from symfusion.arch import layout_of
from symfusion.matching import continuous as continuous_module
from symfusion.matching import descent as descent_module
from symfusion.matching import match_models
from symfusion.matching.descent import discrete_parts
from symfusion.matching.pairs import StatePair
from symfusion.matching.residual import residual_group
from symfusion.matching.starts import regularised_polar, untouched_cross
from symfusion.stream import centred_basis, fold_norms, stream_layout
from test_residual_matching import planted


def trained_vit(seed: int, steps: int = 60) -> torch.nn.Module:
    """A tiny ViT trained on a fixed synthetic task (8x8 grey images, 3 classes by a fixed linear rule) from its
    own seed. Hidden 48 exceeds what its untouched tensors span (16 pixels, 5 positions, a few biases, 3 classes)."""
    config = tf.ViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=48, num_hidden_layers=2,
                          num_attention_heads=4, intermediate_size=64, num_labels=3)
    torch.manual_seed(seed)
    model = tf.ViTForImageClassification(config)
    data = torch.Generator().manual_seed(0)
    rule = torch.randn(64, 3, generator=data)
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        images = torch.randn(32, 1, 8, 8, generator=data)
        loss = model(pixel_values=images, labels=(images.flatten(1) @ rule).argmax(1)).loss
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return model.eval()


def perturbed(state: dict, seed: int) -> dict:
    """Every weight times (1 + 1e-7 N(0, 1)): the size of float32 rounding."""
    gen = torch.Generator().manual_seed(seed)
    return {k: v * (1 + 1e-7 * torch.randn(v.shape, generator=gen)) if v.is_floating_point() else v
            for k, v in state.items()}


@pytest.fixture(scope="module")
def models():
    return trained_vit(0), trained_vit(1)


@pytest.fixture(scope="module")
def pair(models):
    anchor, source = models
    return ({k: v.detach().clone() for k, v in source.state_dict().items()},
            {k: v.detach().clone() for k, v in anchor.state_dict().items()}, layout_of(anchor.config, anchor.state_dict()))


def test_the_untouched_tensors_leave_the_first_map_undetermined_and_the_start_damps_it(pair):
    source, anchor, layout = pair
    stream = stream_layout(layout, source)
    fs, fa = (fold_norms(layout.canonical(s), stream.folds) for s in (source, anchor))
    m, _ = untouched_cross(StatePair(fs, fa, layout, stream))
    basis = centred_basis(stream.hidden)
    singular = torch.linalg.svdvals(basis.T @ m @ basis)
    assert singular[-1] < 1e-12 * singular[0]                  # rank deficient: U V^T is not determined there
    start = regularised_polar(m, residual_group(stream, "auto", layout.family))
    moved = regularised_polar(untouched_cross(StatePair(*(fold_norms(layout.canonical(perturbed(s, 1)), stream.folds)
                                                          for s in (source, anchor)), layout, stream))[0],
                              residual_group(stream, "auto", layout.family))
    assert (start - moved).abs().max() < 1e-4                  # continuous in the input


def test_a_float32_rounding_of_the_source_keeps_the_discrete_part_and_the_map(pair):
    """(The descent from the exact polar factor of the untouched cross product, run to a fixed point, found a
    different discrete part and a residual map 0.5-0.6 away for each of three such roundings of this pair.)"""
    source, anchor, layout = pair
    found = [match_models(s, anchor, layout, "full_symmetry") for s in (source, perturbed(source, 1))]
    reference = found[0]
    assert reference.residual["converged"] and reference.residual["chosen"] == "descent"
    for result in found[1:]:
        assert discrete_parts(result.transform.layers) == discrete_parts(reference.transform.layers)
        assert (result.transform.residual.r - reference.transform.residual.r).abs().max() < 1e-4
        assert result.residual["folded_distance"] == pytest.approx(reference.residual["folded_distance"], rel=1e-6)


def test_an_inner_loop_stopped_by_its_cap_is_no_fixed_point(models, monkeypatch):
    """An inner loop stopped by its step cap is no fixed point even where the next block solve changes nothing: the
    descent goes on from its R until a loop reaches its fixed point (planted: the same optimum as uncapped), and
    says converged: false when its own cap stops it first. (It stopped, saying converged, after one capped loop.)"""
    anchor, moved, layout = planted(models[0], "orthogonal", seed=1)
    gen = torch.Generator().manual_seed(3)
    source = {k: v + 1e-3 * v.std() * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
              for k, v in moved.items()}
    free = match_models(source, anchor, layout, "full_symmetry")
    assert free.residual["converged"] and free.residual["starts"][0]["inner_steps"][0] >= 3
    monkeypatch.setattr(continuous_module, "MAX_INNER", 1)
    capped = match_models(source, anchor, layout, "full_symmetry")
    steps = capped.residual["starts"][0]["inner_steps"]
    assert capped.residual["converged"] and steps[-1] == 0 and len(steps) >= 3       # loops of one step, then none
    assert discrete_parts(capped.transform.layers) == discrete_parts(free.transform.layers)
    assert (capped.transform.residual.r - free.transform.residual.r).abs().max() < 1e-8
    monkeypatch.setattr(descent_module, "MAX_OUTER", 2)
    stopped = match_models(source, anchor, layout, "full_symmetry")
    assert stopped.residual["starts"][0]["inner_steps"] == [1, 1] and not stopped.residual["converged"]
