"""The library's presets, shipped as package data: matching variants (matching/<name>.yaml), fusion methods' settings (fusion/<name>.yaml), each family's matching defaults (families.yaml).

A matching variant is defined once, in its yaml (a base variant's values come in through `defaults:`, merged by
presets/catalog.py, the one rule that the workflow loads too); `symfusion.matching.matching_config(name)` reads it
from here, and so does the pipeline's Hydra composition
(pipeline/config.py puts this folder on Hydra's search path), so every command and align() see the same
variant. What each value may be is declared by the library itself (MatchConfig, a FusionMethod's Options),
never here.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from symfusion.errors import SymfusionError
from symfusion.presets import catalog
from symfusion.presets.catalog import GROUPS, PRESETS_DIR


def preset_names(group: str) -> list[str]:
    """The presets of a group (the yaml files of presets/<group>/), sorted."""
    return catalog.preset_names(group)


def preset_path(group: str, name: str) -> Path:
    """presets/<group>/<name>.yaml, or a one-line error listing the group's presets."""
    return catalog.preset_path(group, name, SymfusionError)


def load_preset(group: str, name: str) -> DictConfig:
    """presets/<group>/<name>.yaml with its `defaults` bases of the same group merged in (as Hydra composes it;
    the rule: catalog.composed)."""
    return catalog.preset(group, name, OmegaConf.load, OmegaConf.merge, SymfusionError)


@lru_cache(maxsize=None)
def _families() -> dict:
    return catalog.read(catalog.PRESETS_DIR / "families.yaml")


def family_matching(family: str) -> dict:
    """How `family` is matched where a matching leaves it to the family (presets/families.yaml): {"heads": whether
    whole heads are permuted, "refine": {setting: value} of the learned refinement}."""
    found = _families().get(family) or {}
    return {"heads": bool(found.get("heads", False)), "refine": dict(found.get("refine") or {})}


__all__ = ["GROUPS", "PRESETS_DIR", "catalog", "family_matching", "load_preset", "preset_names", "preset_path"]
