"""Red team, class 2 of issue 36: commands with several outputs (symfusion-merge's eval_dir of one JSON per method,
symfusion-multimodel's output and output_models, symfusion-report's CSV + Markdown and PNG + PDF + CSV) swap them in
together: a failure part-way through leaves every output as it was (none, or the previous ones), and the one error
line says so, or names what stayed; a command that fails after completing cache files names them.

The class test enumerates the multi-output commands two ways and fails when a new one has no case: every function
of src/symfusion that claims several outputs (AST: more than one safe_output / claim_output / claimed call, one in
a loop, or writing_together), and every entry of hostile.COMMANDS with more than one output.
"""
from __future__ import annotations

import ast
import errno
from pathlib import Path

import pytest

from symfusion.io import marks, outputs
from symfusion.pipeline import cli
from hostile import COMMANDS, build_world, leftovers, outcome, snapshot

SRC = Path(__file__).resolve().parents[2] / "src" / "symfusion"
# module:function that claims several outputs -> the COMMANDS entries that exercise it
MULTI = {
    "symfusion.pipeline.stages.merge:run_merge_evaluate": ["symfusion-merge eval_dir"],
    "symfusion.pipeline.stages.multimodel:run_multimodel": ["symfusion-multimodel"],
    "symfusion.pipeline.report.results:claimed": ["symfusion-report table", "symfusion-report figure"],
    "symfusion.pipeline.report.results:write_claimed": ["symfusion-report table", "symfusion-report figure"],
    "symfusion.io.outputs:writing_together": ["symfusion-merge eval_dir", "symfusion-multimodel",
                                              "symfusion-report table", "symfusion-report figure"],
    "symfusion.io.outputs:writing": [name for name in COMMANDS if name != "symfusion-merge eval_dir"],
}
CLAIMING = {"safe_output", "claim_output", "claimed", "writing_together"}


def claims_several(function: ast.AST) -> bool:
    """Whether a function claims (or swaps in) more than one output: several claiming calls, one inside a loop or
    comprehension, or writing_together."""
    calls, looped = 0, False
    for node in ast.walk(function):
        if isinstance(node, (ast.For, ast.comprehension, ast.While)):
            looped |= any(isinstance(c, ast.Call) and _name(c) in CLAIMING for c in ast.walk(node))
        if isinstance(node, ast.Call) and _name(node) in CLAIMING:
            calls += 1
            looped |= _name(node) == "writing_together"
    return calls > 1 or looped


def _name(call: ast.Call) -> str | None:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def test_every_multi_output_command_has_a_case():
    found = set()
    for path in sorted(SRC.rglob("*.py")):
        module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and claims_several(node):
                found.add(f"{module}:{node.name}")
    assert sorted(found - set(MULTI)) == [], "functions claiming several outputs without a case: add them to MULTI"
    several = sorted(name for name, command in COMMANDS.items() if len(command(Path("w"), Path("o"))[1]) > 1)
    assert several == sorted(MULTI_COMMANDS), "a command with several outputs lacks a case here"
    assert set(MULTI_COMMANDS) <= {n for names in MULTI.values() for n in names}


MULTI_COMMANDS = ["symfusion-merge eval_dir", "symfusion-multimodel", "symfusion-report figure",
                  "symfusion-report table"]
CASES = [(name, k, previous) for name in MULTI_COMMANDS for k in range(len(COMMANDS[name](Path("w"), Path("o"))[1]))
         for previous in (False, True)]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("world"))


def failing_swap(monkeypatch, at: int) -> None:
    """The `at`-th swap of the next command fails as on a full disk (the ones before it succeed)."""
    real, calls = outputs.swap_in, []

    def swap(tmp, path):
        calls.append(path)
        if len(calls) == at + 1:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(tmp, path)
    monkeypatch.setattr(outputs, "swap_in", swap)


@pytest.mark.parametrize("name,at,previous", CASES,
                         ids=[f"{n}-swap {k}-{'over earlier outputs' if p else 'new'}" for n, k, p in CASES])
def test_a_failure_part_way_leaves_every_output_as_it_was(world, tmp_path, monkeypatch, name, at, previous):
    call, paths = COMMANDS[name](world, tmp_path / "out")
    if previous:
        assert outcome(call)[0] in (0, "ok")
    before = snapshot(tmp_path)
    failing_swap(monkeypatch, at)
    code, text = outcome(call)
    lines = text.strip().splitlines()
    assert code in (2, "error") and len(lines) == 1 and lines[0].startswith("error:"), text[-1500:]
    assert "no space left" in lines[0] and "Traceback" not in text
    if at:                                          # something was swapped in, then put back
        assert "put back, nothing was changed" in lines[0], lines[0]
    assert snapshot(tmp_path) == before                       # every output as it was: none, or the earlier ones
    assert all(leftovers(p) == [] for p in paths)


def test_what_cannot_be_put_back_is_named(tmp_path, monkeypatch):
    """When putting back fails too, the line names the outputs that stayed new."""
    claims = [outputs.claim_output(tmp_path / f"{n}.json", "test", lambda p: False) for n in ("a", "b")]
    failing_swap(monkeypatch, 1)
    monkeypatch.setattr(outputs, "_roll_back", lambda done: [claim for claim, *_ in done])
    try:
        with pytest.raises(outputs.SymfusionError, match=r"kept the new .*a\.json \(could not put"):
            with outputs.writing_together(claims) as temps:
                for tmp in temps:
                    tmp.write_text("{}")
    finally:
        for claim in claims:
            claim.release()


def test_a_failed_command_names_the_cache_files_it_completed(tmp_path, monkeypatch):
    """symfusion-data of a causal-LM task completes its tokenizer and token-block caches, then fails to write its
    manifest: the caches stay (no output; reused by the next run) and its one line says where."""
    cache, out = tmp_path / "cache", tmp_path / "data.json"
    args = ["task=lm_english", "task.options.corpora=[headlines]", f"task.cache_dir={cache}",
            "task.tokenizer.vocab_size=300", "task.limit={train: 8, validation: 4, test: 4}", f"output={out}"]
    failing_swap(monkeypatch, 0)
    written = len(marks.WRITTEN)
    code, text = outcome(lambda: cli.data_main(args))
    lines = text.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "no space left" in lines[0], text[-1500:]
    kept = marks.WRITTEN[written:]
    assert kept and f"kept {len(kept)} cache file(s) it completed, in {cache}" in lines[0], lines[0]
    assert not out.exists() and leftovers(out) == [] and sorted(cache.iterdir()) == sorted(set(kept))


def test_a_merge_writes_one_kind_of_output(world, tmp_path):
    """symfusion-merge given both a model folder (output=) and an evaluation folder (eval_dir=) without methods=
    used to write the folder and ignore eval_dir: one line, neither written."""
    from hostile import assert_refused

    out, evals = tmp_path / "merged", tmp_path / "evals"
    before = snapshot(tmp_path)
    code, text = outcome(lambda: cli.merge_main(["task=digits", "fusion=simple", f"models=[{world / 'vit_a'},"
                                                 f"{world / 'vit_b'}]", f"output={out}", f"eval_dir={evals}"]))
    assert "eval_dir" in assert_refused(code, text, tmp_path, before, out) and not evals.exists()
