"""Adding a stage is three places: its module in pipeline/stages/ (its work and its command's one declaration), its
console script in pyproject.toml and its workflow rule. This test adds a stage module (in a folder put on the stages
package's path) and runs it through the first: the command line is composed, checked and run, --help lists its
options, and docs/commands.md's generator and the warm worker's stage list find it; nothing else is edited."""
from __future__ import annotations

import json
import textwrap

import pytest

from symfusion import errors
from symfusion.pipeline import cli, command, stages

STAGE = '''
"""A stage added by a test: writes its greeting as JSON."""
from __future__ import annotations

import json
from dataclasses import dataclass

from symfusion.pipeline.command import PATH, Command, command, integer, option


@command("greet")
@dataclass(frozen=True)
class Greet(Command):
    """symfusion-greet output=FILE.json [times=N]"""
    output: str = option(PATH, "FILE.json: the greeting")
    times: int = option(integer(1), "how many times", 2)

    def run(self, cfg) -> None:
        with open(self.output, "w") as handle:
            json.dump({"greeting": ["hello"] * self.times}, handle)
'''


@pytest.fixture
def added_stage(tmp_path, monkeypatch):
    folder = tmp_path / "more_stages"
    folder.mkdir()
    (folder / "greet.py").write_text(textwrap.dedent(STAGE))
    monkeypatch.setattr(stages, "__path__", [*stages.__path__, str(folder)])
    yield
    command.COMMANDS.pop("greet", None)


def test_a_stage_module_is_the_whole_command(added_stage, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(errors, "NOTES", [])           # no note another test of this process left behind
    output = tmp_path / "hello.json"
    assert cli.command_line("greet", cli.greet_command, [f"output={output}", "times=3"]) == 0
    assert json.loads(output.read_text()) == {"greeting": ["hello"] * 3}
    assert capsys.readouterr().err == ""

    assert cli.command_line("greet", cli.greet_command, [f"output={tmp_path / 'no.json'}", "times=0"]) == 2
    assert capsys.readouterr().err.strip() == "error: times=0 must be an integer >= 1"
    assert not (tmp_path / "no.json").exists()

    assert cli.command_line("greet", cli.greet_command, ["--help"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("usage: symfusion-greet output=FILE.json [times=N]")
    assert "  times=2  (an integer >= 1): how many times" in shown

    assert "greet" in command.names()                         # the warm worker imports it; docs/commands.md shows it
    assert "#### `symfusion-greet`" in command.markdown()
    assert callable(cli.greet_main)                           # the console script pyproject.toml would name
