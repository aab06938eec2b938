"""Block matching: compose rotation, rescaling and permutation matching of every layer into one Transform.

The anchor stays fixed and the source is moved onto it. Here embeddings, LayerNorms, the
residual stream and task heads are never transformed (the symmetries act inside a block);
matching/whole.py adds the residual stream (MatchConfig.residual) by coordinate descent over
these block solves, and matching/models.py's match_models() is the one entry point.
Decoder layouts (arch.py) first permute whole heads (matching/heads.py), then solve per KV
head in the layout's Q/K group: RoPE planes under rotary embeddings; rotation is refused when
per-head q/k norms make it inexact.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Mapping

import torch

from symfusion.arch import ModelLayout, resolve_layers
from symfusion.errors import SymfusionError
from symfusion.matching.baselines import match_attention_permutation, match_ffn_ot
from symfusion.matching.config import (  # noqa: F401 - MatchConfig's names, importable from here as before
    ATTENTION_CHOICES,
    FFN_CHOICES,
    MULTI_CHOICES,
    PRESET_KEYS,
    REFINE_CHOICES,
    RESIDUAL_CHOICES,
    RESIDUAL_SOLVES,
    MatchConfig,
    matching_config,
)
from symfusion.matching.heads import match_heads
from symfusion.matching.permutation import match_ffn_permutation
from symfusion.matching.joint import match_attention_joint
from symfusion.matching.joint import qk_norms as _source_norms_qk
from symfusion.matching.joint import vo_norms as _source_norms_vo
from symfusion.matching.rescale import best_scales
from symfusion.matching.rotation import (
    frobenius_inner,
    procrustes,
    qk_cross_parts,
    qk_procrustes,
    vo_cross_parts,
)
from symfusion.symmetry import LayerTransform, Transform, permute_heads


@dataclass
class MatchResult:
    transform: Transform
    seconds: dict[str, float] = field(default_factory=dict)  # per stage: qk, vo, rescale, joint, ffn, residual, refine
    joint: dict[int, dict] = field(default_factory=dict)      # per layer (joint=True): match_attention_joint's info
    residual: dict = field(default_factory=dict)              # matching.residual: the group, the descent, the refinement


def match_attention_rotation(source, anchor, att, heads, rescale, clock) -> LayerTransform:
    """Algorithm 1 plus eq. (12) for one layer: R_qk, R_vo per head, then a_qk, a_vo per head."""
    return match_attention_rotation_layers(source, anchor, [att], heads, rescale, clock)[0]


def match_attention_rotation_layers(source, anchor, atts: list, heads, rescale, clock) -> list[LayerTransform]:
    """Algorithm 1 plus eq. (12) for several layers at once, one batched Procrustes over every (layer, head).

    Batching the layers amortises the per-call overhead of the small eigendecompositions
    (0.77 ms per 64x64 head in batches of 12, 0.55 ms in batches of 144).
    """
    if not atts:
        return []
    kv = heads // atts[0].group                                       # per KV head (= heads without GQA)
    with clock("qk"):
        parts = [qk_cross_parts(source, anchor, att, heads) for att in atts]
        query = torch.cat([q for q, _ in parts])                      # (layers * kv, d, d)
        key = torch.cat([k for _, k in parts])                        # (layers * kv, d, d)
        r_qk = qk_procrustes(query + key, atts[0])
    with clock("vo"):
        parts = [vo_cross_parts(source, anchor, att, heads) for att in atts]
        value = torch.cat([v for v, _ in parts])                      # (layers * kv, d, d)
        output = torch.cat([o for _, o in parts])                     # (layers * kv, d, d)
        r_vo = procrustes(value + output)
    # per-layer copies, not views: each layer's tensors are saved on their own (safetensors refuses shared storage)
    found = [LayerTransform(r_qk=q.clone(), r_vo=v.clone()) for q, v in zip(r_qk.split(kv), r_vo.split(kv))]
    if rescale:
        with clock("rescale"):
            norm_q, norm_k = (torch.cat(n) for n in zip(*(_source_norms_qk(source, att, heads) for att in atts)))
            a_qk = best_scales(norm_q, frobenius_inner(r_qk, query), norm_k, frobenius_inner(r_qk, key))
            norm_v, norm_o = (torch.cat(n) for n in zip(*(_source_norms_vo(source, att, heads) for att in atts)))
            a_vo = best_scales(norm_v, frobenius_inner(r_vo, value), norm_o, frobenius_inner(r_vo, output))
        for t, qk, vo in zip(found, a_qk.split(kv), a_vo.split(kv)):
            t.a_qk, t.a_vo = qk.clone(), vo.clone()
    return found


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


def match_attention_layers(
    source, anchor, layout: ModelLayout, indices: list[int], config: MatchConfig, clock, record: dict | None = None
) -> dict[int, LayerTransform]:
    """The attention transform of every listed layer; with config.joint the joint solver's info goes to
    record[index]. Rotation solves all listed layers' heads in one batch. Whole heads are matched first when
    config.permutes_heads(layout); the within-head solves then see the source with its heads permuted."""
    heads = layout.num_heads
    if config.attention == "rotation":
        refuse_inexact_rotation(layout)
    head_perms = {}
    if config.permutes_heads(layout):
        with clock("heads"):
            head_perms = {i: match_heads(source, anchor, layout.layers[i].attention, heads, config.attention)
                          for i in indices}
            source = dict(source)
            for i, perm in head_perms.items():
                if perm is not None:
                    permute_heads(source, layout.layers[i].attention, perm)
    found = _match_within_heads(source, anchor, layout, indices, config, clock, record)
    for i, perm in head_perms.items():
        found[i].head_perm = perm
    return found


def refuse_inexact_rotation(layout: ModelLayout) -> None:
    """Raise when rotating Q/K would change the function (per-head q/k norms), naming the module."""
    norms = layout.layers[0].attention.qk_norm if layout.layers else ()
    if norms:
        raise SymfusionError(
            f"rotation matching is not exact for this {layout.family} model: {norms[0]} normalises each head's "
            "queries, and no rotation commutes with it; use matching=git_rebasin (head and V/O permutations) or ffn_only"
        )


def _match_within_heads(source, anchor, layout: ModelLayout, indices: list[int], config: MatchConfig, clock,
                        record: dict | None) -> dict[int, LayerTransform]:
    """Per KV head: rotation (joint or sequential) or coordinate permutation, for every listed layer."""
    heads = layout.num_heads
    if config.joint:
        found = {}
        for i in indices:
            with clock("joint"):
                found[i], info = match_attention_joint(source, anchor, layout.layers[i].attention, heads)
            if record is not None:
                record[i] = info
        return found
    if config.attention == "rotation":
        atts = [layout.layers[i].attention for i in indices]
        return dict(zip(indices, match_attention_rotation_layers(source, anchor, atts, heads, config.rescale, clock)))
    if config.attention == "permutation":
        found = {}
        for i in indices:
            with clock("qk+vo"):
                r_qk, r_vo = match_attention_permutation(source, anchor, layout.layers[i].attention, heads)
            found[i] = LayerTransform(r_qk=r_qk, r_vo=r_vo)
        return found
    return {i: LayerTransform() for i in indices}


def match_layer_ffn(source, anchor, layout: ModelLayout, index: int, config: MatchConfig, clock) -> torch.Tensor | None:
    """One layer's FFN permutation (new neuron j = old perm[j]), or None when the FFN is not matched."""
    ffn = layout.layers[index].ffn
    with clock("ffn"):
        if config.ffn == "permutation":
            return match_ffn_permutation(source, anchor, ffn)
        if config.ffn == "ot":
            return match_ffn_ot(source, anchor, ffn)
    return None


def match_layer(
    source, anchor, layout: ModelLayout, index: int, config: MatchConfig, clock, record: dict | None = None
) -> LayerTransform:
    """One layer's transform: attention, then FFN."""
    t = match_attention_layers(source, anchor, layout, [index], config, clock, record)[index]
    t.ffn_perm = match_layer_ffn(source, anchor, layout, index, config, clock)
    return t


@torch.no_grad()
def match_blocks(
    source: Mapping[str, torch.Tensor],
    anchor: Mapping[str, torch.Tensor],
    layout: ModelLayout,
    config: MatchConfig,
    layers=None,
    last_layers: int | None = None,
    clock: "StageClock | None" = None,
    canonical: bool = False,
) -> MatchResult:
    """Find the block transform moving `source` onto `anchor` (both state dicts of one layout, as stored, or
    both canonical); the residual stream stays (config.residual is not read here)."""
    if not canonical:
        source, anchor = layout.canonical(source), layout.canonical(anchor)   # GPT-2: (out, in) views of Conv1D maps
    clock = clock or StageClock()
    transform, joint = Transform(), {}
    indices = resolve_layers(layout.num_layers, layers, last_layers)
    # Every layer's attention first, then every FFN: the FFN products run in numpy's BLAS, whose
    # threads keep spinning for a while after each call and would slow torch's attention solves.
    found = match_attention_layers(source, anchor, layout, indices, config, clock, joint)
    for i in indices:
        found[i].ffn_perm = match_layer_ffn(source, anchor, layout, i, config, clock)
        if not found[i].is_identity():
            transform.layers[i] = found[i]
    return MatchResult(transform=transform, seconds=dict(clock.seconds), joint=joint)
