"""The one exception type for bad user input, the one translation of the operating system's and file readers' errors into its one-line message, the notes a command prints once it has succeeded, and the progress it shows meanwhile on a terminal."""
from __future__ import annotations

import errno
import os
import re
import sys
import warnings
from contextlib import contextmanager
from contextvars import ContextVar

from safetensors import SafetensorError
from tqdm import tqdm


class SymfusionError(Exception):
    """Raised for bad input (paths, configs, weights); the CLIs print it as one line and exit 2."""


# What the running command says besides its result (a difference between the models it proceeded with, an
# override): the CLIs print each once on stderr after the command has succeeded; a refusal drops them, so its
# one `error:` line is all of stderr. The Python API returns them in its report.
NOTES: list[str] = []


def note(line: str) -> None:
    """Add a note for the running command (printed once however often it is added)."""
    NOTES.append(line)


@contextmanager
def said_on_success(stream):
    """Run a command with its notes and Python warnings held back: written to `stream` once it has succeeded,
    dropped when it ends otherwise (a refusal's one `error:` line is then all of stderr)."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            yield
        for found in caught:
            warnings.showwarning(found.message, found.category, found.filename, found.lineno)
        for line in dict.fromkeys(NOTES):
            print(line, file=stream)
    finally:
        NOTES.clear()


# What a user can do about an operating-system error, by errno (the rest get the system's own words).
_ADVICE = {
    errno.ENOSPC: "no space left on the device; free some space or choose an output on another device",
    errno.EDQUOT: "disk quota exceeded; free some space or choose an output elsewhere",
    errno.EROFS: "read-only file system; choose a writable location",
    errno.EACCES: "permission denied; choose a location you may write (or read) or change its permissions",
    errno.EPERM: "operation not permitted; choose a location you may write (or read) or change its permissions",
    errno.ENOENT: "no such file or directory (was it removed while the command ran?)",
    errno.EMFILE: "too many open files; raise the limit (ulimit -n) or close other programs",
    errno.ENAMETOOLONG: "file name too long; choose a shorter path",
}


_OS_ERROR = re.compile(r"os error (\d+)")     # how safetensors' Rust code names the system's errno


def as_symfusion_error(error: BaseException) -> SymfusionError | None:
    """A one-line SymfusionError for an operating-system error (OSError: no space left, read-only folders,
    permissions, ...) or an unreadable safetensors file; None for anything else (a bug keeps its traceback)."""
    if isinstance(error, SymfusionError):
        return error
    if isinstance(error, OSError):
        where = " -> ".join(str(name) for name in (error.filename, error.filename2) if name is not None)
        advice = _ADVICE.get(error.errno) or (error.strerror or str(error) or type(error).__name__)
        return SymfusionError(f"{where}: {advice}" if where else f"{advice}".replace("\n", " "))
    if isinstance(error, SafetensorError):
        text = (str(error).strip().splitlines() or ["unreadable"])[0][:200]
        system = _OS_ERROR.search(text)          # the writer's I/O failed (no space left, ...): the system's advice
        if system and int(system.group(1)) in _ADVICE:
            return SymfusionError(f"a safetensors file could not be written: {_ADVICE[int(system.group(1))]}")
        if "serializ" in text.lower():
            return SymfusionError(f"a safetensors file could not be written ({text})")
        return SymfusionError(f"a safetensors file could not be read ({text}); re-export the model")
    return None


# Progress of long work (a folder's layers, descent passes, training steps, a sweep's points): a bar with the time
# left on stderr, shown on a terminal and off otherwise (pipes, Snakemake's logs, CI). SYMFUSION_PROGRESS=on|off|auto
# (auto, the default: on when stderr is a terminal) switches it for the commands; align(progress=...) for one call.
PROGRESS_VARIABLE = "SYMFUSION_PROGRESS"
_SETTINGS = {"on": True, "1": True, "off": False, "0": False, "auto": None, "": None}
_CHOSEN: ContextVar[bool | None] = ContextVar("symfusion_progress", default=None)      # progress_shown's choice


def progress_wanted(progress: bool | None = None) -> bool:
    """Whether long work shows its progress: `progress` when given, else the enclosing progress_shown's choice,
    else SYMFUSION_PROGRESS (a value other than on, off, auto is a SymfusionError), else whether stderr is a
    terminal."""
    if progress is not None:
        return bool(progress)
    if _CHOSEN.get() is not None:
        return _CHOSEN.get()
    setting = os.environ.get(PROGRESS_VARIABLE, "").strip().lower()
    if setting not in _SETTINGS:
        raise SymfusionError(f"{PROGRESS_VARIABLE}={setting!r}: give on, off or auto (auto: progress on a terminal)")
    chosen = _SETTINGS[setting]
    return chosen if chosen is not None else bool(getattr(sys.stderr, "isatty", lambda: False)())


@contextmanager
def progress_shown(progress: bool | None):
    """Long work inside the block shows its progress or not as `progress` says (None: progress_wanted's default)."""
    token = _CHOSEN.set(progress_wanted(progress))
    try:
        yield
    finally:
        _CHOSEN.reset(token)


_OPEN: list[list] = []           # the bars being drawn, outermost first (each in a list of its own: one per loop)


def steps(items, what: str, unit: str = "step", total: int | None = None):
    """`items` one by one; while progress_wanted(), a bar on stderr shows how many of `total` (len(items) when it
    has one) `what` are done and the time left. One line at a time: a loop inside another's shows its count on that
    bar's line. A bar ends at its last count (a loop left early, as a converged descent, at 100%) and is erased, so
    stderr holds no progress once the work is over: a command's result, or its refusal's one line, stands alone
    (erase_progress, before an error line, erases any bar still drawn)."""
    total = len(items) if total is None and hasattr(items, "__len__") else total
    if not progress_wanted():
        yield from items
        return
    own = not _OPEN
    bar = tqdm(total=total, desc=what, unit=unit, file=sys.stderr, position=0, leave=False, dynamic_ncols=True) \
        if own else _OPEN[-1][0]
    entry, done, ended = [bar], 0, "left"
    _OPEN.append(entry)
    try:
        for item in items:
            if not own:
                bar.set_postfix_str(f"{what} {done}/{'?' if total is None else total}")
            yield item
            done += 1
            if own:
                bar.update()
        ended = "done"
    except GeneratorExit:        # the caller left the loop: a break (the step in hand is done), or an error
        raise
    except BaseException:        # `items` itself failed
        ended = "failed"
        raise
    finally:
        _OPEN[:] = [e for e in _OPEN if e is not entry]
        if not own:
            if not bar.disable:
                bar.set_postfix_str("", refresh=False)
        else:
            if ended == "left":
                bar.update()
            if ended != "failed" and not bar.disable:
                bar.total = bar.n if total is not None else None
                bar.refresh()            # its last count, then erased
            bar.close()


@contextmanager
def library_call(progress: bool | None):
    """A library entry's block (align(), align_many()): progress as `progress` says (progress_shown); an error raised
    inside leaves as one SymfusionError line (as_symfusion_error: the system's errors, no space left, ...), its bars
    erased first; anything it does not translate leaves as it came."""
    try:
        with progress_shown(progress):
            yield
    except BaseException as error:      # noqa: BLE001 - the system's errors become one line
        erase_progress()                # the bars go before the error is said
        translated = as_symfusion_error(error) if isinstance(error, Exception) else None
        if translated is None or translated is error:
            raise
        raise translated from error


def erase_progress() -> None:
    """Erase every bar still drawn (the CLIs, align() and align_many() call it before a refusal's one line)."""
    for entry in reversed(_OPEN):
        entry[0].close()
    _OPEN.clear()
