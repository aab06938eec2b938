"""A stage's command, declared once in its stage module: its options (type, default, check, help), the config groups it composes, its usage and what it runs.

A stage module (pipeline/stages/<name>.py) declares symfusion-<name> with @command("<name>") on a frozen dataclass
(a name of several words has hyphens, its module underscores: symfusion-align-many in stages/align_many.py);
its docstring is the usage line, `groups` the config groups it composes (Hydra's defaults list: group -> default
option), each field an option (its type, its default value, its check and its one-line help: option()), and its
run(cfg) runs the stage with the checked options (self) and the composed groups (cfg). From that one declaration:
Hydra's configuration of the command (config_node(), composed with the command line by pipeline/config.py), the
checks of a command line (read(): the first problem as one error line), --help's option list (help_lines()) and
docs/commands.md's option tables (markdown()). This module imports no stage (nor torch): the console script
imports the one stage it runs (declaration()).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pkgutil
import re
from dataclasses import field
from typing import ClassVar

from omegaconf import DictConfig, OmegaConf

from symfusion.pipeline.config import (Check, check_values, choice, compose_config, integer, limits, listing, mapping,
                                       number, text, texts_of)

__all__ = ["PATH", "PRECISION", "SPLIT", "Command", "checks", "choice", "command", "compose", "config_node", "declaration",
           "help_lines", "integer", "limits", "listing", "mapping", "markdown", "names", "number", "option", "read",
           "text", "texts"]

STAGES = "symfusion.pipeline.stages"
PATH = text()
SPLIT = choice("train", "validation", "test")
PRECISION = choice("auto", "bf16", "fp32")

# The task group's settings a command line may set (task.KEY=...), checked for every command that composes a task.
TASK_SETTINGS = {
    "task.split_seed": integer(0), "task.eval_batch_size": integer(1), "task.fusion_batch_size": integer(1),
    "task.limit": limits(optional=True), "task.max_length": integer(1, optional=True),
    "task.block_size": integer(2, optional=True), "task.tokenizer.vocab_size": integer(258, optional=True),
    "task.tokenizer.min_frequency": integer(1, optional=True),
    "task.train.epochs": integer(1), "task.train.batch_size": integer(1), "task.train.lr": number(0, strict_low=True),
    "task.train.weight_decay": number(0), "task.train.warmup_ratio": number(0, 1),
}


def option(check: Check, help: str, default=None):
    """A field of a command's options: its default value (None: unset), its check (pipeline/config.py), its help."""
    return field(default=default, metadata={"check": check, "help": help})


class Command:
    """What every command's declaration has besides its option fields (set by @command and by the declaration)."""
    name: ClassVar[str]
    groups: ClassVar[dict[str, str]] = {}      # config group -> its default option ("optional profile": may be absent)
    library: ClassVar[bool] = False            # a command of the library: runs without the checkout's conf/

    def check(self, cfg: DictConfig, given: set[str]) -> None:
        """What the options and groups must be together, after each option is checked alone (read()): a
        SymfusionError line before the stage runs; `given`: the options the command line sets. A command that
        composes a matching checks it here by the library's declaration (stages/common.match_config)."""

    def run(self, cfg: DictConfig) -> None:
        """The stage, with these checked options (self) and cfg's composed groups (task, matching, ...); every
        declaration defines its own (@command refuses one that does not), so this is never called."""
        raise NotImplementedError


# symfusion-<name> -> its declaration, registered by @command when its stage module is imported.
COMMANDS: dict[str, type] = {}


def command(name: str):
    """Declare symfusion-<name>: the decorated frozen dataclass (a Command) is its options, usage, groups and run."""
    def register(declared: type) -> type:
        if not _NAME.fullmatch(name):
            raise TypeError(f"a command's name is lower-case words joined by hyphens, got {name!r}")
        if not (dataclasses.is_dataclass(declared) and declared.__dataclass_params__.frozen
                and issubclass(declared, Command) and declared.run is not Command.run
                and (declared.__doc__ or "").startswith(f"symfusion-{name}")):
            raise TypeError(f"symfusion-{name}'s declaration must be a frozen dataclass, a Command with its own run, "
                            f"whose docstring is its usage (symfusion-{name} ...)")
        declared.name = name
        COMMANDS[name] = declared
        return declared
    return register


_NAME = re.compile(r"[a-z]+(-[a-z]+)*")


def command_name(name: str) -> str:
    """The command's name (align-many) of its name or of its stage module's (align_many)."""
    return name.replace("_", "-")


def is_stage(name: str) -> bool:
    """Whether pipeline/stages/<name>.py exists (a hyphen of the name an underscore of the module), found without
    importing it (only the light stages package)."""
    return bool(_NAME.fullmatch(command_name(name))) and \
        importlib.util.find_spec(f"{STAGES}.{name.replace('-', '_')}") is not None


def declaration(name: str) -> type:
    """symfusion-<name>'s declaration: pipeline/stages/<name>.py imported (it registers it); KeyError if none."""
    name = command_name(name)
    if name not in COMMANDS and is_stage(name):
        importlib.import_module(f"{STAGES}.{name.replace('-', '_')}")
    return COMMANDS[name]


def names() -> list[str]:
    """Every stage command, in alphabetical order: each module of pipeline/stages/ that declares one (all imported)."""
    stages = importlib.import_module(STAGES)
    for module in pkgutil.iter_modules(stages.__path__):
        importlib.import_module(f"{STAGES}.{module.name}")
    return sorted(COMMANDS)


def config_node(declared: type) -> dict:
    """Hydra's configuration of the command: its groups (the defaults list, then its own values) and every option
    at its default."""
    defaults = [{group: choice} for group, choice in declared.groups.items()] + ["_self_"]
    values = {f.name: list(f.default) if isinstance(f.default, tuple) else f.default
              for f in dataclasses.fields(declared)}
    return {"defaults": defaults, **values}


def reads_task(declared: type) -> bool:
    return "task" in declared.groups


def checks(name: str) -> dict[str, Check]:
    """KEY -> Check of symfusion-<name>'s options (declaration order), then the task's settings if it reads one."""
    declared = declaration(name)
    found = {f.name: f.metadata["check"] for f in dataclasses.fields(declared)}
    return {**found, **TASK_SETTINGS} if reads_task(declared) else found


def texts(name: str) -> frozenset[str]:
    """The options of symfusion-<name> whose values are paths or names (read as the text written)."""
    return texts_of(checks(name))


def compose(name: str, overrides: list[str]) -> DictConfig:
    """symfusion-<name>'s configuration composed with the command line's KEY=VALUE overrides (not yet checked)."""
    declared = declaration(name)
    return compose_config(name, config_node(declared), overrides, texts(name), declared.library)


def _plain(value):
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def read(name: str, cfg: DictConfig):
    """symfusion-<name>'s options of a composed configuration, each checked by its declaration (the first problem
    as one SymfusionError line), as its frozen dataclass."""
    declared = declaration(name)
    check_values(cfg, checks(name))
    names_ = [f.name for f in dataclasses.fields(declared)]
    undeclared = sorted(set(cfg) - set(g.removeprefix("optional ") for g in declared.groups) - set(names_))
    if undeclared:       # a configuration the declaration did not make: the project's mistake, not the user's
        raise TypeError(f"symfusion-{name}'s configuration has options {undeclared} that {declared.__name__} does "
                        "not declare")
    return declared(**{key: _plain(cfg.get(key)) for key in names_})


def help_lines(name: str, cfg: DictConfig) -> list[str]:
    """--help's option list: KEY=DEFAULT (the composed configuration's value), what it must be, what it means."""
    lines = []
    for f in dataclasses.fields(declaration(name)):
        shown = _plain(cfg.get(f.name))
        check = f.metadata["check"]
        must = check.describe + (", optional" if check.optional else ", required" if shown is None else "")
        lines.append(f"  {f.name}={'null' if shown is None else shown}  ({must}): {f.metadata['help']}")
    return lines


def markdown() -> str:
    """docs/commands.md's option tables: one per command, a row per option (its default, check and help)."""
    parts = []
    for name in names():
        declared = COMMANDS[name]
        rows = [f"#### `symfusion-{name}`", "", f"`{declared.__doc__.strip().splitlines()[0]}`", "",
                "| option | default | must be | what it is |", "|---|---|---|---|"]
        for f in dataclasses.fields(declared):
            check = f.metadata["check"]
            must = check.describe + (" (optional)" if check.optional else "")
            shown = f"[{', '.join(map(str, f.default))}]" if isinstance(f.default, tuple) else f.default
            default = "" if f.default is None else f"`{shown}`"
            rows.append(f"| `{f.name}` | {default} | {must} | {f.metadata['help'].replace('|', '&#124;')} |")
        groups = ", ".join(f"`{g.removeprefix('optional ')}={c}`" for g, c in declared.groups.items())
        if reads_task(declared):
            rows.append("| `task.*` | | the task's settings (`TASK_SETTINGS`) | the task's sizes, batches and "
                        "training settings, over the task's conf/task yaml |")
        parts.append("\n".join(rows + ([f"\ngroups: {groups}"] if groups else [])))
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":        # python -m symfusion.pipeline.command: the tables docs/commands.md holds
    from symfusion.pipeline import command as registry       # the module the stages register in, not __main__
    print(registry.markdown(), end="")
