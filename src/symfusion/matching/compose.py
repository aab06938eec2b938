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

import dataclasses
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

from symfusion.arch import ModelLayout, resolve_layers
from symfusion.presets import load_preset
from symfusion.errors import SymfusionError
from symfusion.matching.baselines import match_attention_permutation, match_ffn_ot
from symfusion.matching.heads import match_heads
from symfusion.matching.permutation import match_ffn_permutation
from symfusion.matching.joint import match_attention_joint
from symfusion.matching.learned import GROUPS as REFINE_GROUPS
from symfusion.matching.learned import SCHEDULES as REFINE_SCHEDULES
from symfusion.matching.learned import RefineSettings
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

ATTENTION_CHOICES = ("none", "rotation", "permutation")
FFN_CHOICES = ("none", "permutation", "ot")
RESIDUAL_CHOICES = ("none", "permutation", "orthogonal", "auto")
RESIDUAL_SOLVES = ("weights", "activations")
REFINE_CHOICES = ("none", "loss", "synthetic")
MULTI_CHOICES = ("anchor", "barycenter")     # k >= 2 models (matching/multi.py): each onto the first, or a barycenter
# Keys of a matching preset that are not MatchConfig fields: its name, its label in tables, the k-model method.
PRESET_KEYS = ("name", "label", "multi")


def _choice(key: str, value, choices: tuple) -> None:
    if not isinstance(value, str) or value not in choices:
        raise SymfusionError(f"matching.{key}={value!r}; choose one of {', '.join(choices)}")


def _number(key: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SymfusionError(f"matching.{key}={value!r} must be a finite number")


def _flag(key: str, value, optional: bool = False) -> None:
    if not (isinstance(value, bool) or (optional and value is None)):
        raise SymfusionError(f"matching.{key}={value!r} must be true or false" + (" or null" if optional else ""))


@dataclass(frozen=True)
class MatchConfig:
    """What to match: attention by rotation/permutation, rescaling, FFN by permutation/OT.

    joint=True optimises rotation and rescaling together (matching/joint.py) instead of
    rotation first and rescaling after (the paper's order).
    heads: also permute whole heads (KV groups, query heads within a group) before the
    within-head solves; None = the family's default (on for decoders, off for the paper's encoders).
    residual: also map the residual stream shared by all layers (matching/whole.py): permutation (signed
    for RMSNorm), orthogonal (pre-norm families, norms folded) or auto (orthogonal where exact).
    residual_solve: its first estimate from the weights no block touches, or from the two models'
    activations (needs data). refine: `loss` then lowers the loss along the path between the two models over
    the continuous part of the symmetry (matching/learned.py, needs data), `synthetic` the same distilled on
    inputs it makes instead of data (matching/synthetic.py: noise images, text the end models write), as the
    refine_* settings say (learned.RefineSettings, which checks their ranges); refine_lr, refine_alphas,
    refine_minimax, refine_group, refine_distill and refine_gains_lr None = the family's (families.py, `refine`;
    else RefineSettings' defaults).
    This declaration is the one place that says what each setting may be: the presets, align() and every
    command's matching.* overrides are checked here.
    """

    attention: str = "rotation"
    rescale: bool = True
    ffn: str = "permutation"
    joint: bool = False
    heads: bool | None = None
    residual: str = "none"
    residual_solve: str = "weights"
    refine: str = "none"
    refine_steps: int = 200
    refine_lr: float | None = None
    refine_schedule: str = "cosine"
    refine_alphas: tuple[float, float] | None = None
    refine_minimax: tuple[float, ...] | None = None
    refine_group: str | None = None
    refine_gauge: bool = True
    refine_distill: float | None = None
    refine_gains_lr: float | None = None

    def __post_init__(self):
        _choice("attention", self.attention, ATTENTION_CHOICES)
        _flag("rescale", self.rescale)
        _choice("ffn", self.ffn, FFN_CHOICES)
        _flag("joint", self.joint)
        _flag("heads", self.heads, optional=True)
        _choice("residual", self.residual, RESIDUAL_CHOICES)
        _choice("residual_solve", self.residual_solve, RESIDUAL_SOLVES)
        _choice("refine", self.refine, REFINE_CHOICES)
        if isinstance(self.refine_steps, bool) or not isinstance(self.refine_steps, int) or self.refine_steps < 1:
            raise SymfusionError(f"matching.refine_steps={self.refine_steps!r} must be an integer >= 1")
        if self.refine_lr is not None:
            _number("refine_lr", self.refine_lr)
        _choice("refine_schedule", self.refine_schedule, REFINE_SCHEDULES)
        for name, length, shape in (("refine_alphas", 2, "a list [lo, hi]"), ("refine_minimax", None,
                                                                             "a list of path points")):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or length not in (None, len(value)):
                raise SymfusionError(f"matching.{name}={value!r} must be {shape} or null")
            for alpha in value:
                _number(name, alpha)
            object.__setattr__(self, name, tuple(value))               # a preset's list, kept as given
        if self.refine_group is not None:
            _choice("refine_group", self.refine_group, REFINE_GROUPS)
        _flag("refine_gauge", self.refine_gauge)
        if self.refine_distill is not None:
            _number("refine_distill", self.refine_distill)
        if self.refine_gains_lr is not None:
            _number("refine_gains_lr", self.refine_gains_lr)
        if self.rescale and self.attention != "rotation":
            raise SymfusionError("rescaling is defined after rotation matching; set matching.attention=rotation")
        if self.joint and not (self.attention == "rotation" and self.rescale):
            raise SymfusionError("matching.joint=true needs matching.attention=rotation and matching.rescale=true")
        if self.heads and self.attention == "none":
            raise SymfusionError("matching.heads=true needs matching.attention=rotation or permutation")
        if (self.residual_solve != "weights" or self.refine != "none") and self.residual == "none":
            raise SymfusionError("matching.residual_solve and matching.refine act on the residual map: set "
                                 "matching.residual=permutation, orthogonal or auto")
        self.refine_settings()                                 # checks the refine_* settings

    def as_report(self) -> dict:
        """The settings as a report (match.json) states them: JSON values, refine_alphas and refine_minimax lists."""
        return {**dataclasses.asdict(self),
                **{k: None if getattr(self, k) is None else list(getattr(self, k))
                   for k in ("refine_alphas", "refine_minimax")}}

    def refine_settings(self, layout: ModelLayout | None = None) -> RefineSettings:
        """The learned refinement's settings (matching/learned.py); refine_lr, refine_alphas, refine_minimax,
        refine_group, refine_distill and refine_gains_lr None: the layout's family's (families.py), else
        RefineSettings' defaults."""
        family, given = dict(layout.refine if layout is not None else ()), {}
        for name, setting in (("refine_lr", "learning_rate"), ("refine_alphas", "alphas"), ("refine_minimax", "minimax"),
                              ("refine_group", "group"), ("refine_distill", "distill"), ("refine_gains_lr", "gains_lr")):
            value = getattr(self, name) if getattr(self, name) is not None else family.get(name)
            if value is not None:
                given[setting] = tuple(value) if setting in ("alphas", "minimax") else value
        if self.refine == "synthetic":                 # the inputs' labels are noise: the end models are the targets
            if self.refine_distill not in (None, 1, 1.0):
                raise SymfusionError(f"matching.refine=synthetic distils only (its labels are random): refine_distill="
                                     f"{self.refine_distill!r} must be 1 or null")
            given["distill"] = 1.0
        return RefineSettings(steps=self.refine_steps, schedule=self.refine_schedule, gauge=self.refine_gauge, **given)

    @property
    def needs_data(self) -> bool:
        """Whether the matching reads the models' activations or loss (residual_solve=activations, refine=loss)."""
        return self.residual_solve == "activations" or self.refine == "loss"

    @property
    def runs_models(self) -> bool:
        """Whether the matching runs the models (needs_data, or refine=synthetic on inputs it makes itself)."""
        return self.needs_data or self.refine == "synthetic"

    @property
    def reads(self) -> str:
        """What the matching reads, for the refusal of data it would leave unread (align(), symfusion-match)."""
        if self.needs_data:
            return "reads the models' activations or loss"
        return "runs the models on inputs it makes" if self.refine == "synthetic" else "reads the weights only"

    def blocks(self) -> "MatchConfig":
        """The same matching without the residual stream (the block solves of the coordinate descent)."""
        return dataclasses.replace(self, residual="none", residual_solve="weights", refine="none")

    def permutes_heads(self, layout: ModelLayout) -> bool:
        """Whether whole heads are matched for this layout (config.heads, else the family's default)."""
        heads = layout.match_heads if self.heads is None else self.heads
        return heads and self.attention != "none"


    @classmethod
    def from_mapping(cls, matching) -> "MatchConfig":
        """A MatchConfig from a matching preset (presets/matching/<name>.yaml) or cfg.matching with its overrides,
        every value checked as it is given (no conversion); the preset's name, label and multi (checked here too)
        are not matching settings of a pair."""
        given = dict(matching.items())
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(given) - set(fields) - set(PRESET_KEYS))
        if unknown:
            raise SymfusionError(f"matching.{unknown[0]} is not a matching setting; the settings are {', '.join(fields)}")
        if given.get("multi") is not None:
            _choice("multi", given["multi"], MULTI_CHOICES)
        return cls(**{key: given[key] for key in fields if key in given})


def matching_config(name: str) -> MatchConfig:
    """The matching variant `name`, read from presets/matching/<name>.yaml (the one definition of each variant)."""
    return MatchConfig.from_mapping(load_preset("matching", name))


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
