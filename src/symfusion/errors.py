"""The one exception type for bad user input, the one translation of the operating system's and file readers' errors into its one-line message, and the notes a command prints once it has succeeded."""
from __future__ import annotations

import errno
import re
import warnings
from contextlib import contextmanager

from safetensors import SafetensorError


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
