"""Safe outputs: where a stage may write, one writer at a time, and an atomic swap that never loses both results.

Every writer of symfusion goes through `claim_output` before it does any work:
- the path must not be an input of the command, nor an ancestor or descendant of one, nor lie under a
  file; an existing path may only be replaced when it is a previous output of the same stage, recognised
  by that stage's own marker (its JSON report, or the signature of a report artefact); anything else is
  refused with one line that says to choose another path or delete it;
- a lock (`.NAME.lock`, fcntl) makes a second writer of the same output fail at once, clearly;
- leftovers of killed writers are dealt with first: a hidden temp (`.NAME.tmp-HOST-PID-*`) of a dead
  process is removed, one of a live process is left alone, and a displaced old result (`.NAME.old-*`,
  only on file systems without an atomic exchange) is restored when the output itself is missing.
A folder output also lists what it holds (`.symfusion-files.json`, written last into the temp folder): a
previous folder is replaced only when it holds exactly what that list says, so a file a user put into it
(or changed since) is never deleted by a rerun; the command refuses, naming the file.
The result is written beside the output under a temp name and swapped in with one atomic exchange
(renameat2 RENAME_EXCHANGE) where the file system has it, else with two renames whose interruption the
next run repairs: at every instant either the old or the new result is complete under its own name.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
import shutil
import socket
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from symfusion.errors import SymfusionError

_HOST = socket.gethostname().replace("-", "_")
FILES_LIST = ".symfusion-files.json"         # in every folder output: what the writer put there
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


# ---------------------------------------------------------------- recognising a previous output

def json_marker(path: Path, keys: Iterable[str]) -> bool:
    """A JSON object with provenance and every one of `keys`: a stage's own report."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and isinstance(data.get("provenance"), dict) and all(k in data for k in keys)


def folder_marker(name: str, keys: Iterable[str] = ()) -> Callable[[Path], bool]:
    """Recognises a model folder written by a stage: it holds the stage's JSON report `name`."""
    keys = tuple(keys)
    return lambda path: path.is_dir() and not path.is_symlink() and json_marker(path / name, keys)


def file_marker(keys: Iterable[str]) -> Callable[[Path], bool]:
    """Recognises a stage's JSON result file by its provenance and its own keys."""
    keys = tuple(keys)
    return lambda path: path.is_file() and not path.is_symlink() and json_marker(path, keys)


# ---------------------------------------------------------------- checks before any work

def _resolved(path) -> Path:
    return Path(os.path.abspath(os.path.realpath(path)))


def _related(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


def check_output_path(output, inputs: Iterable = (), what: str = "output") -> Path:
    """The output as a Path, after refusing an input, an ancestor/descendant of an input, or a path under a file."""
    if output is None or str(output).strip() == "":
        raise SymfusionError(f"{what}=PATH is required")
    path = Path(str(output))
    target = _resolved(path)
    for item in inputs:
        if item is None or str(item) == "":
            continue
        source = _resolved(item)
        if _related(target, source):
            relation = "is" if target == source else "lies inside" if source in target.parents else "contains"
            raise SymfusionError(f"{what}={output} {relation} the input {item}; choose an output path apart from "
                                 "the command's inputs")
    for parent in target.parents:
        if parent.exists() and not parent.is_dir():
            raise SymfusionError(f"{what}={output}: {parent} is a file, not a folder; choose another path")
    return path


@dataclass
class Claim:
    """An output this process may write: locked, checked, leftovers dealt with."""

    path: Path
    is_dir: bool
    lock_fd: int | None = None
    written: bool = field(default=False)
    created: list[Path] = field(default_factory=list)   # parent folders this claim made, outermost first

    def release(self) -> None:
        if self.lock_fd is not None:
            lock = _lock_path(self.path)
            try:
                if os.path.exists(lock) and os.stat(lock).st_ino == os.fstat(self.lock_fd).st_ino:
                    os.unlink(lock)
            except OSError:
                pass
            os.close(self.lock_fd)
            self.lock_fd = None
        if not self.written:                  # nothing written: the folders made for it go again (if still empty)
            for folder in reversed(self.created):
                try:
                    folder.rmdir()
                except OSError:
                    break
            self.created = []

    @contextmanager
    def writing(self):
        """Yield a temp path beside the output (a folder or a file name); on success it replaces the output."""
        tmp = _temp_path(self.path, self.is_dir)
        try:
            yield tmp
            if self.is_dir:
                (tmp / FILES_LIST).write_text(json.dumps(_listing(tmp), indent=1, sort_keys=True) + "\n")
            _swap_in(tmp, self.path)
            self.written = True
        except BaseException:
            _remove(tmp)
            raise


def _listing(folder: Path) -> dict[str, int | None]:
    """Every entry under `folder` (relative path -> size of a file, None for a folder), FILES_LIST left out."""
    entries = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            item = Path(root) / name
            relative = item.relative_to(folder).as_posix()
            if relative != FILES_LIST:
                entries[relative] = None if item.is_dir() and not item.is_symlink() else os.lstat(item).st_size
    return entries


def foreign_entry(folder: Path, stage: str) -> str | None:
    """Why a previous folder output may not be replaced: what in it its writer did not put there (or that
    changed since), or that it has no list of what was written; None when it holds exactly its list."""
    try:
        written = json.loads((folder / FILES_LIST).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        written = None
    if not isinstance(written, dict):
        return (f"it has no readable {FILES_LIST} (the list of what {stage} wrote into it; an older symfusion "
                "wrote none), so its files cannot be told from yours; delete it first, or choose another path")
    for relative, size in sorted(_listing(folder).items()):
        if relative not in written or written[relative] != size:
            return (f"it holds {relative}, which {stage} did not write there (or which changed since); move that "
                    "away, or choose another path")
    return None


def _lock_path(path: Path) -> Path:
    return path.parent / f".{path.name}.lock"


def _acquire_lock(path: Path) -> int:
    """An exclusive lock on `.NAME.lock` (kept while this process writes NAME), or a one-line error."""
    lock = _lock_path(path)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno in (errno.EAGAIN, errno.EACCES):
                raise SymfusionError(f"another process is writing {path} right now; wait for it to finish or "
                                     "choose another output") from error
            raise
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:    # not unlinked by a finishing writer meanwhile
                os.ftruncate(fd, 0)
                os.write(fd, f"{_HOST} {os.getpid()}\n".encode())
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _writer_of(name: str, prefix: str) -> tuple[str, int] | None:
    """(host, pid) encoded in a temp name `prefix` + HOST-PID-random, or None."""
    rest = name[len(prefix):]
    host, _, tail = rest.partition("-")
    pid, _, _ = tail.partition("-")
    return (host, int(pid)) if pid.isdigit() else None


def recover_leftovers(path: Path) -> None:
    """Remove temps of dead writers on this host; restore a displaced old result if the output is missing."""
    parent = path.parent
    if not parent.is_dir():
        return
    prefix = f".{path.name}.tmp-"
    for item in parent.iterdir():
        if item.name.startswith(prefix):
            writer = _writer_of(item.name, prefix)
            if writer is not None and writer[0] == _HOST and not _pid_alive(writer[1]):
                _remove(item)
    old_prefix = f".{path.name}.old-"
    olds = sorted((p for p in parent.iterdir() if p.name.startswith(old_prefix)), key=lambda p: p.stat().st_mtime)
    for old in olds:
        writer = _writer_of(old.name, old_prefix)
        if writer is not None and writer[0] == _HOST and _pid_alive(writer[1]):
            continue
        if not os.path.lexists(path):
            os.replace(old, path)            # the killed writer displaced the old result and wrote nothing
        else:
            _remove(old)


def claim_output(output, stage: str, recognise: Callable[[Path], bool], inputs: Iterable = (),
                 is_dir: bool = False, what: str = "output") -> Claim:
    """Check that `output` may be written by `stage`, lock it and repair leftovers; call before any work.

    `recognise(path)` says whether an existing path is a previous output of this stage.
    """
    path = check_output_path(output, inputs, what)
    created = [p for p in reversed(path.parents) if not os.path.lexists(p)]   # made below, outermost first
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SymfusionError(f"{what}={output}: cannot create {path.parent} ({error.strerror}); "
                             "choose a writable location") from error
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise SymfusionError(f"{what}={output}: {path.parent} is not writable; choose a writable location")
    try:
        fd = _acquire_lock(path)
    except OSError as error:
        raise SymfusionError(f"{what}={output}: cannot write in {path.parent} ({error.strerror}); "
                             "choose a writable location") from error
    claim = Claim(path=path, is_dir=is_dir, lock_fd=fd, created=created)
    try:
        recover_leftovers(path)
        if os.path.lexists(path):
            if path.is_symlink() or path.is_dir() != is_dir or not recognise(path):
                kind = "folder" if path.is_dir() else "file"
                raise SymfusionError(f"{what}={output} is an existing {kind} that {stage} did not write; "
                                     "choose another path or delete it first")
            foreign = foreign_entry(path, stage) if is_dir else None
            if foreign is not None:              # a rerun never deletes what the writer did not create
                raise SymfusionError(f"{what}={output} is an earlier output of {stage}, but {foreign}")
    except BaseException:
        claim.release()
        raise
    return claim


# ---------------------------------------------------------------- temp names and the swap

def _temp_path(path: Path, is_dir: bool) -> Path:
    prefix = f".{path.name}.tmp-{_HOST}-{os.getpid()}-"
    if is_dir:
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=path.parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)          # mkdtemp makes 0700; results are shared like any folder
        return tmp
    fd, name = tempfile.mkstemp(prefix=prefix, dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(name, 0o666 & ~umask)
    return Path(name)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def _libc():
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name, use_errno=True) if name else None


_LIBC = _libc()


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    function = getattr(_LIBC, "renameat2", None) if _LIBC is not None else None
    if function is None:
        return False
    result = function(_AT_FDCWD, os.fsencode(str(a)), _AT_FDCWD, os.fsencode(str(b)), _RENAME_EXCHANGE)
    if result == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap_in(tmp: Path, path: Path) -> None:
    """Make `tmp` the output: one rename when there is no old result, else an atomic exchange (fallback:
    two renames, repaired by recover_leftovers if interrupted between them)."""
    if not os.path.lexists(path):
        os.replace(tmp, path)
        return
    if exchange(tmp, path):
        _remove(tmp)                           # tmp now holds the old result
        return
    old = path.parent / f".{path.name}.old-{_HOST}-{os.getpid()}-{os.urandom(3).hex()}"
    os.replace(path, old)
    os.replace(tmp, path)
    _remove(old)


@contextmanager
def safe_output(output, stage: str, recognise: Callable[[Path], bool], inputs: Iterable = (), is_dir: bool = False,
                what: str = "output"):
    """claim_output as a context: yields the Claim, releases its lock on exit."""
    claim = claim_output(output, stage, recognise, inputs, is_dir, what)
    try:
        yield claim
    finally:
        claim.release()
