"""The library's presets, shipped as package data: matching variants (matching/<name>.yaml), fusion methods' settings (fusion/<name>.yaml), symfusion-match's options (match.yaml).

A matching variant is defined once, in its yaml (a base variant's values come in through `defaults:`);
`symfusion.matching.matching_config(name)` reads it from here, and so does the pipeline's Hydra composition
(pipeline/config.py puts this folder on Hydra's search path), so every command and align() see the same
variant. What each value may be is declared by the library itself (MatchConfig, a FusionMethod's Options),
never here.
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from symfusion.errors import SymfusionError

PRESETS_DIR = Path(__file__).resolve().parent
GROUPS = ("matching", "fusion")
_WHAT = {"fusion": "fusion method"}


def preset_names(group: str) -> list[str]:
    """The presets of a group (the yaml files of presets/<group>/), sorted."""
    return sorted(p.stem for p in (PRESETS_DIR / group).glob("*.yaml"))


def preset_path(group: str, name: str) -> Path:
    """presets/<group>/<name>.yaml, or a one-line error listing the group's presets."""
    path = PRESETS_DIR / group / f"{name}.yaml"
    if not isinstance(name, str) or "/" in name or not path.is_file():
        raise SymfusionError(f"unknown {_WHAT.get(group, group)} {name!r}; choose one of {', '.join(preset_names(group))}")
    return path


def load_preset(group: str, name: str) -> DictConfig:
    """presets/<group>/<name>.yaml with its `defaults` bases of the same group merged in (as Hydra composes it)."""
    config = OmegaConf.load(preset_path(group, name))
    bases = [d for d in config.pop("defaults", []) if d != "_self_"]
    return OmegaConf.merge(*(load_preset(group, base) for base in bases), config) if bases else config


def match_option(name: str):
    """A default of symfusion-match's options (match.yaml), for the callers that take them without Hydra."""
    return OmegaConf.load(PRESETS_DIR / "match.yaml")[name]


__all__ = ["GROUPS", "PRESETS_DIR", "load_preset", "match_option", "preset_names", "preset_path"]
