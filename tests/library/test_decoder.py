"""Decoder LLMs (Llama/Mistral, Qwen2, Qwen3, StableLM, GPT-2): which symmetries keep the logits, and matching.

RoPE pairs dims (i, i + rotary_dim/2) of each q/k head (Hugging Face's rotate_half); only one 2x2 rotation
per such plane commutes with every position, so these tests also show that a full orthogonal q/k map, a
reflection inside a plane and a rotation of the wrong pairing each change the logits.
"""
import lap
import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from symfusion.arch import layout_of
from symfusion.errors import SymfusionError
from symfusion.fusion.ot import merge_wts
from symfusion.matching import match_models, permutation
from symfusion.matching.multi import match_group
from symfusion.measures import distance, model_outputs, probe_inputs
from symfusion.symmetry import (
    LayerTransform,
    Transform,
    apply_transform,
    plane_rotations,
    random_orthogonal,
    random_qk_rotation,
    random_transform,
)
from tiny_decoders import DECODER_IDS, DECODERS, tiny_decoder

lapjv = lap.lapjv


def logits_change(model, state) -> float:
    """max |logits(model) - logits(model with `state`)| / max |logits(model)| on padded probe tokens."""
    copy = type(model)(model.config).to(next(model.parameters()).dtype)
    copy.load_state_dict(state)
    inputs = probe_inputs(model.config)
    reference = model_outputs(model, inputs)
    return ((model_outputs(copy.eval(), inputs) - reference).abs().max() / reference.abs().max()).item()


def model_and_layout(family, seed=0, dtype=torch.float64, **overrides):
    model = tiny_decoder(family, seed=seed, dtype=dtype, **overrides)
    return model, model.state_dict(), layout_of(model.config, model.state_dict())


@pytest.mark.parametrize("family,overrides", DECODERS, ids=DECODER_IDS)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_decoder_symmetry_keeps_logits(family, overrides, dtype, tol):
    model, state, layout = model_and_layout(family, seed=1, dtype=dtype, **overrides)
    transform = random_transform(layout, seed=7)      # head perms, RoPE-plane rotations, V/O rotations, scales, FFN perms
    assert all(t.head_perm is not None for t in transform.layers.values())
    moved = apply_transform(state, layout, transform)
    assert logits_change(model, moved) <= tol
    changed = [k for k in state if not torch.equal(moved[k], state[k])]
    assert len(changed) >= (4 if family == "gpt2" else 7) * layout.num_layers


def test_layouts_know_groups_rotary_dims_and_gates():
    _, _, gqa = model_and_layout("llama", num_key_value_heads=2)
    assert (gqa.num_heads, gqa.kv_heads, gqa.head_dim, gqa.rotary_dim) == (4, 2, 16, 16)
    assert gqa.layers[0].attention.group == 2 and gqa.layers[0].ffn.gate is not None
    _, _, partial = model_and_layout("stablelm", num_key_value_heads=4, partial_rotary_factor=0.25)
    assert (partial.rotary_dim, partial.layers[0].attention.qk_group) == (4, "rope")
    _, _, gpt = model_and_layout("gpt2")
    assert (gpt.rotary_dim, gpt.layers[0].attention.qk_group, gpt.kv_heads) == (0, "orthogonal", 4)
    _, _, mistral = model_and_layout("mistral", num_key_value_heads=2)
    assert mistral.family == "llama"


def test_gpt2_canonical_views_round_trip():
    _, state, layout = model_and_layout("gpt2")
    view = layout.canonical(state)
    assert "transformer.h.0.attn.c_attn.weight" not in view
    assert view["transformer.h.0.attn.c_attn.k.weight"].shape == (64, 64)
    back = layout.stored_form(view)
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)


# ---------------------------------------------------------------- each exact piece, and what is not exact

def gqa_llama():
    return model_and_layout("llama", seed=2, num_key_value_heads=2)


@pytest.mark.parametrize("piece", ["kv_groups", "query_heads_in_group", "qk_planes", "vo_orthogonal", "scales", "ffn"])
def test_each_exact_piece_keeps_logits(piece):
    model, state, layout = gqa_llama()
    gen = torch.Generator().manual_seed(0)
    t = LayerTransform()
    if piece == "kv_groups":
        t.head_perm = torch.tensor([2, 3, 0, 1])
    elif piece == "query_heads_in_group":
        t.head_perm = torch.tensor([1, 0, 3, 2])
    elif piece == "qk_planes":
        t.r_qk = random_qk_rotation(2, 16, 16, gen)
    elif piece == "vo_orthogonal":
        t.r_vo = random_orthogonal(2, 16, gen)
    elif piece == "scales":
        t.a_qk, t.a_vo = torch.tensor([0.5, 3.0], dtype=torch.float64), torch.tensor([2.0, 0.25], dtype=torch.float64)
    else:
        t.ffn_perm = torch.randperm(96, generator=gen)
    moved = apply_transform(state, layout, Transform({0: t, 1: t}))
    assert distance(moved, state)["total"] > 1.0
    assert logits_change(model, moved) < 1e-10


def test_scale_per_rope_plane_keeps_logits():
    """q times s_i and k divided by s_i on both dims of plane i (i, i + 8): exact, one scale per plane."""
    model, state, _ = gqa_llama()
    s = torch.linspace(0.3, 3.0, 8, dtype=torch.float64)
    per_dim = torch.cat([s, s])                                    # (16,): dim i and i + 8 share plane i
    moved = dict(state)
    for i in range(2):
        q, k = f"model.layers.{i}.self_attn.q_proj.weight", f"model.layers.{i}.self_attn.k_proj.weight"
        moved[q] = (state[q].reshape(4, 16, -1) * per_dim[:, None]).reshape(state[q].shape)
        moved[k] = (state[k].reshape(2, 16, -1) / per_dim[:, None]).reshape(state[k].shape)
    assert logits_change(model, moved) < 1e-10


@pytest.mark.parametrize("wrong", ["full_orthogonal", "reflection_in_plane", "adjacent_pairing", "split_kv_group"])
def test_inexact_maps_change_logits(wrong):
    """The restriction is needed: each of these maps of q/k (or heads) moves the logits."""
    model, state, layout = gqa_llama()
    gen = torch.Generator().manual_seed(1)
    t = LayerTransform()
    if wrong == "full_orthogonal":
        t.r_qk = random_orthogonal(2, 16, gen)
    elif wrong == "reflection_in_plane":                         # swap dims 0 and 8: det -1 inside plane 0
        t.r_qk = torch.eye(16, dtype=torch.float64)[[8] + list(range(1, 8)) + [0] + list(range(9, 16))].repeat(2, 1, 1)
    elif wrong == "adjacent_pairing":                            # rotations of (2i, 2i+1): GGUF/Meta's pairing
        angles = torch.rand(2, 8, generator=gen, dtype=torch.float64) * 6
        order = [j for i in range(8) for j in (i, i + 8)]        # rotate_half planes laid out as adjacent pairs
        r = plane_rotations(angles, 16, 16)
        t.r_qk = r[:, order][:, :, order]
    else:
        with pytest.raises(SymfusionError, match="KV group"):
            apply_transform(state, layout, Transform({0: LayerTransform(head_perm=torch.tensor([0, 2, 1, 3]))}))
        return
    moved = apply_transform(state, layout, Transform({0: t}))
    assert logits_change(model, moved) > 1e-3


# ---------------------------------------------------------------- matching

@pytest.mark.parametrize("family,overrides", DECODERS, ids=DECODER_IDS)
@pytest.mark.parametrize("name", ["rotation", "rotation_no_rescale", "rotation_joint"])
def test_matching_undoes_planted_symmetry(family, overrides, name):
    _, anchor, layout = model_and_layout(family, seed=0, **overrides)
    planted = random_transform(layout, seed=11, scales=name != "rotation_no_rescale")
    source = apply_transform(anchor, layout, planted)
    assert distance(source, anchor)["total"] > 10.0
    matched = apply_transform(source, layout, match_models(source, anchor, layout, name).transform)
    assert distance(matched, anchor)["total"] < 1e-8


@pytest.mark.parametrize("family,overrides", DECODERS, ids=DECODER_IDS)
def test_git_rebasin_undoes_planted_permutations(family, overrides):
    """Head permutations (KV groups and query heads within them), V/O coordinates, non-rotary q/k dims, FFN."""
    _, anchor, layout = model_and_layout(family, seed=0, **overrides)
    planted = random_transform(layout, seed=5, rotation=False, scales=False)
    gen = torch.Generator().manual_seed(1)
    d, r = layout.head_dim, layout.rotary_dim
    for t in planted.layers.values():
        t.r_vo = torch.stack([torch.eye(d, dtype=torch.float64)[torch.randperm(d, generator=gen)] for _ in range(layout.kv_heads)])
        if r < d:      # only non-rotary q/k dims may be permuted
            t.r_qk = torch.eye(d, dtype=torch.float64).repeat(layout.kv_heads, 1, 1)
            t.r_qk[:, r:, r:] = torch.eye(d - r, dtype=torch.float64)[torch.randperm(d - r, generator=gen)]
    source = apply_transform(anchor, layout, planted)
    result = match_models(source, anchor, layout, "git_rebasin")
    matched = apply_transform(source, layout, result.transform)
    assert distance(matched, anchor)["total"] < 1e-10


def test_kv_head_permutation_does_not_collapse_to_identity():
    """A planted permutation of whole KV groups is found as such (not the identity) and undone exactly."""
    _, anchor, layout = model_and_layout("llama", seed=0, num_attention_heads=8, num_key_value_heads=4)
    planted_perm = torch.tensor([6, 7, 2, 3, 0, 1, 4, 5])           # KV groups 3, 1, 0, 2
    planted = Transform({i: LayerTransform(head_perm=planted_perm) for i in range(layout.num_layers)})
    source = apply_transform(anchor, layout, planted)
    for name in ("git_rebasin", "rotation"):
        found = match_models(source, anchor, layout, name).transform
        for t in found.layers.values():
            assert t.head_perm is not None
            assert torch.equal(planted_perm[t.head_perm], torch.arange(8))     # found = planted^-1
        assert distance(apply_transform(source, layout, found), anchor)["total"] < 1e-10


@pytest.mark.parametrize("family,overrides", DECODERS, ids=DECODER_IDS)
def test_rotation_never_farther_than_permutation_only(family, overrides):
    _, anchor, layout = model_and_layout(family, seed=0, **overrides)
    _, source, _ = model_and_layout(family, seed=10, **overrides)      # an unrelated model
    after = {}
    for name in ("none", "git_rebasin", "rotation_no_rescale", "rotation"):
        transform = match_models(source, anchor, layout, name).transform
        after[name] = distance(apply_transform(source, layout, transform), anchor, layout)
    for d in after.values():     # one head permutation moves Q/K and V/O together: compare attention as a whole
        d["attention"] = (d["attention_qk"] ** 2 + d["attention_vo"] ** 2) ** 0.5
    for part in ("attention", "ffn", "total"):
        assert after["rotation"][part] <= after["rotation_no_rescale"][part] + 1e-9
        assert after["rotation_no_rescale"][part] <= after["git_rebasin"][part] + 1e-9
        assert after["git_rebasin"][part] <= after["none"][part] + 1e-9
    assert after["rotation_no_rescale"]["attention"] < after["git_rebasin"]["attention"] - 1e-6


def test_matched_decoder_computes_the_same_function():
    model, source, layout = model_and_layout("qwen2", seed=3, num_key_value_heads=2)
    _, anchor, _ = model_and_layout("qwen2", seed=4, num_key_value_heads=2)
    for name in ("rotation", "git_rebasin", "ffn_only", "attn_only"):
        matched = apply_transform(source, layout, match_models(source, anchor, layout, name).transform)
        assert distance(matched, anchor)["total"] < distance(source, anchor)["total"]
        assert logits_change(model, matched) < 1e-10


def test_qwen3_qk_norm_refuses_rotation_and_offers_exact_matching():
    model, anchor, layout = model_and_layout("qwen3", seed=0, num_key_value_heads=2)
    assert layout.layers[0].attention.qk_group == "none"
    for name in ("rotation", "attn_only", "rotation_joint"):
        with pytest.raises(SymfusionError, match=r"model\.layers\.0\.self_attn\.q_norm.*git_rebasin") as error:
            match_models(anchor, anchor, layout, name)
        assert "\n" not in str(error.value)
    planted = random_transform(layout, seed=2, scales=False)       # heads, V/O rotations, FFN; no q/k rotation
    assert all(t.r_qk is None for t in planted.layers.values())
    source = apply_transform(anchor, layout, planted)
    assert logits_change(model, source) < 1e-10
    # a q/k rotation is not exact with q_norm: it must not be offered
    bad = apply_transform(anchor, layout, Transform({0: LayerTransform(r_qk=random_qk_rotation(2, 16, 16, torch.Generator()))}))
    assert logits_change(model, bad) > 1e-3
    _, other, _ = model_and_layout("qwen3", seed=1, num_key_value_heads=2)
    for name in ("git_rebasin", "ffn_only"):
        matched = apply_transform(other, layout, match_models(other, anchor, layout, name).transform)
        assert distance(matched, anchor)["total"] < distance(other, anchor)["total"]
        assert logits_change(tiny_decoder("qwen3", seed=1, dtype=torch.float64, num_key_value_heads=2), matched) < 1e-10


def test_large_assignments_use_lapjv_and_agree_with_scipy(monkeypatch):
    """From LAPJV_MIN_SIZE on, the FFN assignment goes to lap's solver; it must find scipy's optimum."""
    rng = np.random.default_rng(0)
    cross = rng.standard_normal((300, 300)).astype(np.float32)
    assert np.unique(cross.argmax(1)).size < 300                         # the greedy shortcut does not apply
    scipy_value = cross[linear_sum_assignment(cross, maximize=True)].sum(dtype=np.float64)
    calls = []
    monkeypatch.setattr(permutation, "LAPJV_MIN_SIZE", 256)
    monkeypatch.setattr(permutation.lap, "lapjv", lambda *a, **k: calls.append(1) or lapjv(*a, **k))
    perm = permutation.max_assignment(cross).numpy()
    assert calls == [1]
    assert sorted(perm) == list(range(300))
    assert cross[np.arange(300), perm].sum(dtype=np.float64) == pytest.approx(scipy_value, rel=1e-12)


def test_encoder_only_code_refuses_decoders_with_one_line():
    model, state, layout = model_and_layout("llama", num_key_value_heads=2)
    with pytest.raises(SymfusionError, match="barycentric group matching supports the encoder families.*not llama"):
        match_group([state, state, state], layout, "rotation", method="barycenter")
    assert len(match_group([state, state], layout, "rotation", method="anchor").transforms) == 2
    with pytest.raises(SymfusionError, match="OT fusion supports the encoder families"):
        merge_wts([model, model])
