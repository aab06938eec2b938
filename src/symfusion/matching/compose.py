"""match_models(): compose rotation, rescaling and permutation matching into one Transform.

The anchor stays fixed and the source is moved onto it. Embeddings, LayerNorms, the
residual stream and task heads are never transformed (the symmetries act inside a block).
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Mapping

import torch

from symfusion.arch import ModelLayout, check_same_layout, resolve_layers
from symfusion.errors import SymfusionError
from symfusion.matching.baselines import match_attention_permutation, match_ffn_ot
from symfusion.matching.permutation import match_ffn_permutation
from symfusion.matching.joint import match_attention_joint
from symfusion.matching.joint import qk_norms as _source_norms_qk
from symfusion.matching.joint import vo_norms as _source_norms_vo
from symfusion.matching.rescale import best_scales
from symfusion.matching.rotation import (
    frobenius_inner,
    procrustes,
    qk_cross_parts,
    vo_cross_parts,
)
from symfusion.symmetry import LayerTransform, Transform

ATTENTION_CHOICES = ("none", "rotation", "permutation")
FFN_CHOICES = ("none", "permutation", "ot")


@dataclass(frozen=True)
class MatchConfig:
    """What to match: attention by rotation/permutation, rescaling, FFN by permutation/OT.

    joint=True optimises rotation and rescaling together (matching/joint.py) instead of
    rotation first and rescaling after (the paper's order).
    """

    attention: str = "rotation"
    rescale: bool = True
    ffn: str = "permutation"
    joint: bool = False

    def __post_init__(self):
        if self.attention not in ATTENTION_CHOICES:
            raise SymfusionError(f"matching.attention={self.attention!r}; choose one of {ATTENTION_CHOICES}")
        if self.ffn not in FFN_CHOICES:
            raise SymfusionError(f"matching.ffn={self.ffn!r}; choose one of {FFN_CHOICES}")
        if self.rescale and self.attention != "rotation":
            raise SymfusionError("rescaling is defined after rotation matching; set matching.attention=rotation")
        if self.joint and not (self.attention == "rotation" and self.rescale):
            raise SymfusionError("matching.joint=true needs matching.attention=rotation and matching.rescale=true")


# The matching variants the paper and its baselines use, by name.
MATCHING_METHODS: dict[str, MatchConfig] = {
    "none": MatchConfig(attention="none", rescale=False, ffn="none"),
    "rotation": MatchConfig(attention="rotation", rescale=True, ffn="permutation"),
    "rotation_no_rescale": MatchConfig(attention="rotation", rescale=False, ffn="permutation"),
    "attn_only": MatchConfig(attention="rotation", rescale=True, ffn="none"),
    # the paper's language experiments (Table 1, Figure 6): attention rotation only, no rescaling
    "attn_only_no_rescale": MatchConfig(attention="rotation", rescale=False, ffn="none"),
    "ffn_only": MatchConfig(attention="none", rescale=False, ffn="permutation"),
    "git_rebasin": MatchConfig(attention="permutation", rescale=False, ffn="permutation"),
    "ot_ffn": MatchConfig(attention="none", rescale=False, ffn="ot"),
    # Appendix D's open problem: rotation and rescaling optimised jointly (alternating), FFN permutation
    "rotation_joint": MatchConfig(attention="rotation", rescale=True, ffn="permutation", joint=True),
}


def matching_config(name: str) -> MatchConfig:
    if name not in MATCHING_METHODS:
        raise SymfusionError(f"unknown matching {name!r}; choose one of {', '.join(MATCHING_METHODS)}")
    return MATCHING_METHODS[name]


@dataclass
class MatchResult:
    transform: Transform
    seconds: dict[str, float] = field(default_factory=dict)  # per stage: qk, vo, rescale, joint, ffn
    joint: dict[int, dict] = field(default_factory=dict)      # per layer (joint=True): match_attention_joint's info


def match_attention_rotation(source, anchor, att, heads, rescale, clock) -> LayerTransform:
    """Algorithm 1 plus eq. (12): R_qk, R_vo per head, then a_qk, a_vo per head."""
    with clock("qk"):
        query, key = qk_cross_parts(source, anchor, att, heads)
        r_qk = procrustes(query + key)
    with clock("vo"):
        value, output = vo_cross_parts(source, anchor, att, heads)
        r_vo = procrustes(value + output)
    t = LayerTransform(r_qk=r_qk, r_vo=r_vo)
    if rescale:
        with clock("rescale"):
            norm_q, norm_k = _source_norms_qk(source, att, heads)
            t.a_qk = best_scales(norm_q, frobenius_inner(r_qk, query), norm_k, frobenius_inner(r_qk, key))
            norm_v, norm_o = _source_norms_vo(source, att, heads)
            t.a_vo = best_scales(norm_v, frobenius_inner(r_vo, value), norm_o, frobenius_inner(r_vo, output))
    return t


class StageClock:
    """Accumulates wall seconds per named stage: `with clock("ffn"): ...`."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self._stage = None

    def __call__(self, stage: str) -> "StageClock":
        self._stage = stage
        return self

    def __enter__(self):
        self._start = time.perf_counter()

    def __exit__(self, *exc):
        self.seconds[self._stage] += time.perf_counter() - self._start


def match_layer(
    source, anchor, layout: ModelLayout, index: int, config: MatchConfig, clock, record: dict | None = None
) -> LayerTransform:
    """One layer's transform; with config.joint the joint solver's info goes to record[index]."""
    layer, heads = layout.layers[index], layout.num_heads
    if config.joint:
        with clock("joint"):
            t, info = match_attention_joint(source, anchor, layer.attention, heads)
        if record is not None:
            record[index] = info
    elif config.attention == "rotation":
        t = match_attention_rotation(source, anchor, layer.attention, heads, config.rescale, clock)
    elif config.attention == "permutation":
        with clock("qk+vo"):
            r_qk, r_vo = match_attention_permutation(source, anchor, layer.attention, heads)
        t = LayerTransform(r_qk=r_qk, r_vo=r_vo)
    else:
        t = LayerTransform()
    with clock("ffn"):
        if config.ffn == "permutation":
            t.ffn_perm = match_ffn_permutation(source, anchor, layer.ffn)
        elif config.ffn == "ot":
            t.ffn_perm = match_ffn_ot(source, anchor, layer.ffn)
    return t


@torch.no_grad()
def match_models(
    source: Mapping[str, torch.Tensor],
    anchor: Mapping[str, torch.Tensor],
    layout: ModelLayout,
    config: MatchConfig | str = "rotation",
    layers=None,
    last_layers: int | None = None,
    anchor_layout: ModelLayout | None = None,
) -> MatchResult:
    """Find the transform moving `source` onto `anchor` (both state dicts of one layout)."""
    config = matching_config(config) if isinstance(config, str) else config
    if anchor_layout is not None:
        check_same_layout(layout, anchor_layout)
    clock = StageClock()
    transform, joint = Transform(), {}
    for i in resolve_layers(layout.num_layers, layers, last_layers):
        t = match_layer(source, anchor, layout, i, config, clock, joint)
        if not t.is_identity():
            transform.layers[i] = t
    return MatchResult(transform=transform, seconds=dict(clock.seconds), joint=joint)


def match_many(sources: list, anchor: Mapping, layout: ModelLayout, config="rotation", **kwargs) -> list[MatchResult]:
    """k > 2 models: match every source onto the one anchor independently."""
    return [match_models(s, anchor, layout, config, **kwargs) for s in sources]
