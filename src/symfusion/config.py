"""Where the Hydra configuration lives (conf/) and how one yaml of a config group is read from it."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from symfusion.errors import SymfusionError


def find_conf_dir() -> Path:
    """The project's conf/ folder: inside the installed package (a wheel), or beside src/ in a checkout."""
    here = Path(__file__).resolve()
    for candidate in (here.parent / "conf", here.parents[2] / "conf"):
        if (candidate / "match.yaml").is_file():
            return candidate
    raise SystemExit("error: cannot find symfusion's conf/ folder; reinstall symfusion (pip install -e . in a checkout)")


CONF_DIR = find_conf_dir()


def group_path(group: str, name: str) -> Path:
    """conf/<group>/<name>.yaml, or a one-line error listing the group's options."""
    path = CONF_DIR / group / f"{name}.yaml"
    if not isinstance(name, str) or "/" in name or not path.is_file():
        known = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        raise SymfusionError(f"unknown {group} {name!r}; choose one of {', '.join(known)}")
    return path


def load_group(group: str, name: str) -> DictConfig:
    """conf/<group>/<name>.yaml with its `defaults` bases of the same group merged in."""
    config = OmegaConf.load(group_path(group, name))
    bases = [d for d in config.pop("defaults", []) if d != "_self_"]
    return OmegaConf.merge(*(load_group(group, base) for base in bases), config) if bases else config


def group_names(group: str) -> list[str]:
    """The option names of a config group (the yaml files of conf/<group>/)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
