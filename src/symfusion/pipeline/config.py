"""Where the pipeline's Hydra configuration lives (conf/ of the checkout, with the library's presets on its search path), how a group's yaml is read, and how a command line is composed and checked."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Callable

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from symfusion.errors import SymfusionError
from symfusion.presets import GROUPS as PRESET_GROUPS, catalog, load_preset, preset_names, preset_path

# The pipeline's conf/ (profiles, tasks, models, the stages' configs, experiments.yaml, the paper's CSVs): in the
# checkout beside src/, never in the wheel. The matching and fusion groups and symfusion-match's own config are the
# library's presets (symfusion/presets/, package data), found through Hydra's search path.
CONF_DIR = Path(__file__).resolve().parents[3] / "conf"


def group_path(group: str, name: str) -> Path:
    """<group>/<name>.yaml (a preset of the library, or conf/<group>/ of the pipeline), or a one-line error listing
    the group's options."""
    if group in PRESET_GROUPS:
        return preset_path(group, name)
    if not CONF_DIR.is_dir():
        raise SymfusionError(f"{group} {name!r} is a setting of the pipeline: its conf/{group}/ lies in a checkout of "
                             "symfusion, not installed with the package")
    return catalog.path(CONF_DIR / group, name, group, SymfusionError)


def load_group(group: str, name: str) -> DictConfig:
    """<group>/<name>.yaml with its `defaults` bases of the same group merged in (the library's one rule:
    presets/catalog.py)."""
    if group in PRESET_GROUPS:
        return load_preset(group, name)
    return catalog.composed(group_path(group, name).parent, name, group, OmegaConf.load, OmegaConf.merge,
                            SymfusionError)


def profile_sources(profile) -> dict:
    """Where a profile's models and datasets come from when not from the Hub: the manifest that
    profile.sources names ({"models": {name: patch}, "tasks": {name: patch}}), or {} (the Hub, or offline)."""
    path = (profile or {}).get("sources")
    if not path:
        return {}
    manifest = Path(str(path))
    if not manifest.is_file():
        raise SymfusionError(f"profile sources {path} do not exist; write them first (scripts/make_standins.py)")
    try:
        return json.loads(manifest.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise SymfusionError(f"profile sources {path} are not a readable manifest; rewrite them") from error


def group_names(group: str) -> list[str]:
    """The option names of a config group (the yaml files of presets/<group>/ or conf/<group>/)."""
    if group in PRESET_GROUPS:
        return preset_names(group)
    return catalog.names(CONF_DIR / group)


# ---------------------------------------------------------------- the command line: composing and checking

def _one_line(error: Exception) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


_KEY = re.compile(r"[+~]{0,2}[A-Za-z_][\w.\-]*")
_PARSER = OverridesParser.create()


def _quoted(value: str) -> str:
    """`value` as one Hydra quoted string (backslashes before a quote or the end doubled, quotes escaped)."""
    return "'" + re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value).replace("'", "\\'") + "'"


def literal_override(override: str) -> str:
    """KEY=VALUE as given when Hydra reads it as one plain value (or as a list, dict or quoted string the user
    wrote); else KEY='VALUE' quoted, so that a path with characters Hydra's grammar leaves out (non-ASCII
    letters, ', ~, #, &, ;, !, (, =, a comma) is read as the path it is, not refused or split into a sweep."""
    key, sep, value = override.partition("=")
    if not sep or not _KEY.fullmatch(key) or not value or value[0] in "[{'\"":
        return override
    try:
        if not _PARSER.parse_override(override).is_sweep_override():
            return override
    except (HydraException, OmegaConfBaseException):
        pass
    return f"{key}={_quoted(value)}"


_FLAT_LIST = re.compile(r"\[([^\[\]{}'\"]*)\]")


def _read_as(value: str):
    try:
        return _PARSER.parse_override(f"x={value}").value()
    except (HydraException, OmegaConfBaseException):
        return value


def _as_text(value: str) -> str:
    """`value` quoted when Hydra would read it as a number or a boolean (1_2 -> 12, true -> True, 1e3 -> 1000.0)."""
    read = _read_as(value)
    return _quoted(value) if read is not None and not isinstance(read, str) else value


def text_override(override: str, texts: frozenset[str]) -> str:
    """KEY=VALUE of a key whose value is a path or name (`texts`) kept as the text written: output=1_2 stays the
    path '1_2' (not the integer 12), output=true the path 'true'; each item of a list [a,1_2] too. null stays null
    (the option left unset); a quoted value, or a list with quotes or brackets inside, is taken as written."""
    key, sep, value = override.partition("=")
    if not sep or key.lstrip("+~") not in texts or not value or value[0] in "{'\"":
        return override
    listed = _FLAT_LIST.fullmatch(value)
    if listed:
        items = [item.strip() for item in listed.group(1).split(",")] if listed.group(1).strip() else []
        return f"{key}=[{','.join(_as_text(item) for item in items)}]"
    return override if value[0] == "[" else f"{key}={_as_text(value)}"


def search_folders(config_name: str, library: bool) -> tuple[Path, list[Path]]:
    """(the folder Hydra starts from: the pipeline's conf/, or the library's presets where conf/ is not, the other
    folders it searches for its groups); a one-line error for a command of the pipeline (not `library`) run where
    conf/ is not (a wheel)."""
    if CONF_DIR.is_dir():
        return CONF_DIR, [catalog.PRESETS_DIR]
    if not library:
        raise SymfusionError(f"symfusion-{config_name} is a command of the pipeline: run it in a checkout of symfusion "
                             "(its configuration, conf/, is not installed with the package)")
    return catalog.PRESETS_DIR, []


def compose_config(config_name: str, node: dict, overrides: list[str], texts: frozenset[str] = frozenset(),
                   library: bool = False) -> DictConfig:
    """symfusion-<config_name>'s configuration `node` (command.config_node: its groups' defaults and its options')
    with the command line's KEY=VALUE overrides (those of `texts`, paths and names, kept as the text written);
    Hydra's errors as one line. `library`: a command of the library, composed without conf/ where it is not."""
    overrides = [literal_override(text_override(o, texts)) for o in overrides]
    home, others = search_folders(config_name, library)
    stored = f"symfusion-{config_name}"            # a name no file of conf/ or the presets has
    ConfigStore.instance().store(name=stored, node=node)
    searched = ["hydra.searchpath=[" + ",".join(_quoted(f"file://{folder}") for folder in others) + "]"]
    with initialize_config_dir(config_dir=str(home), version_base=None, job_name=config_name):
        def options() -> tuple[set, str]:          # the keys without the command line's overrides, and as listed
            base = compose(config_name=stored, overrides=searched)
            return set(base), ", ".join(sorted(k for k in base if k != "hydra"))
        try:
            cfg = compose(config_name=stored, overrides=searched + overrides)
        except MissingConfigException as error:
            group = (error.missing_cfg_file or "").rsplit("/", 1)[0]
            given = next((o for o in overrides if o.lstrip("+~").split("=", 1)[0] == group), group)
            choices = ", ".join(error.options or group_names(group))
            raise SymfusionError(f"{given}: no such {group} option; choose one of {choices}") from error
        except OverrideParseException as error:
            raise SymfusionError(f"cannot read the command line ({_one_line(error)}); write options as KEY=VALUE, "
                                 "lists as KEY=[a,b]") from error
        except (HydraException, OmegaConfBaseException) as error:
            message = _one_line(error)
            if "Could not override" in message:
                key = message.split("'")[1] if "'" in message else message
                raise SymfusionError(f"{key} is not an option of symfusion-{config_name}; its options are "
                                     f"{options()[1]}") from error
            raise SymfusionError(f"cannot build the configuration: {message}") from error
        # only an override with + can add a key (no group of conf/ or the presets is @package _global_): the
        # configuration without the overrides is composed (a second time) just then
        if any(o.startswith("+") for o in overrides):
            keys, listed = options()
            unknown = sorted(set(cfg) - keys)
            if unknown:
                raise SymfusionError(f"{unknown[0]} is not an option of symfusion-{config_name}; its options are "
                                     f"{listed}")
    return cfg


class Check:
    """A check of one configuration value: `check(value)` returns None or what the value must be."""

    def __init__(self, describe: str, test: Callable[[object], bool], optional: bool = False,
                 phrase: str = " must be ", keeps_text: bool = False):
        self.describe, self.test, self.optional, self.phrase = describe, test, optional, phrase
        self.keeps_text = keeps_text          # a path or name: read from the command line as the text written

    def problem(self, value) -> str | None:
        """None when the value is acceptable, else the rest of the error line after KEY=VALUE."""
        if value is None:
            return None if self.optional else " is required"
        return None if self.test(value) else f"{self.phrase}{self.describe}"


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(low: int | None = None, optional: bool = False) -> Check:
    bound = f" >= {low}" if low is not None else ""
    return Check(f"an integer{bound}", lambda v: _is_int(v) and (low is None or v >= low), optional)


def number(low: float | None = None, high: float | None = None, strict_low: bool = False,
           optional: bool = False) -> Check:
    """A finite number in [low, high] (or (low, high] with strict_low)."""
    def test(value) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        return (low is None or (value > low if strict_low else value >= low)) and (high is None or value <= high)
    parts = [f"{'>' if strict_low else '>='} {low}" if low is not None else "", f"<= {high}" if high is not None else ""]
    return Check("a finite number " + " and ".join(p for p in parts if p), test, optional)


def text(optional: bool = False) -> Check:
    return Check("a path or name", lambda v: isinstance(v, str) and v.strip() != "", optional, keeps_text=True)


def choice(*options, optional: bool = False) -> Check:
    return Check(f"one of {', '.join(map(str, options))}", lambda v: v in options, optional, phrase="; choose ")


def flag(optional: bool = False) -> Check:
    return Check("true or false", lambda v: isinstance(v, bool), optional)


def listing(item: Check, minimum: int = 0, optional: bool = False) -> Check:
    def test(value) -> bool:
        return (OmegaConf.is_list(value) or isinstance(value, (list, tuple))) and len(value) >= minimum \
            and all(item.problem(v) is None for v in value)
    return Check(f"a list of {minimum}+ items, each {item.describe}", test, optional, keeps_text=item.keeps_text)


def mapping(optional: bool = False) -> Check:
    return Check("a {key: value} mapping", lambda v: OmegaConf.is_dict(v) or isinstance(v, dict), optional)


def texts_of(checks: dict[str, Check]) -> frozenset[str]:
    """The options whose values are paths or names (read from the command line as the text written)."""
    return frozenset(key for key, check in checks.items() if check.keeps_text)


def limits(optional: bool = False) -> Check:
    """A task's limit: {split: cap} with splits train, validation, test and each cap null or an integer >= 0 (one
    rule for every task kind, checked before any data is read)."""
    def test(value) -> bool:
        if not (OmegaConf.is_dict(value) or isinstance(value, dict)):
            return False
        return all(k in ("train", "validation", "test") and (v is None or _is_int(v) and v >= 0)
                   for k, v in value.items())
    return Check("a {split: cap} mapping of splits train, validation, test to null or an integer >= 0", test, optional)


def check_values(cfg: DictConfig, checks: dict[str, Check]) -> None:
    """Every checked KEY (dotted) of `cfg` against its Check; the first problem as one SymfusionError line."""
    for key, check in checks.items():
        try:
            value = OmegaConf.select(cfg, key, throw_on_missing=False)
        except OmegaConfBaseException as error:
            raise SymfusionError(f"{key}: {_one_line(error)}") from error
        if key.split(".")[0] not in cfg:
            continue
        problem = check.problem(value)
        if problem:
            shown = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
            raise SymfusionError(f"{key}={shown!r}{problem}" if value is not None else f"{key}{problem}")


def command_line_first(cfg: DictConfig, given: set[str]) -> None:
    """A task setting given on the command line (task.KEY=...) wins over the profile's: the profile's task_patch and
    source_patch lose that key (task.limit=... drops the patch's whole limit; task.limit.train=... its train cap
    only); a setting the profile's sources manifest (profile.sources: the stand-ins' data and models) decides is
    refused in one line, since the profile cannot run without it; so is a model setting (model.KEY=...) the manifest
    decides (a model's base_model), which would otherwise replace the command line's silently."""
    profile = cfg.get("profile")
    if not OmegaConf.is_dict(profile):
        return
    named = {group: sorted(k[len(group) + 1:] for k in given if k.startswith(group + "."))
             for group in ("task", "model")}
    for group, names in named.items():
        if names and profile.get("sources"):
            decided = profile_sources(profile).get(group + "s", {}).get(OmegaConf.select(cfg, group + ".name")) or {}
            for key in (k for k in names if OmegaConf.select(OmegaConf.create(decided), k) is not None):
                raise SymfusionError(f"{group}.{key} is set by profile {profile.get('name')}'s sources "
                                     f"({profile.sources}); drop it, or run under another profile")
    keys = named["task"]
    if not keys:
        return
    sections = [v for v in profile.values() if OmegaConf.is_dict(v)]
    patches = [s.get("task_patch") for s in sections]
    patches += [p for s in sections if OmegaConf.is_dict(s.get("source_patch")) for p in s.source_patch.values()]
    with open_dict(cfg):
        for patch in (p for p in patches if OmegaConf.is_dict(p)):
            for key in keys:
                parent, _, leaf = key.rpartition(".")
                node = OmegaConf.select(patch, parent) if parent else patch
                if OmegaConf.is_dict(node) and leaf in node:
                    node.pop(leaf)


DATA_OPTIONS = ("data_task", "data_batches", "data_split")     # symfusion-match's options of the data it reads


def given_options(argv: list[str]) -> set[str]:
    """The options the command line sets (Hydra's +, ++ and ~ prefixes stripped)."""
    return {override.partition("=")[0].lstrip("+~") for override in argv}


def check_data_options(cfg: DictConfig, matching, given: set[str]) -> None:
    """symfusion-match's data options against its matching (its MatchConfig): a matching that reads data needs
    data_task; a data option the command line sets (to anything but null) for one that reads none would be left
    unread, though the user expects it read (the workflow sets data_task=null for such jobs). One error line."""
    name = cfg.matching.name
    if matching.needs_data:
        if not cfg.get("data_task"):
            raise SymfusionError(f"matching={name} reads the models' activations or loss: give data_task=NAME (a "
                                 "conf/task the models solve)")
        return
    unread = [k for k in DATA_OPTIONS if k in given and cfg.get(k) is not None]
    if unread:
        raise SymfusionError(f"matching={name} {matching.reads}, no data: leave {unread[0]}={cfg[unread[0]]} "
                             "out, or choose a matching that reads it (full_symmetry_learned)")
