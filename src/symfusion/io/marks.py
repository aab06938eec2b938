"""Bookkeeping beside an output, made safe against what others plant there: marked temp folders, this user's files, locks.

A writer keeps files beside its outputs (a lock, a temp folder, a trainer's checkpoint, cache entries) under
names anyone who may write into the folder can predict. So nothing is trusted by its name alone:
- a folder is this writer's only when it is a real folder (no symbolic link) of this user holding TEMP_MARK,
  "symfusion KIND HOST PID", written when the folder was made (`marked_folder`); cleanup removes only such
  folders (`remove_own`), and a killed writer's folder is recognised by the pid in its mark, not its name; the
  one exception is a writer killed between mkdtemp and its mark: an empty folder (or one holding only the start
  of the mark) of this user, mode 0700, named NAME.tmp-HOST-PID-XXXXXXXX for this host and a dead pid
  (`unmarked_leftover`): emptied, nothing of anyone's is lost;
- a file is read only when it is a plain file of this user, opened without following a link (`read_own`): a
  cache entry or checkpoint someone else planted is never read;
- a lock file is created new (O_EXCL) or taken over only when it is a plain file of this user with one name
  and a lock line, never through a link (O_NOFOLLOW) (`open_lock`): nothing planted under its name is written;
- a Ctrl-C while such a thing is made and recorded is held until it is recorded (`interrupts_held`), so the
  interrupt's unwinding removes it instead of leaving it behind.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import socket
import stat
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

from symfusion.errors import SymfusionError

HOST = socket.gethostname().replace("-", "_")
WRITTEN: list[Path] = []                      # the cache entries write_own wrote in this process (an error names them)
TEMP_MARK = ".symfusion-temp"                 # in every marked folder: "symfusion KIND HOST PID"
_LOCK_LINE = re.compile(rb"(symfusion lock )?\S+ \d+\n?")    # what a lock file holds (older ones: "HOST PID")


def _owned(info: os.stat_result) -> bool:
    return info.st_uid == os.geteuid()


def read_own(path: Path, limit: int | None = None) -> bytes | None:
    """The bytes of `path` when it is a plain file of this user (opened without following a link, at most
    `limit` bytes), else None: a cache entry or mark that anyone else planted is never read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not _owned(info) or (limit is not None and info.st_size > limit):
            return None
        with os.fdopen(os.dup(fd), "rb") as handle:
            return handle.read()
    except OSError:
        return None
    finally:
        os.close(fd)


@contextmanager
def interrupts_held():
    """Ctrl-C (SIGINT under Python's default handler, in the main thread) inside the block is raised as
    KeyboardInterrupt when the block ends, so what the block makes (a lock file, a temp folder) is recorded where the
    interrupt's unwinding removes it; raised at once, it could land between the making and the record and leave it
    behind. Elsewhere (another thread, another handler, inside an outer such block) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    caught = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if caught:
            raise KeyboardInterrupt


def write_own(path: Path, write) -> bool:
    """Write a file (a cache entry) atomically: write(temp name) into a new temp file beside `path`, renamed over
    it; nothing when something not this user's plain file is at `path` (it stays). Whether it was written."""
    path = Path(path)
    if os.path.lexists(path) and not is_own(path):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    name = None
    try:
        with interrupts_held():                  # a Ctrl-C as the temp file is made: raised once it is named
            handle, name = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
            os.close(handle)
        write(name)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(name, 0o666 & ~umask)       # mkstemp creates 0600; a cache is shared like any file
        os.replace(name, path)
    except BaseException:
        if name is not None:
            Path(name).unlink(missing_ok=True)
        raise
    WRITTEN.append(path)
    return True


def is_own(path: Path, folder: bool = False) -> bool:
    """Whether `path` is a plain file (or, with folder=True, a real folder) of this user, not a link: what a cache
    may read or reuse (another user's entry, or a link planted under its name, never is)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) if folder else stat.S_ISREG(info.st_mode)) and _owned(info)


def own_folder(path: Path, kind: str | None = None) -> tuple[str, int] | None:
    """(host, pid) of the writer whose mark a folder carries: a real folder (no link) of this user holding
    TEMP_MARK "symfusion KIND HOST PID" (of `kind`, when given); None for anything else."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or not _owned(info):
        return None
    mark = read_own(Path(path) / TEMP_MARK, limit=4096)
    parts = mark.decode("utf-8", "replace").split() if mark else []
    if len(parts) != 4 or parts[0] != "symfusion" or (kind is not None and parts[1] != kind) or not parts[3].isdigit():
        return None
    return parts[2], int(parts[3])


def _mark_line(kind: str, pid: int) -> str:
    return f"symfusion {kind} {HOST} {pid}\n"


def mark(folder: Path, kind: str) -> Path:
    """Put this writer's mark of `kind` into a folder it has just made; the folder."""
    (Path(folder) / TEMP_MARK).write_text(_mark_line(kind, os.getpid()))
    return Path(folder)


def marked_folder(parent: Path, prefix: str, kind: str = "temp") -> Path:
    """A new folder in `parent` (mkdtemp: a fresh name, this user only) carrying this writer's mark; a failure or
    Ctrl-C while it is made removes it."""
    folder = None
    try:
        with interrupts_held():
            folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
            mark(folder, kind)
    except BaseException:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def unmarked_leftover(folder: Path, prefix: str) -> bool:
    """Whether `folder` is what `marked_folder(parent, prefix + "HOST-PID-")` leaves when its writer is killed after
    mkdtemp and before its mark is whole: a real folder of this user with mkdtemp's mode (0700) and name (8 of its
    characters after this host and a dead pid), holding nothing or only the start of its own mark. Such a folder
    can be removed (`os.rmdir`) without losing anything; anything else never matches."""
    folder = Path(folder)
    found = re.fullmatch(re.escape(prefix) + re.escape(HOST) + r"-(\d+)-[a-z0-9_]{8}", folder.name)
    try:
        info = os.lstat(folder)
    except OSError:
        return False
    if found is None or not stat.S_ISDIR(info.st_mode) or not _owned(info) or stat.S_IMODE(info.st_mode) != 0o700:
        return False
    pid = int(found.group(1))
    if pid_alive(pid):                                  # this process included
        return False
    entries = os.listdir(folder)
    if entries == []:
        return True
    if entries != [TEMP_MARK]:
        return False
    partial = read_own(folder / TEMP_MARK, limit=4096)
    return partial is not None and _mark_line("temp", pid).encode().startswith(partial)


def remove_own(path: Path, kind: str | None = None) -> bool:
    """Remove a folder only when it carries this user's mark (of `kind`); whether it did."""
    if own_folder(path, kind) is None:
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


# ---------------------------------------------------------------- the lock

def open_lock(lock: Path) -> tuple[int, bool]:
    """(fd, created) of the lock file: created new, or an existing plain file of this user holding a lock line;
    never a link, another user's file, a hard link or a file with other data (one error line for those)."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        return os.open(lock, flags | os.O_CREAT | os.O_EXCL, 0o644), True
    except FileExistsError:
        pass
    try:
        fd = os.open(lock, flags)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise SymfusionError(f"{lock} is a symbolic link, not symfusion's lock file; remove it (someone may be "
                                 "trying to redirect this command's writes)") from error
        if error.errno == errno.EISDIR:
            raise SymfusionError(f"{lock} is a folder, not symfusion's lock file; move it away, or choose another "
                                 "output") from error
        raise
    info = os.fstat(fd)
    problem = ("is not a plain file" if not stat.S_ISREG(info.st_mode) else "belongs to another user"
               if not _owned(info) else "has other names (a hard link)" if info.st_nlink != 1 else None)
    if problem is None:
        content = os.pread(fd, 256, 0)
        if content and not _LOCK_LINE.fullmatch(content):
            problem = "holds other data than a lock line"
    if problem is not None:
        os.close(fd)
        raise SymfusionError(f"{lock} {problem}: it is not symfusion's lock file; remove it, or choose another output")
    return fd, False


def pid_alive(pid: int) -> bool:
    """Whether a process of this host with that pid exists (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
