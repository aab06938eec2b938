"""Long commands say how far they are (issue 60): symfusion-train (per batch of each epoch), symfusion-match (per
layer), symfusion-barrier (per point of the path), symfusion-layers (per layer subset) and symfusion-report (per
input checked) draw a bar with the time left on a pseudo-terminal that advances and ends; the same runs with stderr
not a terminal print no progress; a refusal part-way with progress on is one line on the terminal."""
from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest

from symfusion import errors
from symfusion.errors import PROGRESS_VARIABLE, SymfusionError
from symfusion.alignment import sharded
from symfusion.pipeline import cli
from hostile import COMMANDS, build_world
from terminal import terminal_stderr

BAR = re.compile(r"(\d+)/(\d+) \[")
# command -> the bar it draws and its steps on the tests' world (digits: 128 training images in batches of 32; one
# ViT layer: 2L+1 = 3 subsets; BERT: 2 layers)
BARS = {"symfusion-train": ("epoch 1/1", 4), "symfusion-match": ("matching layers", 2),
        "symfusion-barrier": ("path points", 2), "symfusion-layers": ("layer subsets", 3),
        "symfusion-report table": ("checking inputs", None)}


def counts(raw: str, what: str) -> list[tuple[int, int]]:
    return [tuple(map(int, BAR.search(frame).groups())) for frame in re.split(r"[\r\n]", raw)
            if frame.startswith(what) and BAR.search(frame)]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("world"))


@pytest.fixture(autouse=True)
def auto(monkeypatch):
    monkeypatch.delenv(PROGRESS_VARIABLE, raising=False)
    yield
    assert errors._OPEN == []


def exit_code(call) -> int:
    try:
        call()
    except SystemExit as done:
        return done.code
    return 0


@pytest.mark.parametrize("command", sorted(BARS))
def test_a_long_command_shows_its_progress_on_a_terminal_only(command, world, tmp_path, monkeypatch, capsys):
    what, total = BARS[command]
    call, outputs = COMMANDS[command](world, tmp_path / "tty")
    with terminal_stderr() as screen:
        assert exit_code(call) == 0
    frames = counts(screen.raw, what)
    total = total or frames[0][1]
    assert frames[0] == (0, total) and frames[-1] == (total, total), screen.raw
    assert [done for done, _ in frames] == sorted(done for done, _ in frames)              # it only advances
    assert not any("%|" in line for line in screen.lines)                            # and is gone once it ends
    assert all(Path(p).exists() for p in outputs)
    call, _ = COMMANDS[command](world, tmp_path / "pipe")
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert exit_code(call) == 0
    assert "%|" not in sys.stderr.getvalue() and "\r" not in sys.stderr.getvalue()


def test_a_refusal_part_way_with_progress_on_is_one_line(world, tmp_path, monkeypatch, capsys):
    calls, real = [], sharded.match_models

    def refuse_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise SymfusionError("layer 1: refused here")
        return real(*args, **kwargs)
    monkeypatch.setattr(sharded, "match_models", refuse_the_second)
    call, outputs = COMMANDS["symfusion-match"](world, tmp_path)
    with terminal_stderr() as screen:
        assert exit_code(call) == 2
    assert counts(screen.raw, "matching layers")[0] == (0, 2)
    assert screen.lines == ["error: layer 1: refused here"] and not any(Path(p).exists() for p in outputs)


def test_a_report_refused_at_its_second_input_is_one_line(world, tmp_path):
    inputs = sorted(str(p) for p in (world / "evals").glob("*.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"metrics": 1}')
    with terminal_stderr() as screen:
        assert exit_code(lambda: cli.report_main(["artefact=table2", f"inputs=[{inputs[0]},{bad}]",
                                                  f"output={tmp_path / 't.csv'}"])) == 2
    assert counts(screen.raw, "checking inputs")[0] == (0, 2)
    assert len(screen.lines) == 1 and screen.lines[0].startswith("error:") and "bad.json" in screen.lines[0]
    assert not (tmp_path / "t.csv").exists()


def test_a_mistaken_switch_is_one_line_before_anything_runs(world, tmp_path, monkeypatch):
    monkeypatch.setenv(PROGRESS_VARIABLE, "yes please")
    call, outputs = COMMANDS["symfusion-match"](world, tmp_path)
    with terminal_stderr() as screen:
        assert exit_code(call) == 2
    assert screen.lines == ["error: SYMFUSION_PROGRESS='yes please': give on, off or auto (auto: progress on a "
                            "terminal)"]
    assert not any(Path(p).exists() for p in outputs)
