"""Safe outputs: where a stage may write, one writer at a time, and an atomic swap that never loses both results.

Every writer of symfusion goes through `claim_output` before it does any work:
- the path must not be an input of the command, nor an ancestor or descendant of one, nor lie under a
  file; an existing path may only be replaced when it is a previous output of the same stage, recognised
  by that stage's own marker (its JSON report, or the signature of a report artefact); anything else is
  refused with one line that says to choose another path or delete it;
- a lock (`.NAME.lock`, fcntl) makes a second writer of the same output fail at once, clearly; it is opened
  without following a symbolic link (O_NOFOLLOW), created new (O_EXCL) or else taken over only when it is a
  plain file of this user holding a lock line, so nothing planted under its name is ever written; a Ctrl-C
  while it is being taken is raised once the claim holds it, so the claim's release removes it;
- leftovers of killed writers are dealt with first: every temp is a folder `.NAME.tmp-HOST-PID-*` that carries
  its writer's mark (TEMP_MARK inside: who made it); one of a dead writer of this host is removed (and an old
  result it had displaced restored when the output itself is missing), one of a live writer is left alone,
  and anything without this user's mark (a link, a user's folder, another user's file) is never touched, save
  the empty folder of a writer killed between mkdtemp and its mark (`marks.unmarked_leftover`: removed).
A folder output also lists what it holds (`.symfusion-files.json`, written last into the temp folder): a
previous folder is replaced only when it holds exactly what that list says, so a file a user put into it
(or changed since) is never deleted by a rerun; the command refuses, naming the file.
The result is written inside the temp folder and swapped in with one atomic exchange (renameat2
RENAME_EXCHANGE) where the file system has it, else with two renames whose interruption the next run
repairs: at every instant either the old or the new result is complete under its own name. Several
outputs of one command are swapped in together (`writing_together`): a failure part-way puts back what
was swapped in, and its error line says so (or names what stayed).
The marks, and the lock file's checks, live in symfusion/io/marks.py (the trainer's checkpoint and the caches use them too).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
import shutil
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from symfusion.errors import SymfusionError, as_symfusion_error
from symfusion.io.marks import HOST as _HOST, TEMP_MARK, interrupts_held, marked_folder, open_lock, own_folder, \
    pid_alive, remove_own, unmarked_leftover
from symfusion.io.regular import read_regular

FILES_LIST = ".symfusion-files.json"         # in every folder output: what the writer put there
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


# ---------------------------------------------------------------- recognising a previous output

def json_marker(path: Path, keys: Iterable[str]) -> bool:
    """A JSON object with provenance and every one of `keys`: a stage's own report."""
    try:
        data = json.loads(read_regular(path))            # a FIFO or a device is not waited on (io/regular.py)
    except (SymfusionError, UnicodeDecodeError, ValueError):
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
                found = os.lstat(lock)
                mine = os.fstat(self.lock_fd)
                if stat.S_ISREG(found.st_mode) and (found.st_dev, found.st_ino) == (mine.st_dev, mine.st_ino):
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
        """Yield a temp path (a folder or a file name, inside this writer's marked temp folder beside the output);
        on success it replaces the output."""
        with writing_together([self]) as (tmp,):
            yield tmp


@contextmanager
def writing_together(claims: list[Claim]):
    """Yield one temp path per claim; on success swap them all in, in order. A failure while they are written
    leaves every output as it was; a failure part-way through the swaps puts back the outputs already swapped
    in (their previous results, or nothing), and the error line says so, or names the outputs that stayed."""
    temps = []
    try:
        for claim in claims:
            with interrupts_held():                  # a Ctrl-C as the temp is made: raised once it is listed
                temps.append(_temp_path(claim.path, claim.is_dir))
        yield temps
        for claim, tmp in zip(claims, temps):
            if claim.is_dir:
                (tmp / FILES_LIST).write_text(json.dumps(_listing(tmp), indent=1, sort_keys=True) + "\n")
        done = []
        try:
            for claim, tmp in zip(claims, temps):
                done.append((claim, tmp, swap_in(tmp, claim.path)))
        except BaseException as error:
            if not done:
                raise
            kept = _roll_back(done)
            line = as_symfusion_error(error) if isinstance(error, Exception) else None
            if line is None:
                raise
            what = (f"; kept the new {', '.join(str(c.path) for c in kept)} (could not put the previous result back)"
                    if kept else f"; {len(done)} output(s) already swapped in were put back, nothing was changed")
            raise SymfusionError(f"{line}{what}") from error
        for claim in claims:
            claim.written = True
    finally:
        for tmp in temps:
            remove_own(tmp.parent)


def _roll_back(done: list) -> list[Claim]:
    """Undo the swaps `done` ((claim, its temp, whether an old result was displaced)), last first; the claims
    whose new result could not be taken back."""
    kept = []
    for claim, tmp, had_old in reversed(done):
        try:
            if had_old and os.path.lexists(tmp):
                exchange(tmp, claim.path)                       # exchanged in: exchanged back
            else:
                os.replace(claim.path, tmp)                     # the new result back into its temp ...
                if had_old:
                    os.replace(tmp.parent / "old", claim.path)  # ... and the displaced old one in place
        except OSError:
            kept.append(claim)
    return kept


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
        written = json.loads(read_regular(folder / FILES_LIST))
    except (SymfusionError, UnicodeDecodeError, ValueError):
        written = None
    if not isinstance(written, dict):
        return (f"it has no readable {FILES_LIST} (the list of what {stage} wrote into it; an older symfusion "
                "wrote none), so its files cannot be told from yours; delete it first, or choose another path")
    for relative, size in sorted(_listing(folder).items()):
        if relative not in written or written[relative] != size:
            return (f"it holds {relative}, which {stage} did not write there (or which changed since); move that "
                    "away, or choose another path")
    return None


# ---------------------------------------------------------------- the lock

def _lock_path(path: Path) -> Path:
    return path.parent / f".{path.name}.lock"


def _acquire_lock(path: Path) -> int:
    """An exclusive lock on `.NAME.lock` (kept while this process writes NAME), or a one-line error."""
    lock = _lock_path(path)
    while True:
        fd, created = open_lock(lock)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno in (errno.EAGAIN, errno.EACCES):
                raise SymfusionError(f"another process is writing {path} right now; wait for it to finish or "
                                     "choose another output") from error
            raise
        try:
            found, mine = os.lstat(lock), os.fstat(fd)
            if (found.st_dev, found.st_ino) == (mine.st_dev, mine.st_ino):   # not unlinked by a finishing writer
                try:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"symfusion lock {_HOST} {os.getpid()}\n".encode(), 0)
                except OSError:                       # e.g. no space left: the lock goes again
                    if created:
                        os.unlink(lock)
                    os.close(fd)
                    raise
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def recover_leftovers(path: Path) -> None:
    """Remove the marked temps of dead writers on this host (restoring an old result one of them had displaced,
    when the output itself is missing), and the empty folders of writers killed before their mark was written;
    anything else without this user's mark stays untouched."""
    parent = path.parent
    if not parent.is_dir():
        return
    prefix = f".{path.name}.tmp-"
    for item in sorted(parent.iterdir()):
        if not item.name.startswith(prefix):
            continue
        writer = own_folder(item)
        if writer is None and unmarked_leftover(item, prefix):    # killed between mkdtemp and its mark: empty
            (item / TEMP_MARK).unlink(missing_ok=True)
            os.rmdir(item)
            continue
        if writer is None or writer[0] != _HOST or pid_alive(writer[1]):
            continue
        old = item / "old"
        if os.path.lexists(old) and not os.path.lexists(path):
            os.replace(old, path)            # the killed writer displaced the old result and put nothing in place
        shutil.rmtree(item, ignore_errors=True)


def claim_output(output, stage: str, recognise: Callable[[Path], bool], inputs: Iterable = (),
                 is_dir: bool = False, what: str = "output") -> Claim:
    """Check that `output` may be written by `stage`, lock it and repair leftovers; call before any work.

    `recognise(path)` says whether an existing path is a previous output of this stage.
    """
    path = check_output_path(output, inputs, what)
    created = []                    # the folders this process made, outermost first: another's are never its own
    try:
        for folder in [p for p in reversed(path.parents) if not os.path.lexists(p)]:
            try:
                folder.mkdir()
                created.append(folder)
            except FileExistsError:                   # made meanwhile by another process: not ours to remove
                if not folder.is_dir():
                    raise
    except OSError as error:
        Claim(path=path, is_dir=is_dir, created=created).release()
        raise SymfusionError(f"{what}={output}: cannot create {path.parent} ({error.strerror}); "
                             "choose a writable location") from error
    claim = Claim(path=path, is_dir=is_dir, created=created)
    try:
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise SymfusionError(f"{what}={output}: {path.parent} is not writable; choose a writable location")
        try:
            with interrupts_held():
                claim.lock_fd = _acquire_lock(path)
        except OSError as error:
            raise SymfusionError(f"{what}={output}: cannot write in {path.parent} ({error.strerror}); "
                                 "choose a writable location") from error
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
    """Where the new result of `path` is written: `NAME` inside a new marked temp folder beside it (made here
    for a folder output; a file output is created by its writer)."""
    tmp = marked_folder(path.parent, f".{path.name}.tmp-{_HOST}-{os.getpid()}-") / path.name
    if is_dir:
        tmp.mkdir()                            # 0777 & ~umask: results are shared like any folder
    return tmp


def _libc():
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name, use_errno=True) if name else None


_LIBC = _libc()


def _renameat2(a: Path, b: Path, flags: int) -> bool:
    """renameat2(a, b, flags); False where the system or file system lacks it; OSError for a real failure."""
    function = getattr(_LIBC, "renameat2", None) if _LIBC is not None else None
    if function is None:
        return False
    result = function(_AT_FDCWD, os.fsencode(str(a)), _AT_FDCWD, os.fsencode(str(b)), flags)
    if result == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    return _renameat2(a, b, _RENAME_EXCHANGE)


def swap_in(tmp: Path, path: Path) -> bool:
    """Make `tmp` the output (whether an old result was displaced into tmp's folder): one rename when there is
    none (never over anything that appears meanwhile), else an atomic exchange (the old result then lies at
    `tmp`), else two renames (it lies at `old` in tmp's folder; recover_leftovers repairs an interruption)."""
    if not os.path.lexists(path):
        try:
            if _renameat2(tmp, path, _RENAME_NOREPLACE):
                return False
        except FileExistsError:
            pass
        else:
            if not os.path.lexists(path):
                os.replace(tmp, path)
                return False
    if exchange(tmp, path):
        return True
    os.replace(path, tmp.parent / "old")
    os.replace(tmp, path)
    return True


@contextmanager
def safe_output(output, stage: str, recognise: Callable[[Path], bool], inputs: Iterable = (), is_dir: bool = False,
                what: str = "output"):
    """claim_output as a context: yields the Claim, releases its lock on exit."""
    claim = claim_output(output, stage, recognise, inputs, is_dir, what)
    try:
        yield claim
    finally:
        claim.release()
