"""Each command is declared once, in its stage module (pipeline/command.py's @command): the declaration is exactly the
options its configuration composes, with their defaults; it checks a command line (read() gives the typed dataclass
or the first problem as one line), and is what --help and docs/commands.md's option tables show; the console scripts
and the warm worker's stage modules come from the same registry."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from omegaconf import open_dict

from symfusion.errors import SymfusionError
from symfusion.pipeline import cli, command
from symfusion.pipeline.command import compose, config_node, declaration, markdown, names, read
from symfusion.pipeline.stages.report import Report

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = names()


def declared(name: str) -> list[str]:
    return [f.name for f in dataclasses.fields(declaration(name))]


def groups(name: str) -> set[str]:
    return {group.removeprefix("optional ") for group in declaration(name).groups}


@pytest.mark.parametrize("name", COMMANDS)
def test_the_configuration_is_exactly_the_declared_options_at_their_defaults(name):
    cfg = compose(name, [])
    assert set(cfg) - groups(name) == set(declared(name))
    for f in dataclasses.fields(declaration(name)):
        value = cfg[f.name]
        assert (list(value) if f.default is not None and isinstance(f.default, tuple) else value) == \
            (list(f.default) if isinstance(f.default, tuple) else f.default), f.name


def test_every_stage_module_declares_its_command_and_every_script_resolves():
    stages = sorted(p.stem.replace("_", "-") for p in (ROOT / "src/symfusion/pipeline/stages").glob("*.py")
                    if p.stem not in ("__init__", "common", "mergekit"))       # helpers of several stages
    assert COMMANDS == stages                 # symfusion-align-many's module: stages/align_many.py
    scripts = re.findall(r'^symfusion-([\w-]+) = "symfusion\.pipeline\.cli:(\w+)"',
                         (ROOT / "pyproject.toml").read_text(), re.M)
    assert sorted(name for name, _ in scripts if name != "worker") == COMMANDS
    for name, script in scripts:
        assert callable(getattr(cli, script)), script         # <name>_main of every console script
        assert script == f"{name.replace('-', '_')}_main"
    with pytest.raises(AttributeError):
        cli.frobnicate_main
    with pytest.raises(KeyError):
        declaration("common")                                 # a stage helper module declares no command


def test_read_gives_the_typed_options_or_the_first_problem():
    cfg = compose("report", ["artefact=1_2", "inputs=[a,true]", "output=out.csv"])
    options = read("report", cfg)
    assert options == Report(artefact="1_2", inputs=["a", "true"], output="out.csv")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.output = "other"
    cfg = compose("barrier", ["anchor=a", "source=b", "output=o", "points=1", "examples=0"])
    with pytest.raises(SymfusionError, match=r"^points=1 must be an integer >= 2$"):
        read("barrier", cfg)


def test_only_a_plus_override_adds_a_key_so_the_bare_configuration_is_composed_only_then():
    # config.compose_config composes the configuration without the command line only for an override with +
    # (its keys find an added option): sound while no yaml of conf/ or the presets moves its group's keys to the
    # top level (`# @package _global_`), and while a group's choice keeps the top-level keys
    yamls = [*(ROOT / "conf").rglob("*.yaml"), *(ROOT / "src/symfusion/presets").rglob("*.yaml")]
    assert len(yamls) > 50
    assert [p for p in yamls if "@package" in p.read_text()] == []
    bare = set(compose("match", ["anchor=a", "source=b", "output=o"]))
    chosen = compose("match", ["anchor=a", "source=b", "output=o", "matching=full_symmetry_learned",
                               "data_task=fashion_mnist"])
    assert set(chosen) == bare and chosen.matching.refine == "loss"
    with pytest.raises(SymfusionError, match=r"^foo is not an option of symfusion-match; its options are .*anchor"):
        compose("match", ["anchor=a", "source=b", "output=o", "+foo=1"])
    with pytest.raises(SymfusionError, match=r"^foo is not an option of symfusion-match; its options are .*anchor"):
        compose("match", ["anchor=a", "source=b", "output=o", "foo=1"])


def test_an_undeclared_option_in_a_configuration_is_the_projects_mistake():
    cfg = compose("report", ["artefact=a", "inputs=[a]", "output=o"])
    with open_dict(cfg):
        cfg["extra"] = 1
    with pytest.raises(TypeError, match="extra"):
        read("report", cfg)


def test_a_declaration_must_be_a_frozen_dataclass_with_its_usage():
    @dataclasses.dataclass
    class Loose(command.Command):
        """symfusion-loose"""

    @dataclasses.dataclass(frozen=True)
    class Silent(command.Command):
        pass                                 # dataclass() writes a docstring of its own: not a usage line
    for name, declared in (("loose", Loose), ("silent", Silent)):
        with pytest.raises(TypeError, match="frozen dataclass"):
            command.command(name)(declared)
        assert name not in command.COMMANDS

    @dataclasses.dataclass(frozen=True)
    class Underscored(command.Command):
        """symfusion-two_words"""
        def run(self, cfg) -> None:
            pass
    with pytest.raises(TypeError, match="hyphens"):       # its console script would be symfusion-two-words
        command.command("two_words")(Underscored)
    assert "two_words" not in command.COMMANDS


def test_the_configuration_node_is_the_groups_then_the_options():
    node = config_node(declaration("train"))
    assert node["defaults"] == [{"task": "fashion_mnist"}, {"model": "vit_mini"}, {"profile": "mini"}, "_self_"]
    assert node["seed"] == 0 and node["output"] is None and node["precision"] == "auto"


@pytest.mark.parametrize("name", COMMANDS)
def test_help_lists_every_declared_option(name, capsys):
    assert cli.command_line(name, cli.stage_command(name), ["--help"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"usage: symfusion-{name} ")
    listed = re.findall(r"^  ([a-z_]+)=", shown.split("configuration (the defaults, composed):")[0], re.M)
    assert listed == declared(name)


def test_the_commands_page_holds_the_generated_tables():
    page = (ROOT / "docs" / "commands.md").read_text()
    found = re.search(r"<!-- options: begin \(generated\) -->\n(.*)<!-- options: end -->", page, re.S)
    assert found, "docs/commands.md lost its generated option tables"
    assert found.group(1) == markdown(), "regenerate docs/commands.md's tables: python -m symfusion.pipeline.command"
