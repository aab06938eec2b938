"""Fusion methods by name: the registry, built from the declaration each method module makes of itself.

A method module declares a `FusionMethod` (fusion/options.py): its name, its merge function, its
options (names, defaults, validation) and whether it reads data. Every merge has the signature
    merge(models: list[nn.Module], batches: list[dict] | None, **options) -> dict[str, Tensor]
and returns a state dict with the anchor's keys, shapes and dtypes. `models[0]` is the anchor;
the others are sources, usually already matched onto it (statistics such as Fisher and Gram
matrices are then computed on the matched models, as they must be). `batches` are inputs of
the task (dicts a model's forward takes, with `labels`), for methods that read data. Fisher and
RegMean read them through one statistic per model (F_i, G_i), which a caller may precompute.
Each option's value lives in its declaration (defaults per model family); presets/fusion/<name>.yaml adds the
batches the merge stage loads, `check_fusion_config` checks a config against the declaration, and
`fusion_config(name)` is the preset of a name with the declared defaults filled in, checked.
"""
from __future__ import annotations

import copy
from typing import Any, Mapping

from omegaconf import OmegaConf

from symfusion.errors import SymfusionError
from symfusion.fusion import fisher, ot, regmean, simple
from symfusion.fusion.options import STAGE_KEYS, FusionMethod, check_config
from symfusion.presets import load_preset

FUSION_METHODS: dict[str, FusionMethod] = {
    method.name: method for method in (simple.METHOD, fisher.METHOD, regmean.METHOD, *ot.METHODS)
}

# Methods that read task data (statistic batches); the others ignore `batches`.
DATA_METHODS = tuple(name for name, method in FUSION_METHODS.items() if method.reads_data)

__all__ = ["DATA_METHODS", "FUSION_METHODS", "STAGE_KEYS", "check_fusion_config", "fusion_config", "fusion_method",
           "merge_models"]


def fusion_method(name: str) -> FusionMethod:
    """The declaration of a fusion method (raises naming the known ones)."""
    if name not in FUSION_METHODS:
        raise SymfusionError(f"unknown fusion method {name!r}; choose one of {', '.join(FUSION_METHODS)}")
    return FUSION_METHODS[name]


def check_fusion_config(config: Mapping[str, Any]) -> FusionMethod:
    """Check a fusion config (presets/fusion/<name>.yaml plus overrides) against its method's declaration."""
    method = fusion_method(config.get("name"))
    check_config(method, config)
    return method


def fusion_config(name: str, overrides: dict | None = None) -> dict:
    """The fusion preset <name>.yaml (name, num_batches) with every option the method declares at its default
    (fusion/options.py, the one place of each value), `overrides` (e.g. num_batches, alpha) on top, checked against
    the declaration: an unknown or badly typed option is one error line."""
    preset = OmegaConf.to_container(load_preset("fusion", name), resolve=True)
    defaults = copy.deepcopy(fusion_method(preset.get("name")).defaults())
    fusion = {**preset, **{k: v for k, v in defaults.items() if k not in preset}, **(overrides or {})}
    check_fusion_config(fusion)
    return fusion


def merge_models(method: str, models: list, batches: list[dict] | None = None, statistics: list | None = None,
                 **options) -> dict:
    """Fuse `models` (anchor first) with the named method; returns the merged state dict. `statistics`:
    per model, its precomputed statistic or None (methods that declare one: Fisher, RegMean)."""
    return fusion_method(method).merge(models, batches, statistics, **options)
