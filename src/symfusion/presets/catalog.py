"""The one answer to a preset's name: its yaml with its `defaults:` bases merged in, and whether a matching reads data.

Plain Python (the standard library and PyYAML, which Snakemake itself needs): the workflow loads this file by its
path (workflow/rules/tracks.smk, config.smk's plain_module) where the package may not be installed, and the library
imports it (symfusion.presets: the presets as OmegaConf configs; symfusion.matching.config: MatchConfig). Every
caller passes its own reader and merger (OmegaConf's in the library, PyYAML and `merged` in the workflow); the rule
of how a name becomes a configuration is written here only. PRESETS_DIR is read at each call, so a copy of the
presets folder put in its place is seen by every caller that asks here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

import yaml

PRESETS_DIR = Path(__file__).resolve().parent
GROUPS = ("matching", "fusion")          # the library's groups: matching variants, fusion methods' presets
_WHAT = {"fusion": "fusion method"}


def names(folder: Path) -> list[str]:
    """The options of a config folder (its yaml files' names), sorted."""
    return sorted(p.stem for p in Path(folder).glob("*.yaml"))


def path(folder: Path, name: str, what: str, error: type[Exception] = LookupError) -> Path:
    """<folder>/<name>.yaml, or `error` with one line naming the folder's options."""
    found = Path(folder) / f"{name}.yaml"
    if not isinstance(name, str) or "/" in name or not found.is_file():
        raise error(f"unknown {what} {name!r}; choose one of {', '.join(names(folder))}")
    return found


def read(file: Path) -> dict:
    """A yaml file as plain data (an empty file: {})."""
    with open(file) as handle:
        return yaml.safe_load(handle) or {}


def merged(*configs: Mapping) -> dict:
    """The configs merged left to right, nested mappings key by key (as OmegaConf.merge does; lists are replaced)."""
    out: dict = {}
    for config in configs:
        for key, value in config.items():
            both = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
            out[key] = merged(out[key], value) if both else value
    return out


def composed(folder: Path, name: str, what: str, load: Callable = read, merge: Callable = merged,
             error: type[Exception] = LookupError):
    """<folder>/<name>.yaml with the bases its `defaults:` list names (options of the same folder) merged in under
    it: the bases in their order, then the file itself (Hydra's `_self_` last)."""
    config = load(path(folder, name, what, error))
    bases = [d for d in config.pop("defaults", []) if d != "_self_"]
    return merge(*(composed(folder, base, what, load, merge, error) for base in bases), config) if bases else config


def preset_path(group: str, name: str, error: type[Exception] = LookupError) -> Path:
    """presets/<group>/<name>.yaml of a library group, or `error` naming the group's presets."""
    return path(PRESETS_DIR / group, name, _WHAT.get(group, group), error)


def preset(group: str, name: str, load: Callable = read, merge: Callable = merged,
           error: type[Exception] = LookupError):
    """The preset `name` of a library group (presets/<group>/<name>.yaml), its bases merged in."""
    return composed(PRESETS_DIR / group, name, _WHAT.get(group, group), load, merge, error)


def preset_names(group: str) -> list[str]:
    """The presets of a library group, sorted."""
    return names(PRESETS_DIR / group)


def reads_data(matching: Mapping) -> bool:
    """Whether a matching's settings read the models' activations or loss (residual_solve=activations or
    refine=loss): the matching then needs data (align()'s data=, symfusion-match's data_task=)."""
    return matching.get("residual_solve") == "activations" or matching.get("refine") == "loss"


def matching_reads_data(name: str) -> bool:
    """Whether the matching preset `name` reads data (the workflow gives its match jobs a data_task then)."""
    return reads_data(preset("matching", name))
