"""Each command's options are declared once (pipeline/options.py): the declaration covers exactly the options
conf/<command>.yaml composes, checks a command line (read() gives the typed dataclass or the first problem as one
line), and is what --help and docs/commands.md's option tables show; the commands and the warm worker's preload
list come from the same registry."""
from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest
from omegaconf import open_dict

from symfusion.errors import SymfusionError
from symfusion.pipeline import cli
from symfusion.pipeline.config import compose_config
from symfusion.pipeline.options import GROUPS, OPTIONS, ReportOptions, checks, markdown, read, texts

ROOT = Path(__file__).resolve().parents[2]


def declared(name: str) -> list[str]:
    return [f.name for f in dataclasses.fields(OPTIONS[name])]


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_the_declaration_is_exactly_the_composed_options(name):
    assert set(compose_config(name, [])) - GROUPS == set(declared(name))


def test_the_commands_and_the_preload_list_come_from_the_registry():
    assert sorted(cli.COMMANDS) == sorted(OPTIONS)
    for script in re.findall(r'"symfusion\.pipeline\.cli:(\w+)"', (ROOT / "pyproject.toml").read_text()):
        assert callable(getattr(cli, script)), script        # every console script resolves (<name>_main)
    assert list(cli.CHECKS) == list(OPTIONS)
    for name, options in OPTIONS.items():
        assert options.stage in cli.WORKER_PRELOAD, name
        assert importlib.util.find_spec(options.stage) is not None, options.stage
        assert cli.CHECKS[name] == checks(name)


def test_read_gives_the_typed_options_or_the_first_problem():
    cfg = compose_config("report", ["artefact=1_2", "inputs=[a,true]", "output=out.csv"], texts("report"))
    options = read("report", cfg)
    assert options == ReportOptions(artefact="1_2", inputs=["a", "true"], output="out.csv")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.output = "other"
    cfg = compose_config("barrier", ["anchor=a", "source=b", "output=o", "points=1", "examples=0"], texts("barrier"))
    with pytest.raises(SymfusionError, match=r"^points=1 must be an integer >= 2$"):
        read("barrier", cfg)


def test_an_undeclared_option_of_a_conf_file_is_the_projects_mistake():
    cfg = compose_config("report", ["artefact=a", "inputs=[a]", "output=o"], texts("report"))
    with open_dict(cfg):
        cfg["extra"] = 1
    with pytest.raises(TypeError, match="extra"):
        read("report", cfg)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_help_lists_every_declared_option(name, capsys):
    assert cli.command_line(name, cli.COMMANDS[name], ["--help"]) == 0
    shown = capsys.readouterr().out
    listed = re.findall(r"^  ([a-z_]+)=", shown.split("configuration (the defaults, composed):")[0], re.M)
    assert listed == declared(name)


def test_the_commands_page_holds_the_generated_tables():
    page = (ROOT / "docs" / "commands.md").read_text()
    found = re.search(r"<!-- options: begin \(generated\) -->\n(.*)<!-- options: end -->", page, re.S)
    assert found, "docs/commands.md lost its generated option tables"
    assert found.group(1) == markdown(), "regenerate docs/commands.md's tables: python -m symfusion.pipeline.options"
