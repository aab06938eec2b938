"""Maps of the residual stream: a permutation (every family), a signed permutation (RMSNorm), an orthogonal map
after folding the norms (pre-norm families), and head permutations of encoders keep the function; the maps that
are not symmetries are shown to break it."""
import types

import pytest
import torch

from symfusion.arch import layout_of
from symfusion.measures import model_outputs, probe_inputs
from symfusion.stream import centred_map, fold_norms, stream_layout
from symfusion.symmetry import ResidualMap, Transform, apply_transform, random_orthogonal, random_residual, random_transform
from tiny_decoders import DECODER_IDS, DECODERS, tiny_decoder
from tiny_models import VARIANT_IDS, VARIANTS, tiny_model

MODELS = [("enc", f, o) for f, o in VARIANTS] + [("dec", f, o) for f, o in DECODERS] + [
    ("dec", "gpt2", {"tie_word_embeddings": False}), ("dec", "llama", {"num_key_value_heads": 2, "tie_word_embeddings": True}),
    ("dec", "qwen3", {"num_key_value_heads": 2})]
MODEL_IDS = VARIANT_IDS + DECODER_IDS + ["gpt2-untied", "llama-tied", "qwen3"]
PRE_NORM = [(k, f, o) for k, f, o in MODELS if f not in ("bert", "roberta", "deberta-v2")]


def _rms_norm_in_own_dtype(self, hidden_states):
    """transformers' RMSNorms normalise in float32 even in a float64 model (~1e-7 relative): the maths is checked
    to float64 precision with the same norm computed in the model's dtype."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def build(kind, family, overrides, dtype=torch.float64, seed=1):
    if kind == "enc":
        return tiny_model(family, seed=seed, dtype=dtype, **overrides)
    model = tiny_decoder(family, seed=seed, dtype=dtype, **overrides)
    if dtype == torch.float64:
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                module.forward = types.MethodType(_rms_norm_in_own_dtype, module)
    return model


def outputs(model, state=None):
    if state is not None:
        model.load_state_dict(state)
    inputs = probe_inputs(model.config)
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].to(next(model.parameters()).dtype)
    return model_outputs(model, inputs)


def relative_change(model, transform):
    state = {k: v.clone() for k, v in model.state_dict().items()}
    before = outputs(model)
    after = outputs(model, apply_transform(state, layout_of(model.config, state), transform))
    model.load_state_dict(state)
    return ((after - before).abs().max() / before.abs().max()).item()


def stream_of(model):
    state = model.state_dict()
    return stream_layout(layout_of(model.config, state), state, tied=bool(getattr(model.config, "tie_word_embeddings", False)))


@pytest.mark.parametrize("kind,family,overrides", MODELS, ids=MODEL_IDS)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_a_permutation_of_the_stream_keeps_the_function(kind, family, overrides, dtype, tol):
    model = build(kind, family, overrides, dtype)
    stream = stream_of(model)
    residual = random_residual(stream, "permutation", seed=3)
    assert relative_change(model, Transform(residual=residual)) < tol
    # ... together with a random block transform (heads too): the two commute
    layout = layout_of(model.config, model.state_dict())
    both = random_transform(layout, seed=4, heads=True)
    both.residual = residual
    assert relative_change(model, both) < tol


@pytest.mark.parametrize("kind,family,overrides", PRE_NORM, ids=[i for i, m in zip(MODEL_IDS, MODELS) if m in PRE_NORM])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_an_orthogonal_map_after_folding_the_norms_keeps_the_function(kind, family, overrides, dtype, tol):
    model = build(kind, family, overrides, dtype)
    stream = stream_of(model)
    if stream.tied_final:
        assert "tied" in stream.orthogonal_problem(family)
        return
    assert stream.orthogonal_problem(family) is None
    residual = random_residual(stream, "orthogonal", seed=5)
    assert relative_change(model, Transform(residual=residual)) < tol
    # the moved model's norms carry exactly the gains the map gives them
    moved = apply_transform(model.state_dict(), layout_of(model.config, model.state_dict()), Transform(residual=residual))
    assert all(torch.equal(moved[k], g.to(dtype)) for k, g in residual.gains.items())


@pytest.mark.parametrize("family,overrides", VARIANTS, ids=VARIANT_IDS)
def test_post_ln_encoders_refuse_an_orthogonal_map_which_would_break_them(family, overrides):
    """Post-LN: the norm's output is the stream; rotating it (even fixing 1) changes the function."""
    model = build("enc", family, overrides)
    stream = stream_of(model)
    problem = stream.orthogonal_problem(family)
    if family == "vit":
        assert problem is None
        return
    assert "post-LN" in problem
    d = stream.hidden
    r = centred_map(random_orthogonal(1, d - 1, torch.Generator().manual_seed(0))[0])
    assert relative_change(model, Transform(residual=ResidualMap(r))) > 1e-3


@pytest.mark.parametrize("kind,family,overrides", [m for m in PRE_NORM if m[1] in ("vit", "stablelm", "gpt2")][:3])
def test_layernorm_needs_the_map_to_fix_the_all_ones_direction_and_the_gains_folded(kind, family, overrides):
    """Pre-LN with LayerNorm: a Haar-random orthogonal map (moving the all-ones direction), or a rotation fixing it
    without folding the gains, or a signed permutation, changes the function; the constrained map does not."""
    model = build(kind, family, {**overrides, "tie_word_embeddings": False} if family == "gpt2" else overrides)
    stream = stream_of(model)
    d, gen = stream.hidden, torch.Generator().manual_seed(0)
    good = random_residual(stream, "orthogonal", seed=1)
    assert relative_change(model, Transform(residual=good)) < 1e-10
    free = random_orthogonal(1, d, gen)[0]
    assert relative_change(model, Transform(residual=ResidualMap(free, good.gains))) > 1e-3
    assert relative_change(model, Transform(residual=ResidualMap(good.r))) > 1e-3            # gains not folded
    signs = torch.diag(torch.where(torch.rand(d, generator=gen) < 0.5, -1.0, 1.0).double())
    assert relative_change(model, Transform(residual=ResidualMap(signs))) > 1e-3


def test_rmsnorm_admits_sign_flips_and_any_rotation_but_not_unfolded():
    model = build("dec", "llama", {"num_key_value_heads": 2})
    stream = stream_of(model)
    d, gen = stream.hidden, torch.Generator().manual_seed(0)
    signs = torch.diag(torch.where(torch.rand(d, generator=gen) < 0.5, -1.0, 1.0).double())
    assert relative_change(model, Transform(residual=ResidualMap(signs))) < 1e-10
    free = random_orthogonal(1, d, gen)[0]
    assert relative_change(model, Transform(residual=ResidualMap(free))) > 1e-3              # gains not folded
    gains = random_residual(stream, "orthogonal", seed=2).gains
    assert relative_change(model, Transform(residual=ResidualMap(free, gains))) < 1e-10


def test_a_tied_lm_head_keeps_its_tie_under_signed_permutations():
    model = build("dec", "llama", {"num_key_value_heads": 2, "tie_word_embeddings": True})
    stream = stream_of(model)
    assert stream.tied_final and all("norm.weight" != f.gain.split("model.")[-1] for f in stream.folds)
    residual = random_residual(stream, "permutation", seed=4)
    moved = apply_transform(model.state_dict(), layout_of(model.config, model.state_dict()), Transform(residual=residual))
    assert torch.equal(moved["lm_head.weight"], moved["model.embed_tokens.weight"])


def test_folding_is_a_symmetry_of_pre_norm_models_only():
    vit = build("enc", "vit", {})
    state = vit.state_dict()
    stream = stream_of(vit)
    folded = fold_norms(layout_of(vit.config, state).canonical(state), stream.folds)
    assert all(torch.equal(folded[f.gain], torch.ones_like(folded[f.gain])) for f in stream.folds)
    before = outputs(vit)
    assert ((outputs(vit, folded) - before).abs().max() / before.abs().max()).item() < 1e-10


def test_a_residual_map_survives_save_and_load(tmp_path):
    model = build("dec", "llama", {"num_key_value_heads": 2})
    layout = layout_of(model.config, model.state_dict())
    transform = random_transform(layout, seed=1)
    transform.residual = random_residual(stream_of(model), "orthogonal", seed=2)
    transform.save(tmp_path / "t.safetensors")
    loaded = Transform.load(tmp_path / "t.safetensors")
    assert torch.equal(loaded.residual.r, transform.residual.r)
    assert loaded.residual.gains.keys() == transform.residual.gains.keys()
    assert all(torch.equal(loaded.residual.gains[k], g) for k, g in transform.residual.gains.items())
    assert sorted(loaded.layers) == sorted(transform.layers)


@pytest.mark.parametrize("family,overrides", VARIANTS, ids=VARIANT_IDS)
def test_whole_heads_of_encoders_are_a_symmetry(family, overrides):
    model = build("enc", family, overrides)
    layout = layout_of(model.config, model.state_dict())
    transform = random_transform(layout, seed=6, heads=True)
    assert all(t.head_perm is not None for t in transform.layers.values())
    assert relative_change(model, transform) < 1e-10
