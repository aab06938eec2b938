"""Long work says how far it is (issue 60): errors.steps draws a bar with the time left on a terminal only (or as
SYMFUSION_PROGRESS says), align(progress=...) on folders shows its layers and descent passes, a bar ends at its
count and is erased (a result or a refusal's one line stands alone on the terminal); progress never changes a result."""
from __future__ import annotations

import io
import re
import sys

import pytest
import torch

import symfusion
from symfusion import errors
from symfusion.errors import PROGRESS_VARIABLE, SymfusionError, erase_progress, steps
from symfusion.alignment import sharded, sharded_whole
from terminal import shown, terminal_stderr
from tiny_decoders import tiny_decoder
from tiny_models import tiny_model

BAR = re.compile(r"(\d+)/(\d+) \[")         # tqdm's `n/total [elapsed<left, rate]`


def counts(raw: str, what: str) -> list[tuple[int, int]]:
    """(done, total) of every frame the bar of `what` drew."""
    return [tuple(map(int, BAR.search(frame).groups())) for frame in re.split(r"[\r\n]", raw)
            if frame.startswith(what) and BAR.search(frame)]


@pytest.fixture(autouse=True)
def auto(monkeypatch):
    monkeypatch.delenv(PROGRESS_VARIABLE, raising=False)
    yield
    assert errors._OPEN == []


def test_a_bar_on_a_terminal_advances_and_ends_with_the_time_left():
    with terminal_stderr() as screen:
        assert list(steps(range(3), "points", "point")) == [0, 1, 2]
    frames = counts(screen.raw, "points")
    assert frames[0] == (0, 3) and frames[-1] == (3, 3)
    assert "points: 100%" in screen.raw and screen.lines == []                          # ended, then erased
    assert re.search(r"\[\d\d:\d\d<\d\d:\d\d", screen.raw)          # elapsed < time left


def test_no_bar_without_a_terminal_nor_when_switched_off(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    assert list(steps(range(3), "points")) == [0, 1, 2]
    assert stream.getvalue() == ""
    monkeypatch.setenv(PROGRESS_VARIABLE, "off")
    with terminal_stderr() as screen:
        assert list(steps(range(3), "points")) == [0, 1, 2]
    assert screen.raw == ""


def test_the_switch_forces_it_on_in_a_pipe_and_refuses_other_values(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setenv(PROGRESS_VARIABLE, "on")
    list(steps(range(2), "points"))
    assert counts(stream.getvalue(), "points")[-1] == (2, 2)
    monkeypatch.setenv(PROGRESS_VARIABLE, "sometimes")
    with pytest.raises(SymfusionError, match="SYMFUSION_PROGRESS='sometimes': give on, off or auto"):
        list(steps(range(2), "points"))


def test_a_loop_inside_another_shows_on_its_line_and_a_loop_left_early_ends_at_its_count_then_goes():
    with terminal_stderr() as screen:
        for i in steps(range(5), "descent passes", "pass"):
            for _ in steps(range(2), "layers"):
                pass
            if i == 1:
                break
    assert "layers 1/2" in screen.raw and counts(screen.raw, "descent passes")[-1] == (2, 2)
    assert "descent passes: 100%" in screen.raw and screen.lines == []


def test_an_error_inside_a_loop_leaves_nothing_once_erased():
    with terminal_stderr() as screen:
        with pytest.raises(ValueError):
            for i in steps(range(3), "outer"):
                for _ in steps(range(2), "layers"):
                    raise ValueError("refused")
        erase_progress()
        print("error: refused", file=sys.stderr)
    assert "outer" in screen.raw and screen.lines == ["error: refused"]


def folders(tmp_path, family="bert"):
    make = (lambda seed: tiny_model("bert", seed=seed)) if family == "bert" else \
        (lambda seed: tiny_decoder("llama", seed=seed, num_key_value_heads=2))
    for seed, name in ((1, "a"), (2, "s")):
        make(seed).save_pretrained(str(tmp_path / name), max_shard_size="20KB")
    return tmp_path / "s", tmp_path / "a"


def test_align_on_folders_shows_each_layer_and_keeps_its_result(tmp_path):
    source, anchor = folders(tmp_path)
    with terminal_stderr() as screen:
        _, shown_report = symfusion.align(source, anchor, output=tmp_path / "on")
        _, quiet_report = symfusion.align(source, anchor, output=tmp_path / "off", progress=False)
    frames = counts(screen.raw, "matching layers")
    assert frames[0] == (0, 2) and frames[-1] == (2, 2) and len(frames) == len(counts(screen.raw, "")) \
        and screen.lines == []                                                           # the quiet run drew nothing
    assert shown_report["distance_after"] == quiet_report["distance_after"]
    for name in (p.name for p in (tmp_path / "on").glob("*.safetensors")):
        assert (tmp_path / "on" / name).read_bytes() == (tmp_path / "off" / name).read_bytes()


def test_align_whole_group_streamed_shows_its_descent_passes(tmp_path):
    source, anchor = folders(tmp_path, "llama")
    stream = io.StringIO()
    sys_stderr = sys.stderr
    try:
        sys.stderr = stream                              # not a terminal: progress=True shows it all the same
        _, report = symfusion.align(source, anchor, matching="full_symmetry", output=tmp_path / "m", in_memory=False,
                                    progress=True)
    finally:
        sys.stderr = sys_stderr
    passes = counts(stream.getvalue(), "descent passes")
    assert passes[0] == (0, 20) and passes[-1] == (len(report["residual"]["descent"]),) * 2
    assert "block solves" in stream.getvalue() and counts(stream.getvalue(), "writing layers")[-1] == (3, 3)


def test_a_refusal_part_way_erases_the_bars(tmp_path, monkeypatch):
    source, anchor = folders(tmp_path)
    calls, real = [], sharded.match_models

    def refuse_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise SymfusionError("layer 1: refused")
        return real(*args, **kwargs)
    monkeypatch.setattr(sharded, "match_models", refuse_the_second)
    with terminal_stderr() as screen:
        with pytest.raises(SymfusionError, match="layer 1: refused"):
            symfusion.align(source, anchor, output=tmp_path / "m")
    assert counts(screen.raw, "matching layers")[0] == (0, 2) and screen.lines == []
    assert not (tmp_path / "m").exists()


def test_align_refuses_a_progress_that_is_no_bool(tmp_path):
    source, anchor = folders(tmp_path)
    with pytest.raises(SymfusionError, match="progress must be True, False or None"):
        symfusion.align(source, anchor, output=tmp_path / "m", progress="yes")


def test_shown_is_what_a_terminal_shows():
    assert shown("\rbar 0%\rbar 50%\r       \rerror: x\r\n") == ["error: x"]
    assert shown("a\nb\r\n") == ["a", "b"]


def test_align_many_shows_its_start_and_rounds_and_keeps_its_result():
    models = [tiny_model("bert", seed=s) for s in (1, 2, 3)]
    with terminal_stderr() as screen:
        shown_aligned, shown_report = symfusion.align_many(models, matching="rotation", max_rounds=2)
        quiet_aligned, quiet_report = symfusion.align_many(models, matching="rotation", max_rounds=2, progress=False)
    assert counts(screen.raw, "start: onto the models placed")[-1] == (2, 2)
    rounds = counts(screen.raw, "rounds")
    assert rounds[0] == (0, 2) and rounds[-1] == (len(shown_report["rounds"]),) * 2 and screen.lines == []
    assert shown_report["objective"] == quiet_report["objective"]
    for a, b in zip(shown_aligned, quiet_aligned):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    with pytest.raises(SymfusionError, match="progress must be True, False or None"):
        symfusion.align_many(models, progress=1)


def test_a_refusal_after_finished_phases_leaves_nothing_on_the_terminal(tmp_path, monkeypatch):
    """The whole-group descent's bars have ended when the write's block check refuses: none of them stays."""
    source, anchor = folders(tmp_path, "llama")
    monkeypatch.setattr(sharded_whole.BlockCheck, "deviation", lambda *args, **kwargs: float("nan"))
    with terminal_stderr() as screen:
        with pytest.raises(SymfusionError, match="layer 0: the matched block changes"):
            symfusion.align(source, anchor, matching="full_symmetry", output=tmp_path / "m", in_memory=False)
    assert counts(screen.raw, "descent passes") and counts(screen.raw, "writing layers")[0] == (0, 3)
    assert screen.lines == [] and not (tmp_path / "m").exists()
