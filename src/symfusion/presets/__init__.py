"""The library's presets, shipped as package data: matching variants (matching/<name>.yaml), fusion methods' settings (fusion/<name>.yaml), symfusion-match's options (match.yaml).

A matching variant is defined once, in its yaml (a base variant's values come in through `defaults:`, merged by
presets/catalog.py, the one rule that the workflow loads too); `symfusion.matching.matching_config(name)` reads it
from here, and so does the pipeline's Hydra composition
(pipeline/config.py puts this folder on Hydra's search path), so every command and align() see the same
variant. What each value may be is declared by the library itself (MatchConfig, a FusionMethod's Options),
never here.
"""
from __future__ import annotations

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


def match_option(name: str):
    """A default of symfusion-match's options (match.yaml), for the callers that take them without Hydra."""
    return OmegaConf.load(catalog.PRESETS_DIR / "match.yaml")[name]


__all__ = ["GROUPS", "PRESETS_DIR", "catalog", "load_preset", "match_option", "preset_names", "preset_path"]
