"""Red team, class 7 of issue 36: every refusal of every console script is exactly one line on stderr, run as the
user runs it (each script's first refusal in a new interpreter of the script's entry point; its others each in a
process forked, as the warm worker forks a job, from one that imported every stage: tests/forked.py): exit code 2,
one `error:` line, no traceback, nothing written. That includes refusals after the command has printed something to say otherwise (symfusion-compare's
argparse usage; a Hydra command's "note: ... overridden"; Python warnings of a Fisher pass; a warm worker's note
that it did not take the job): those are said only when the command succeeds. Every case runs with progress forced
on (SYMFUSION_PROGRESS=on, issue 60), stderr read as a terminal shows it: a bar drawn before a refusal (the
report's check of its inputs) is erased, so the error line is all that shows.

The class test enumerates the console scripts from pyproject.toml's [project.scripts] and fails for one without
refusal cases here.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import transformers as tf

from symfusion.errors import PROGRESS_VARIABLE
from symfusion.pipeline import cli, warm
from forked import run_forked
from hostile import build_world, console_scripts, snapshot
from terminal import shown
from tiny_models import randomize

ENV = {**{k: v for k, v in os.environ.items() if k not in (warm.VARIABLE, "SYMFUSION_USAGE")},
       "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join(sys.path), PROGRESS_VARIABLE: "on"}
DIGITS = "task=digits"
STATS = "method_options={fisher: {num_batches: 1}}"


def refusals(w: Path, o: Path) -> dict[str, list[tuple[list[str], str]]]:
    """Console script -> (arguments, a word its one line must hold) of refusals; `w` the world, `o` a fresh folder."""
    return {
        "symfusion-data": [([DIGITS], "output"), ([DIGITS, f"output={w / 'evals' / 'none.json'}"], "did not write"),
                           (["--verbose"], "unknown flag")],
        "symfusion-train": [([DIGITS, "model=vit_smoke"], "output"), ([DIGITS, "model=minilm", f"output={o / 't'}"],
                                                                      "text encoder")],
        "symfusion-match": [([f"source={w / 'bert_b'}", f"anchor={w / 'bert_a'}"], "output"),
                            (["matching.rescale=false", f"source={w / 'nope'}", f"anchor={w / 'bert_a'}",
                              f"output={o / 'm'}"], "no such directory"),         # after its override note
                            ([f"source={w / 'bert_b'}", f"anchor={w / 'bert_a'}", f"output={o / 'm'}",
                              "max_relative_output_change=0"], "max_relative_output_change")],
        "symfusion-merge": [([DIGITS, "fusion=fisher", f"models=[{w / 'vit_a'},{w / 'vit_b'}]"], "output"),
                            ([DIGITS, "fusion=fisher", "fusion.num_batches=1", f"models=[{w / 'vit_a'},{w / 'vit_b'}]",
                              f"statistics=[{w / 'stats_of_bert.safetensors'}]", f"output={o / 'merged'}"],
                             "statistics")],            # after Fisher passes (torch's functorch warnings)
        "symfusion-statistics": [([DIGITS, f"model_dir={w / 'vit_a'}", "methods=[fisher,regmean]",
                                   "method_options={fisher: {num_batches: 1}, regmean: {num_batches: 0}}",
                                   f"output={o / 's.safetensors'}"], "num_batches")],
        "symfusion-evaluate": [([DIGITS, f"model_dir={w / 'vit_a'}", f"output={o / 'e.json'}", "split=dev"], "split"),
                               ([DIGITS, f"model_dir={w / 'bert_a'}", f"output={o / 'e.json'}"], "reads tokens")],
        "symfusion-barrier": [([DIGITS, f"anchor={w / 'vit_a'}", f"source={w / 'vit_b'}", "points=1",
                                f"output={o / 'b.json'}"], "points")],
        "symfusion-layers": [([f"anchor={w / 'vit_a'}", f"source={w / 'vit_b'}", f"output={o / 'l.json'}"], "tasks")],
        "symfusion-multimodel": [([f"models=[{w / 'bert_a'}]", f"output={o / 'mm.json'}"], "models")],
        "symfusion-report": [(["artefact=table9", f"inputs=[{w / 'evals' / 'none.json'}]", f"output={o / 't.csv'}"],
                              "unknown artefact"),
                             (["artefact=table2", f"inputs=[{w / 'evals' / 'none.json'},"
                               f"{w / 'barrier' / 'none-0.json'}]", f"output={o / 't.csv'}"],
                              "table2 can read")],       # after its progress bar
        "symfusion-compare": [([], "run_dir"), ([str(w), "--tolerance", "much"], "--tolerance"),
                              ([str(w), "--colour"], "unrecognized"), ([str(w / "nope")], "not a directory")],
        "symfusion-align-many": [([f"models=[{w / 'vit_a'}]", f"output={o / 'm'}"], "models"),
                                 ([f"models=[{w / 'vit_a'},{w / 'bert_a'}]", f"output={o / 'm'}"], "model_type"),
                                 ([f"models=[{w / 'vit_a'},{w / 'vit_b'}]"], "output"),
                                 ([f"models=[{w / 'vit_a'},{w / 'vit_b'}]", f"output={w / 'vit_a'}"], "input"),
                                 ([f"models=[{w / 'vit_a'},{w / 'vit_b'}]", f"output={o / 'm'}", "max_rounds=-1"],
                                  "max_rounds")],
        "symfusion-kway": [([DIGITS, f"ends=[{w / 'vit_a'}]", f"output={o / 'k.json'}"], "ends"),
                           ([DIGITS, f"ends=[{w / 'vit_a'},{w / 'vit_b'}]", f"models=[{w / 'vit_a'},{w / 'vit_b'},"
                             f"{w / 'vit_a'}]", f"output={o / 'k.json'}"], "models="),
                           ([DIGITS, f"ends=[{w / 'vit_a'},{w / 'vit_b'}]", "grid=0", f"output={o / 'k.json'}"],
                            "grid"),
                           ([DIGITS, f"ends=[{w / 'vit_a'},{w / 'vit_b'}]", f"models=[{w / 'vit_a'},{w / 'vit_b'}]",
                             f"line={w / 'no_ends.json'}", f"output={o / 'k.json'}"], "no_ends.json")],
        "symfusion-worker": [([], "usage"), ([str(w / "evals")], "exists already"),
                             ([str(w / "shared" / "socket")], "folder")],
    }


def test_every_console_script_has_refusals(tmp_path):
    assert sorted(refusals(tmp_path, tmp_path)) == sorted(console_scripts())


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = build_world(tmp_path_factory.mktemp("world"))
    (root / "shared").mkdir()
    (root / "shared").chmod(0o777)
    return root


def statistics_of_another_model(world: Path) -> None:
    """A statistics file the merge cannot use (another task's ViT), computed once."""

    other = world / "vit_other"
    if not other.exists():
        config = tf.ViTConfig(image_size=8, patch_size=4, num_channels=1, num_labels=10, hidden_size=16,
                              num_hidden_layers=1, num_attention_heads=2, intermediate_size=24)
        randomize(tf.ViTForImageClassification(config), 7).save_pretrained(str(other))
        try:
            cli.statistics_main([DIGITS, f"model_dir={other}", "methods=[fisher]", STATS,
                                 f"output={world / 'stats_of_bert.safetensors'}"])
        except SystemExit as done:
            assert done.code == 0


def run(script: str, args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    module, function = console_scripts()[script].split(":")
    done = subprocess.run([sys.executable, "-c", f"import sys; from {module} import {function} as m; "
                           "sys.exit(m())", *args], capture_output=True, timeout=600, env=env or ENV)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(),       # carriage returns kept
                                       done.stderr.decode())


@pytest.mark.slow
def test_every_refusal_of_every_script_is_one_line(world, tmp_path, tmp_path_factory):
    statistics_of_another_model(world)
    # Each case its own new output folder: refusals run two at a time, and two commands that both make the same new
    # folder cannot both remove it (each removes only what it made itself, and not while the other's lock is in it).
    def cases_with(o: Path) -> list[tuple[str, list[str], str]]:
        return [(script, args, word) for script, found in refusals(world, o).items() for args, word in found]
    cases = [cases_with(tmp_path / f"out{k}")[k] for k in range(len(cases_with(tmp_path)))]
    before = snapshot(world), snapshot(tmp_path)
    # A script's first refusal as the user runs it, a new interpreter (its imports, its start); the others forked
    # from one process that imported every stage: a refused command line imports its stage first (2-7 CPU s each).
    first = [next(i for i, case in enumerate(cases) if case[0] == script) for script in dict.fromkeys(c[0] for c in cases)]
    others = [i for i in range(len(cases)) if i not in first]
    with ThreadPoolExecutor(max_workers=2) as pool:
        fresh = list(pool.map(lambda i: run(cases[i][0], cases[i][1]), first))
    forked = run_forked([(console_scripts()[cases[i][0]], cases[i][1]) for i in others],
                         tmp_path_factory.mktemp("streams"), ENV)
    results = [dict(zip(first + others, fresh + forked))[i] for i in range(len(cases))]
    failures = []
    for (script, args, word), result in zip(cases, results):
        lines = shown(result.stderr)                 # as a terminal shows it (a bar erased by its carriage returns)
        if result.returncode != 2 or len(lines) != 1 or not lines[0].startswith("error:") or word not in lines[0]:
            failures.append(f"{script} {' '.join(args)[-160:]}: exit {result.returncode}, stderr "
                            f"{result.stderr.strip()[-600:]!r} (wanted one line with {word!r})")
    assert failures == []
    assert (snapshot(world), snapshot(tmp_path)) == before


TOY_WORKER = """
import os, sys
from symfusion.pipeline import warm
warm.serve(sys.argv[1], lambda command, argv: 0, lambda: None, dict(os.environ))
"""


@pytest.mark.slow
def test_a_warm_workers_note_is_said_only_when_the_command_succeeds(world, tmp_path):
    """A worker that refuses a job (another environment): the command runs in its own process; refused there, its
    stderr is its one error line; succeeding, it says the worker's note after its result."""
    folder = tmp_path / "worker"
    folder.mkdir(mode=0o700)
    (folder / "toy.py").write_text(TOY_WORKER)
    worker = subprocess.Popen([sys.executable, str(folder / "toy.py"), str(folder / "socket")],
                              env={**ENV, "TOY": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (folder / "socket").exists():
            assert worker.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        env = {**ENV, warm.VARIABLE: str(folder / "socket")}
        refused = run("symfusion-evaluate", [DIGITS, f"model_dir={world / 'vit_a'}", f"output={tmp_path / 'e.json'}",
                                             "split=dev"], env)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        done = run("symfusion-evaluate", [DIGITS, f"model_dir={world / 'vit_a'}", f"output={tmp_path / 'e.json'}"], env)
        assert done.returncode == 0 and "the warm worker did not take this job" in done.stderr, done.stderr
    finally:
        worker.terminate()
        worker.wait(timeout=60)
