"""What to match: MatchConfig, the one declaration of a matching's settings, and the preset of a name as one.

A matching variant is one preset file (symfusion/presets/matching/<name>.yaml, read through presets/catalog.py);
matching_config(name) checks it here. Whether a matching reads data is the catalogue's rule (catalog.reads_data),
which the workflow asks too.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

from symfusion.arch import ModelLayout
from symfusion.errors import SymfusionError
from symfusion.matching.learned import GROUPS as REFINE_GROUPS
from symfusion.matching.learned import SCHEDULES as REFINE_SCHEDULES
from symfusion.matching.learned import RefineSettings
from symfusion.presets import catalog, family_matching, load_preset

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
    else RefineSettings' defaults). untie: a decoder whose lm_head is tied to its input embeddings is matched, and
    written, as the standard untied model of its class (io/untie.py), so the residual map may be any orthogonal map.
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
    untie: bool = False

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
        _flag("untie", self.untie)
        if self.rescale and self.attention != "rotation":
            raise SymfusionError("rescaling is defined after rotation matching; set matching.attention=rotation")
        if self.joint and not (self.attention == "rotation" and self.rescale):
            raise SymfusionError("matching.joint=true needs matching.attention=rotation and matching.rescale=true")
        if self.heads and self.attention == "none":
            raise SymfusionError("matching.heads=true needs matching.attention=rotation or permutation")
        if (self.residual_solve != "weights" or self.refine != "none") and self.residual == "none":
            raise SymfusionError("matching.residual_solve and matching.refine act on the residual map: set "
                                 "matching.residual=permutation, orthogonal or auto")
        if self.untie and self.residual == "none":
            raise SymfusionError("matching.untie=true frees the residual map of a tied decoder, and this matching has "
                                 "none: set matching.residual=orthogonal or auto, or leave the model tied (untie=false)")
        self.refine_settings()                                 # checks the refine_* settings

    def as_report(self) -> dict:
        """The settings as a report (match.json) states them: JSON values, refine_alphas and refine_minimax lists."""
        return {**dataclasses.asdict(self),
                **{k: None if getattr(self, k) is None else list(getattr(self, k))
                   for k in ("refine_alphas", "refine_minimax")}}

    def refine_settings(self, layout: ModelLayout | None = None) -> RefineSettings:
        """The learned refinement's settings (matching/learned.py); refine_lr, refine_alphas, refine_minimax,
        refine_group, refine_distill and refine_gains_lr None: the layout's family's (presets/families.yaml), else
        RefineSettings' defaults."""
        family, given = family_matching(layout.family)["refine"] if layout is not None else {}, {}
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
        """Whether the matching reads the models' activations or loss (residual_solve=activations, refine=loss): the
        catalogue's one rule, which the workflow asks of a preset's name."""
        return catalog.reads_data(vars(self))

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
        return dataclasses.replace(self, residual="none", residual_solve="weights", refine="none", untie=False)

    def permutes_heads(self, layout: ModelLayout) -> bool:
        """Whether whole heads are matched for this layout (config.heads, else the family's default)."""
        heads = family_matching(layout.family)["heads"] if self.heads is None else self.heads
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
