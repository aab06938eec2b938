"""A model moved by a rotation/rescaling/permutation symmetry computes the same function."""
import pytest
import torch

from symfusion.arch import layout_of
from symfusion.measures import max_output_change, model_outputs, probe_inputs
from symfusion.symmetry import Transform, apply_transform, random_orthogonal, random_transform
from tiny_models import VARIANT_IDS, VARIANTS, tiny_model


def moved_copy(model, transform):
    layout = layout_of(model.config, model.state_dict())
    moved = apply_transform(model.state_dict(), layout, transform)
    copy = type(model)(model.config).to(next(model.parameters()).dtype)
    copy.load_state_dict(moved)
    return copy.eval()


@pytest.mark.parametrize("family,overrides", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-11)])
def test_symmetry_preserves_function(family, overrides, dtype, tol):
    model = tiny_model(family, seed=1, dtype=dtype, **overrides)
    layout = layout_of(model.config, model.state_dict())
    transform = random_transform(layout, seed=7)
    moved = moved_copy(model, transform)
    inputs = probe_inputs(model.config)
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].to(dtype)
    reference = model_outputs(model, inputs)
    scale = reference.abs().max().item()
    assert max_output_change(model, moved, inputs) <= tol * max(1.0, scale)
    # and the parameters really moved
    changed = [k for k, v in moved.state_dict().items() if not torch.equal(v, model.state_dict()[k])]
    assert len(changed) >= 8 * layout.num_layers


@pytest.mark.parametrize("family,overrides", VARIANTS[2:6], ids=VARIANT_IDS[2:6])
def test_deberta_positional_projections_must_move(family, overrides):
    """Leaving pos_*_proj out of the rotation breaks the function: they are part of the orbit."""
    model = tiny_model(family, seed=2, dtype=torch.float64, **overrides)
    state = model.state_dict()
    layout = layout_of(model.config, state)
    extra = [p for layer in layout.layers for p in layer.attention.query_like[1:] + layer.attention.key_like[1:]]
    if overrides["share_att_key"]:
        assert extra == []
        return
    assert extra, "separate positional projections must be in the layout"
    moved = apply_transform(state, layout, random_transform(layout, seed=3))
    for proj in extra:                      # undo the move of the positional projections only
        moved[proj.weight], moved[proj.bias] = state[proj.weight], state[proj.bias]
    broken = type(model)(model.config).double()
    broken.load_state_dict(moved)
    assert max_output_change(model, broken.eval(), probe_inputs(model.config)) > 1e-3


def test_random_orthogonal_includes_reflections():
    r = random_orthogonal(64, 5, torch.Generator().manual_seed(0))
    eye = torch.eye(5, dtype=r.dtype).expand(64, 5, 5)
    assert torch.allclose(r @ r.transpose(1, 2), eye, atol=1e-12)
    dets = torch.linalg.det(r)
    assert (dets > 0).any() and (dets < 0).any()


def test_transform_save_load_roundtrip(tmp_path):
    model = tiny_model("bert", seed=0)
    layout = layout_of(model.config, model.state_dict())
    transform = random_transform(layout, seed=5)
    transform.save(tmp_path / "t.safetensors")
    loaded = Transform.load(tmp_path / "t.safetensors")
    assert sorted(loaded.layers) == sorted(transform.layers)
    for i, t in transform.layers.items():
        for name in ("r_qk", "a_qk", "r_vo", "a_vo", "ffn_perm"):
            assert torch.equal(getattr(loaded.layers[i], name), getattr(t, name))


def test_restricted_transform_moves_only_chosen_layers():
    model = tiny_model("roberta", seed=0)
    state = model.state_dict()
    layout = layout_of(model.config, state)
    moved = apply_transform(state, layout, random_transform(layout, seed=1).restrict([1]))
    layer0 = [k for k in state if ".layer.0." in k]
    layer1 = [k for k in state if ".layer.1." in k and "LayerNorm" not in k and "output.dense.bias" not in k]
    assert all(moved[k] is state[k] for k in layer0)
    assert all(not torch.equal(moved[k], state[k]) for k in layer1)
