"""Safe outputs: only a previous output of the same stage is replaced, atomically, one writer at a time,
and the next run repairs what a killed writer left."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from symfusion.io import marks, outputs
from symfusion.errors import SymfusionError
from symfusion.io.outputs import claim_output, file_marker, folder_marker, recover_leftovers, safe_output

MARKER = file_marker(("value",))
FOLDER = folder_marker("stage.json", ("value",))


def write_json(path, value):
    with safe_output(path, "test", MARKER) as claim:
        with claim.writing() as tmp:
            tmp.write_text(json.dumps({"value": value, "provenance": {}}))


def write_folder(path, value, fail=False):
    with safe_output(path, "test", FOLDER, is_dir=True) as claim:
        with claim.writing() as tmp:
            (tmp / "stage.json").write_text(json.dumps({"value": value, "provenance": {}}))
            (tmp / "v").write_text(str(value))
            if fail:
                raise KeyboardInterrupt


def test_json_is_replaced_whole_and_a_failed_write_leaves_the_old_file(tmp_path):
    target = tmp_path / "r.json"
    write_json(target, 1)
    with pytest.raises(TypeError):
        with safe_output(target, "test", MARKER) as claim:
            with claim.writing() as tmp:
                tmp.write_text(json.dumps({(1, 2): "tuple keys are not JSON"}))
    assert json.loads(target.read_text())["value"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]          # no temp file, no lock left
    write_json(target, 2)                                                # a previous output is replaced
    assert json.loads(target.read_text())["value"] == 2


def test_an_interrupted_directory_write_keeps_the_old_output(tmp_path):
    write_folder(tmp_path / "model", 1)
    with pytest.raises(KeyboardInterrupt):
        write_folder(tmp_path / "model", 2, fail=True)
    assert (tmp_path / "model" / "v").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    write_folder(tmp_path / "model", 3)
    assert (tmp_path / "model" / "v").read_text() == "3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_output_folders_get_the_usual_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        write_folder(tmp_path / "model", 1)
        write_json(tmp_path / "r.json", 1)
    finally:
        os.umask(umask)
    assert (tmp_path / "model").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o644


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def marked(folder, host, pid):
    """A temp folder as a writer `pid` of `host` leaves it: with its mark."""
    folder.mkdir()
    (folder / marks.TEMP_MARK).write_text(f"symfusion temp {host} {pid}\n")
    return folder


def test_a_dead_writers_temp_is_removed_and_a_live_writers_is_kept(tmp_path):
    host = outputs._HOST
    dead = marked(tmp_path / ".model.tmp-a", host, dead_pid())
    live = marked(tmp_path / ".model.tmp-b", host, os.getppid())           # our parent is alive
    other_host = marked(tmp_path / ".model.tmp-c", "elsewhere", 1)          # another machine's writer: not ours to judge
    unmarked = tmp_path / f".model.tmp-{host}-{dead_pid()}-d"               # named like a dead writer's, but no mark:
    unmarked.mkdir()                                                        # a user's folder, never touched
    (unmarked / "notes.txt").write_text("mine")
    write_folder(tmp_path / "model", 1)
    assert not dead.exists() and live.exists() and other_host.exists()
    assert (unmarked / "notes.txt").read_text() == "mine"


KILL_BEFORE_MARK = """
import os, signal, sys
from symfusion.io import marks
from symfusion.io.outputs import safe_output, folder_marker
def killed(folder, kind):
    if {partial}:
        (folder / marks.TEMP_MARK).write_text("symfusion te")
    os.kill(os.getpid(), signal.SIGKILL)
marks.mark = killed
with safe_output(sys.argv[1], "test", folder_marker("stage.json", ("value",)), is_dir=True) as claim:
    with claim.writing() as tmp:
        pass
"""


@pytest.mark.parametrize("partial", [False, True], ids=["no mark", "half a mark"])
def test_a_writer_killed_between_mkdtemp_and_its_mark_leaves_nothing_after_the_next_run(tmp_path, partial):
    """SIGKILL after the temp folder is made and before its mark is whole (what .ci/run's interrupted rehearsal hit
    once): an empty unmarked folder was left for good; the next writer of the output removes it."""
    child = subprocess.run([sys.executable, "-c", KILL_BEFORE_MARK.format(partial=partial), str(tmp_path / "model")])
    assert child.returncode == -signal.SIGKILL
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".model.tmp-")]
    assert len(left) == 1 and sorted(os.listdir(left[0])) == ([marks.TEMP_MARK] if partial else [])
    write_folder(tmp_path / "model", 1)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".model.tmp-")] == []
    assert (tmp_path / "model" / "v").read_text() == "1"


def test_only_a_killed_writers_empty_temp_is_removed_without_a_mark(tmp_path):
    """What unmarked_leftover must not take for such a folder: a live writer's, another host's, a wrong mode or
    name, one holding a user's file or another mark, a link to an empty folder."""
    host, pid = outputs._HOST, dead_pid()
    def made(name, mode=0o700, content=None):
        folder = tmp_path / name
        folder.mkdir()
        os.chmod(folder, mode)
        if content is not None:
            (folder / content[0]).write_text(content[1])
        return folder
    removed = made(f".model.tmp-{host}-{pid}-abc_1234")
    kept = [made(f".model.tmp-{host}-{os.getppid()}-abcd1234"),                    # a live writer
            made(f".model.tmp-elsewhere-{pid}-abcd1234"),                          # another machine's
            made(f".model.tmp-{host}-{pid}-abcd1235", mode=0o755),                  # not mkdtemp's mode
            made(f".model.tmp-{host}-{pid}-user"),                                 # not mkdtemp's name
            made(f".model.tmp-{host}-{pid}-abcd1236", content=("notes.txt", "")),   # a user's (empty) file
            made(f".model.tmp-{host}-{pid}-abcd1237", content=(marks.TEMP_MARK, "my notes\n"))]
    os.symlink(made("empty", mode=0o700), tmp_path / f".model.tmp-{host}-{pid}-abcd1238")
    kept.append(tmp_path / f".model.tmp-{host}-{pid}-abcd1238")
    write_folder(tmp_path / "model", 1)
    assert not removed.exists() and all(os.path.lexists(k) for k in kept)
    assert (tmp_path / "empty").is_dir()


def test_a_displaced_old_result_is_restored_when_its_writer_died_between_two_renames(tmp_path, monkeypatch):
    write_folder(tmp_path / "model", 1)
    monkeypatch.setattr(outputs, "exchange", lambda a, b: False)       # a file system without renameat2
    real_replace, calls = os.replace, []

    def killed_after_the_first_rename(src, dst):
        calls.append(dst)
        real_replace(src, dst)
        if len(calls) == 1:
            raise KeyboardInterrupt                                      # the old result moved aside, nothing in place
    monkeypatch.setattr(outputs.os, "replace", killed_after_the_first_rename)
    monkeypatch.setattr(outputs, "remove_own", lambda folder: False)   # killed: its temp folder stays as it was
    with pytest.raises(KeyboardInterrupt):
        write_folder(tmp_path / "model", 2)
    monkeypatch.undo()
    assert not (tmp_path / "model").exists()
    temps = [p for p in tmp_path.iterdir() if p.name.startswith(".model.tmp-")]
    assert len(temps) == 1 and (temps[0] / "old" / "v").read_text() == "1"
    # the writer's own pid is alive in this test; what counts is a dead writer: mark it as a dead one's
    (temps[0] / marks.TEMP_MARK).write_text(f"symfusion temp {outputs._HOST} {dead_pid()}\n")
    recover_leftovers(tmp_path / "model")
    assert (tmp_path / "model" / "v").read_text() == "1"               # the old result is back
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_the_atomic_exchange_swaps_two_folders(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x").write_text("a")
    if not outputs.exchange(tmp_path / "a", tmp_path / "b"):
        pytest.fail("renameat2 RENAME_EXCHANGE is not available on this Linux file system")
    assert (tmp_path / "b" / "x").read_text() == "a" and not (tmp_path / "a" / "x").exists()


@pytest.mark.parametrize("case", ["input", "inside_input", "contains_input", "foreign_folder", "foreign_file",
                                  "under_a_file", "symlink"])
def test_outputs_that_are_not_ours_to_write_are_refused(tmp_path, case):
    source = tmp_path / "models" / "source"
    source.mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's file")
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "mine")
    target = {"input": source, "inside_input": source / "sub", "contains_input": tmp_path / "models",
              "foreign_folder": tmp_path / "mine", "foreign_file": tmp_path / "file.txt",
              "under_a_file": tmp_path / "file.txt" / "out", "symlink": tmp_path / "link"}[case]
    before = sorted((str(p), p.stat().st_size if p.is_file() else 0) for p in tmp_path.rglob("*"))
    is_dir = case not in ("foreign_file",)
    with pytest.raises(SymfusionError) as error:
        claim_output(target, "test", FOLDER, inputs=[source], is_dir=is_dir)
    assert "\n" not in str(error.value)
    assert sorted((str(p), p.stat().st_size if p.is_file() else 0) for p in tmp_path.rglob("*")) == before


def test_a_second_writer_of_the_same_output_fails_clearly(tmp_path):
    first = claim_output(tmp_path / "model", "test", FOLDER, is_dir=True)
    try:
        script = ("import sys; from symfusion.io.outputs import claim_output, folder_marker\n"
                  "from symfusion.errors import SymfusionError\n"
                  f"try:\n    claim_output({str(tmp_path / 'model')!r}, 'test', folder_marker('stage.json'), is_dir=True)\n"
                  "except SymfusionError as e:\n    print(e); sys.exit(2)\n")
        other = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert other.returncode == 2 and "another process is writing" in other.stdout
    finally:
        first.release()
    again = claim_output(tmp_path / "model", "test", FOLDER, is_dir=True)     # free once the first is done
    again.release()
    assert list(tmp_path.iterdir()) == []


def test_a_claim_that_writes_nothing_removes_only_the_folders_it_made(tmp_path):
    recognise = lambda path: False  # noqa: E731
    (tmp_path / "kept").mkdir()
    claim = claim_output(tmp_path / "kept" / "a" / "b" / "out.json", "stage", recognise)
    assert (tmp_path / "kept" / "a" / "b").is_dir()
    claim.release()
    assert (tmp_path / "kept").is_dir() and not (tmp_path / "kept" / "a").exists()

    claim = claim_output(tmp_path / "kept" / "a" / "out.json", "stage", recognise)
    (tmp_path / "kept" / "a" / "other").write_text("someone else's")     # not empty any more: left alone
    claim.release()
    assert (tmp_path / "kept" / "a" / "other").read_text() == "someone else's"

    claim = claim_output(tmp_path / "new" / "out.json", "stage", recognise)
    with claim.writing() as tmp:
        tmp.write_text("{}")
    claim.release()
    assert (tmp_path / "new" / "out.json").read_text() == "{}"


def test_a_folder_another_process_made_meanwhile_is_never_removed(tmp_path, monkeypatch):
    """Between seeing that a parent folder is missing and making it, another process made it: it is not this
    claim's to remove. Two claims in one new folder: the one that made it removes it only once it is empty."""
    recognise = lambda path: False  # noqa: E731
    made_meanwhile = tmp_path / "theirs"
    missing = outputs.os.path.lexists
    monkeypatch.setattr(outputs.os.path, "lexists", lambda p: False if Path(p) == made_meanwhile else missing(p))
    made_meanwhile.mkdir()                                    # as if made after this process looked
    claim = claim_output(made_meanwhile / "mine" / "out.json", "stage", recognise)
    assert claim.created == [made_meanwhile / "mine"]
    claim.release()
    assert made_meanwhile.is_dir() and not (made_meanwhile / "mine").exists()
    monkeypatch.undo()

    first = claim_output(tmp_path / "new" / "a.json", "stage", recognise)
    second = claim_output(tmp_path / "new" / "b.json", "stage", recognise)
    assert first.created == [tmp_path / "new"] and second.created == []
    second.release()                                          # not its folder: kept for the first
    assert (tmp_path / "new").is_dir()
    first.release()
    assert not (tmp_path / "new").exists()


@pytest.fixture
def default_sigint():
    """Python's default SIGINT handler (KeyboardInterrupt), as in a command's process; the previous one after."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _sigint_after(function):
    """`function`, followed by a real SIGINT to this process (delivered at the next bytecode)."""
    def interrupted(*args, **kwargs):
        found = function(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        return found
    return interrupted


def test_ctrl_c_while_the_lock_is_taken_leaves_no_lock(tmp_path, monkeypatch, default_sigint):
    """A SIGINT that arrives just after the lock file is created (the moment tests/redteam's Ctrl-C test hits when
    the machine is busy) is raised once the claim holds the lock, so the claim releases it: no lock file, no
    folder the claim made. (Before, the interrupt unwound _acquire_lock with the new file unrecorded: it stayed.)"""
    monkeypatch.setattr(outputs, "open_lock", _sigint_after(marks.open_lock))
    output = tmp_path / "new" / "out.json"
    with pytest.raises(KeyboardInterrupt):
        claim_output(output, "test", MARKER)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert not (tmp_path / "new").exists()


def test_a_lock_taken_without_an_interrupt_restores_the_handler(tmp_path, default_sigint):
    """interrupts_held leaves Python's SIGINT handler as it found it."""
    claim = claim_output(tmp_path / "out.json", "test", MARKER)
    assert (tmp_path / ".out.json.lock").is_file() and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    claim.release()
    assert not (tmp_path / ".out.json.lock").exists()


def test_ctrl_c_as_a_marked_folder_is_made_leaves_no_folder(tmp_path, monkeypatch, default_sigint):
    """A SIGINT right after mkdtemp made the folder (before its mark): KeyboardInterrupt, and no folder, marked or
    not (before, an unmarked folder stayed, which no cleanup may remove)."""
    monkeypatch.setattr(marks.tempfile, "mkdtemp", _sigint_after(marks.tempfile.mkdtemp))
    with pytest.raises(KeyboardInterrupt):
        marks.marked_folder(tmp_path, ".out.tmp-")
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_as_a_write_s_temp_is_made_leaves_nothing(tmp_path, monkeypatch, default_sigint):
    """A SIGINT right after a writer's temp folder is made (before writing_together lists it): KeyboardInterrupt,
    no output, no temp, no lock (before, the marked temp stayed until a later run)."""
    monkeypatch.setattr(outputs, "marked_folder", _sigint_after(outputs.marked_folder))
    with pytest.raises(KeyboardInterrupt):
        write_folder(tmp_path / "out", 1)
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_as_a_cache_entry_s_temp_is_made_leaves_no_temp(tmp_path, monkeypatch, default_sigint):
    """write_own (cache entries): a SIGINT right after mkstemp made its temp file: KeyboardInterrupt, no temp, no
    entry (before, the temp file stayed beside the cache's entries)."""
    monkeypatch.setattr(marks.tempfile, "mkstemp", _sigint_after(marks.tempfile.mkstemp))
    with pytest.raises(KeyboardInterrupt):
        marks.write_own(tmp_path / "entry.bin", lambda name: Path(name).write_bytes(b"x"))
    assert list(tmp_path.iterdir()) == []
