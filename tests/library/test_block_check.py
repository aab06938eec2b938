"""A folder match's block check (alignment.checks.BlockCheck, issue 56) runs a layer's source weights and then its
matched weights in one real copy of the layer's module: its deviation equals, bit for bit, the one computed with a
fresh copy for each (as before), with and without a residual map; a matched layer lacking a parameter is refused,
never run with the source's value left in the copy."""
from __future__ import annotations

import pytest
import torch

from symfusion.alignment.checks import BlockCheck
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


def fresh_deviation(check: BlockCheck, prefix: str, source: dict, matched: dict, r=None) -> float:
    """The deviation with a new real copy of the module for each side (output() without block=)."""
    reference = check.output(prefix, source)
    if r is None:
        return ((check.output(prefix, matched) - reference).abs().max() / reference.abs().max()).item()
    moved = check.output(prefix, matched, check.hidden @ r.T, r)
    return ((moved - reference @ r.T).abs().max() / reference.abs().max()).item()


@pytest.mark.parametrize("kind,family,overrides", CASES, ids=IDS)
def test_one_copy_gives_the_fresh_copies_deviation_exactly(kind, family, overrides):
    model, source, matched = pair(kind, family, overrides)
    layout = layout_of(model.config, source)
    check = checker_of(model, source)
    r = torch.linalg.qr(torch.randn(model.config.hidden_size, model.config.hidden_size,
                                    generator=torch.Generator().manual_seed(5)))[0]
    for i in range(layout.num_layers):
        prefix = layer_prefix(layout, i)
        deviation = check.deviation(prefix, source, matched)
        assert deviation > 0                                  # the two sides differ: the matched weights were run
        assert deviation == fresh_deviation(check, prefix, source, matched)
        assert check.deviation(prefix, source, source) == 0.0
        assert check.deviation(prefix, source, matched, r) == fresh_deviation(check, prefix, source, matched, r)


@pytest.mark.parametrize("kind,family,overrides", [CASES[1], CASES[-3]], ids=[IDS[1], IDS[-3]])
def test_a_matched_layer_lacking_a_parameter_is_refused(kind, family, overrides):
    model, source, matched = pair(kind, family, overrides)
    layout = layout_of(model.config, source)
    prefix = layer_prefix(layout, 0)
    missing = next(k for k in matched if k.startswith(prefix) and k.endswith("weight"))
    del matched[missing]
    with pytest.raises(SymfusionError, match="lacks"):
        checker_of(model, source).deviation(prefix, source, matched)
