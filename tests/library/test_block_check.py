"""A folder match's block check (alignment.checks.BlockCheck, issue 56) runs a layer's meta module on the source's and
then the matched weights with no copy of the module or of the weights: its deviation equals, bit for bit, the one
computed with a real float32 copy of the module holding each side's weights (the check before), with and without a
residual map; a matched layer lacking a parameter is refused, never run without it."""
from __future__ import annotations

import copy

import pytest
import torch

from symfusion.alignment.checks import BlockCheck, _module_path
from symfusion.alignment.sharded import layer_prefix
from symfusion.arch import layout_of
from symfusion.errors import SymfusionError
from symfusion.io.modelio import skeleton_of
from tiny_decoders import DECODER_IDS, DECODERS, tiny_decoder
from tiny_models import VARIANT_IDS, VARIANTS, tiny_model

CASES = [("encoder", f, o) for f, o in VARIANTS] + [("decoder", f, o) for f, o in DECODERS]
IDS = VARIANT_IDS + DECODER_IDS


def pair(kind: str, family: str, overrides: dict):
    build = tiny_model if kind == "encoder" else tiny_decoder
    source, other = build(family, seed=0, **overrides), build(family, seed=1, **overrides)
    return source, dict(source.state_dict()), dict(other.state_dict())


def checker_of(model, state: dict) -> BlockCheck:
    return BlockCheck(model.config, skeleton=skeleton_of(model.config, cls=type(model)),
                      read=lambda keys: {k: state[k] for k in keys}, keys=list(state))


def copied_output(check: BlockCheck, prefix: str, weights: dict, hidden=None, r=None) -> torch.Tensor:
    """The block's output from a real float32 copy of its module holding `weights` (how the check ran before)."""
    path = _module_path(check.skeleton, prefix)
    real = copy.deepcopy(check.skeleton.get_submodule(path)).to_empty(device="cpu").float()
    real.load_state_dict({k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}, strict=False)
    kwargs = check._inputs(path, prefix)
    if r is not None and kwargs.get("rel_embeddings") is not None:
        kwargs = {**kwargs, "rel_embeddings": kwargs["rel_embeddings"] @ r.T}
    with torch.no_grad():
        out = real.eval()(check.hidden if hidden is None else hidden, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def copied_deviation(check: BlockCheck, prefix: str, source: dict, matched: dict, r=None) -> float:
    reference = copied_output(check, prefix, source)
    if r is None:
        return ((copied_output(check, prefix, matched) - reference).abs().max() / reference.abs().max()).item()
    moved = copied_output(check, prefix, matched, check.hidden @ r.T, r)
    return ((moved - reference @ r.T).abs().max() / reference.abs().max()).item()


@pytest.mark.parametrize("kind,family,overrides", CASES, ids=IDS)
def test_no_copy_gives_the_real_copys_deviation_exactly(kind, family, overrides):
    model, source, matched = pair(kind, family, overrides)
    layout = layout_of(model.config, source)
    check = checker_of(model, source)
    r = torch.linalg.qr(torch.randn(model.config.hidden_size, model.config.hidden_size,
                                    generator=torch.Generator().manual_seed(5)))[0]
    for i in range(layout.num_layers):
        prefix = layer_prefix(layout, i)
        deviation = check.deviation(prefix, source, matched)
        assert deviation > 0                                  # the two sides differ: the matched weights were run
        assert deviation == copied_deviation(check, prefix, source, matched)
        assert check.deviation(prefix, source, source) == 0.0
        assert check.deviation(prefix, source, matched, r) == copied_deviation(check, prefix, source, matched, r)


@pytest.mark.parametrize("kind,family,overrides", [CASES[1], CASES[-3]], ids=[IDS[1], IDS[-3]])
def test_a_matched_layer_lacking_a_parameter_is_refused(kind, family, overrides):
    model, source, matched = pair(kind, family, overrides)
    layout = layout_of(model.config, source)
    prefix = layer_prefix(layout, 0)
    missing = next(k for k in matched if k.startswith(prefix) and k.endswith("weight"))
    del matched[missing]
    with pytest.raises(SymfusionError, match="lacks"):
        checker_of(model, source).deviation(prefix, source, matched)
