"""Matching undoes planted symmetries, never loses to permutation-only matching, and rescales optimally."""
from pathlib import Path

import numpy as np
import pytest
import torch

from symfusion.arch import layout_of
from symfusion.matching import MatchConfig, match_many, match_models, matching_config
from symfusion.matching.rescale import best_scales, rescale_objective
from symfusion.measures import distance
from symfusion.symmetry import apply_transform, random_transform
from symfusion.presets import PRESETS_DIR, preset_names
from symfusion.matching.compose import StageClock, match_attention_rotation
from symfusion.matching.permutation import max_assignment
from symfusion.matching.rotation import polar_factor, polar_factor_svd
from tiny_models import VARIANT_IDS, VARIANTS, tiny_model


def state_and_layout(family, seed, dtype=torch.float64, **overrides):
    model = tiny_model(family, seed=seed, dtype=dtype, **overrides)
    state = model.state_dict()
    return state, layout_of(model.config, state)


def noisy(state, seed, scale):
    gen = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=gen, dtype=v.dtype) if v.is_floating_point() else v
            for k, v in state.items()}


@pytest.mark.parametrize("family,overrides", VARIANTS, ids=VARIANT_IDS)
def test_matching_undoes_planted_symmetry(family, overrides):
    anchor, layout = state_and_layout(family, seed=0, **overrides)
    source = apply_transform(anchor, layout, random_transform(layout, seed=11))
    assert distance(source, anchor)["total"] > 1.0
    result = match_models(source, anchor, layout, "rotation")
    matched = apply_transform(source, layout, result.transform)
    assert distance(matched, anchor)["total"] < 1e-8


@pytest.mark.parametrize("family", ["bert", "vit"])
def test_matching_undoes_planted_symmetry_under_noise(family):
    anchor, layout = state_and_layout(family, seed=0)
    source = noisy(apply_transform(anchor, layout, random_transform(layout, seed=3)), seed=4, scale=1e-3)
    matched = apply_transform(source, layout, match_models(source, anchor, layout, "rotation").transform)
    noise_level = distance(noisy(anchor, seed=4, scale=1e-3), anchor)["total"]
    assert distance(matched, anchor)["total"] < 3 * noise_level


@pytest.mark.parametrize("family,overrides", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("seed", [1, 2])
def test_rotation_never_farther_than_permutation_only(family, overrides, seed):
    anchor, layout = state_and_layout(family, seed=0, **overrides)
    source, _ = state_and_layout(family, seed=seed + 10, **overrides)      # an unrelated model
    after = {}
    for name in ("none", "git_rebasin", "rotation_no_rescale", "rotation"):
        transform = match_models(source, anchor, layout, name).transform
        after[name] = distance(apply_transform(source, layout, transform), anchor, layout)
    for part in ("attention_qk", "attention_vo", "ffn", "total"):
        assert after["rotation"][part] <= after["rotation_no_rescale"][part] + 1e-9
        assert after["rotation_no_rescale"][part] <= after["git_rebasin"][part] + 1e-9
        assert after["git_rebasin"][part] <= after["none"][part] + 1e-9
    assert after["rotation_no_rescale"]["attention_qk"] < after["git_rebasin"]["attention_qk"] - 1e-6


def test_git_rebasin_undoes_planted_permutations():
    anchor, layout = state_and_layout("roberta", seed=0)
    planted = random_transform(layout, seed=5, scales=False)
    for t in planted.layers.values():          # head-coordinate permutations instead of rotations
        gen = torch.Generator().manual_seed(1)
        t.r_qk = torch.stack([torch.eye(layout.head_dim, dtype=torch.float64)[torch.randperm(layout.head_dim, generator=gen)]
                              for _ in range(layout.num_heads)])
        t.r_vo = t.r_qk.flip(0)
    source = apply_transform(anchor, layout, planted)
    matched = apply_transform(source, layout, match_models(source, anchor, layout, "git_rebasin").transform)
    assert distance(matched, anchor)["total"] < 1e-10


def test_ot_ffn_undoes_planted_ffn_permutation():
    anchor, layout = state_and_layout("bert", seed=0)
    source = apply_transform(anchor, layout, random_transform(layout, seed=6, rotation=False, scales=False))
    result = match_models(source, anchor, layout, "ot_ffn")
    matched = apply_transform(source, layout, result.transform)
    assert distance(matched, anchor)["total"] < 1e-10
    assert all(t.r_qk is None and t.r_vo is None for t in result.transform.layers.values())


@pytest.mark.parametrize("name,parts", [
    ("attn_only", {"r_qk", "a_qk", "r_vo", "a_vo"}),
    ("attn_only_no_rescale", {"r_qk", "r_vo"}),
    ("ffn_only", {"ffn_perm"}),
    ("rotation_no_rescale", {"r_qk", "r_vo", "ffn_perm"}),
    ("rotation", {"r_qk", "a_qk", "r_vo", "a_vo", "ffn_perm"}),
    ("none", set()),
])
def test_each_variant_sets_only_its_parts(name, parts):
    anchor, layout = state_and_layout("bert", seed=0)
    source, _ = state_and_layout("bert", seed=1)
    transform = match_models(source, anchor, layout, name).transform
    for t in transform.layers.values():
        present = {p for p in ("r_qk", "a_qk", "r_vo", "a_vo", "ffn_perm") if getattr(t, p) is not None}
        assert present == parts
    assert (len(transform.layers) == 0) == (not parts)


def test_layer_subsets():
    anchor, layout = state_and_layout("bert", seed=0, num_hidden_layers=4)
    source = apply_transform(anchor, layout, random_transform(layout, seed=2))
    assert sorted(match_models(source, anchor, layout, layers=[0, 2]).transform.layers) == [0, 2]
    assert sorted(match_models(source, anchor, layout, last_layers=3).transform.layers) == [1, 2, 3]
    assert match_models(source, anchor, layout, last_layers=0).transform.layers == {}


def test_many_models_onto_one_anchor():
    anchor, layout = state_and_layout("vit", seed=0)
    sources = [apply_transform(anchor, layout, random_transform(layout, seed=s)) for s in (1, 2, 3)]
    for source, result in zip(sources, match_many(sources, anchor, layout, "rotation")):
        assert distance(apply_transform(source, layout, result.transform), anchor)["total"] < 1e-8


@pytest.mark.parametrize("seed", range(20))
def test_rescale_root_minimises_objective_on_dense_grid(seed):
    rng = np.random.default_rng(seed)
    A, D = rng.uniform(0.1, 5, 3), rng.uniform(0.1, 5, 3)
    B, E = rng.normal(0, 2, 3), rng.normal(0, 2, 3)
    a = best_scales(A, B, D, E).numpy()
    grid = np.concatenate([-np.logspace(-3, 3, 200001)[::-1], np.logspace(-3, 3, 200001)])
    for h in range(3):
        grid_min = rescale_objective(grid, A[h], B[h], D[h], E[h]).min()
        assert rescale_objective(a[h], A[h], B[h], D[h], E[h]) <= grid_min + 1e-9 * max(1.0, abs(grid_min))


def test_rescale_falls_back_to_one_when_a_side_is_zero():
    a = best_scales(np.array([0.0, 1.0]), np.array([0.0, 1.0]), np.array([1.0, 0.0]), np.array([1.0, 0.0]))
    assert a.tolist() == [1.0, 1.0]


def test_registry_names_match_the_issue_and_each_has_a_config():
    names = {"none", "rotation", "rotation_no_rescale", "attn_only", "attn_only_no_rescale",
             "ffn_only", "git_rebasin", "ot_ffn", "rotation_joint", "rotation_heads", "full_symmetry",
             "full_symmetry_learned", "full_symmetry_learned_many", "full_symmetry_synthetic", "full_symmetry_untie",
             "full_symmetry_untie_learned", "full_permutation"}
    assert {p.stem for p in Path(PRESETS_DIR, "matching").glob("*.yaml")} == set(preset_names("matching")) == names
    assert all(isinstance(matching_config(name), MatchConfig) for name in names)


def test_polar_factor_matches_svd_and_handles_singular_heads():
    gen = torch.Generator().manual_seed(0)
    m = torch.randn(6, 8, 8, generator=gen, dtype=torch.float64)
    m[1] = torch.outer(torch.randn(8, generator=gen, dtype=torch.float64), torch.randn(8, generator=gen, dtype=torch.float64))
    m[2, :, 0] = 0.0                       # rank deficient
    m[3] = torch.diag(torch.logspace(0, -7, 8, dtype=torch.float64))   # ill-conditioned
    r = polar_factor(m)
    eye = torch.eye(8, dtype=torch.float64)
    assert torch.allclose(r.transpose(1, 2) @ r, eye.expand(6, 8, 8), atol=1e-9)
    for h in (0, 3, 4, 5):                 # unique polar factor: equals the SVD's
        assert torch.allclose(r[h], polar_factor_svd(m[h:h + 1])[0], atol=1e-8)
    # optimal for <R, M>: no better than the SVD optimum, equal up to rounding
    best = torch.linalg.svdvals(m).sum(dim=1)
    assert torch.allclose((r * m).sum(dim=(1, 2)), best, atol=1e-8)


def test_polar_factor_of_a_huge_nearly_rank_one_cross_is_orthogonal():
    """A cross product 1e150 times a rank-one matrix plus O(1) (what a norm gain of 1e10 folded into the maps gives
    a head): the eigh route's r has entries near 1e288, its r^T r inf - inf = NaN, which compares false with any
    tolerance; such a head must go to the SVD too (it did not: the descent then moved the model by NaN, refused as
    an overflow it was not)."""
    gen = torch.Generator().manual_seed(0)
    u, v = (torch.randn(3, *shape, generator=gen, dtype=torch.float64) for shape in ((4, 1), (1, 4)))
    m = 1e150 * (u @ v) + torch.randn(3, 4, 4, generator=gen, dtype=torch.float64)
    r = polar_factor(m)
    assert torch.allclose(r.transpose(1, 2) @ r, torch.eye(4, dtype=torch.float64).expand(3, 4, 4), atol=1e-9)
    assert torch.allclose(r, polar_factor_svd(m))


@pytest.mark.parametrize("family,overrides", VARIANTS, ids=VARIANT_IDS)
def test_layers_batched_equal_layer_by_layer(family, overrides):
    """match_models solves every layer's heads in one batch and the FFN products in numpy; each layer
    must get exactly what the one-layer solvers (one torch product per FFN) give it."""

    def neuron_features(state, ffn):   # per-neuron rows [W_i | b_i | W_o^T], (ffn, 2*hidden + 1)
        return torch.cat([state[ffn.input.weight], state[ffn.input.bias][:, None], state[ffn.output.weight].T], 1)

    anchor, layout = state_and_layout(family, seed=0, **overrides)
    source, _ = state_and_layout(family, seed=1, **overrides)
    batched = match_models(source, anchor, layout, "rotation").transform
    for i, layer in enumerate(layout.layers):
        alone = match_attention_rotation(source, anchor, layer.attention, layout.num_heads, True, StageClock())
        for part in ("r_qk", "a_qk", "r_vo", "a_vo"):
            torch.testing.assert_close(getattr(batched.layers[i], part), getattr(alone, part), rtol=0, atol=1e-12)
        torch_cross = neuron_features(anchor, layer.ffn) @ neuron_features(source, layer.ffn).T
        assert torch.equal(batched.layers[i].ffn_perm, max_assignment(torch_cross))
