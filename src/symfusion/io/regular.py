"""Reading a file found in a results folder: a regular file of bounded size, opened without waiting, or one line.

A results folder is written by the pipeline but lies where anyone may put anything: a reader that globs it, or
opens a name it expects there, may meet a FIFO (opening it would wait for a writer forever), a device or a link
to one (/dev/zero would be read until memory runs out), or a file far larger than any result. `read_regular`
opens without blocking (O_NONBLOCK), checks the opened file itself (fstat: no race with a rename) and reads at
most `limit` bytes; anything else is a SymfusionError line naming the file. `is_regular` is the test a glob
reader uses to skip such an entry (following a link, never opening it).
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from symfusion.errors import SymfusionError

RESULT_BYTES = 256 * 2**20      # more than any JSON, CSV, Markdown or YAML a stage writes (the largest: a few MiB)


def is_regular(path: str | Path) -> bool:
    """Whether `path` (after following links) is a regular file; never opens it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def read_regular(path: str | Path, limit: int = RESULT_BYTES) -> bytes:
    """The bytes of the regular file `path` (at most `limit` of them), or a one-line SymfusionError: a FIFO,
    device, socket or folder (or a link to one), a larger file, or the system's reason it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise SymfusionError(f"cannot read {path} ({error.strerror})") from error
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SymfusionError(f"{path} is not a regular file (a FIFO, a device, a socket or a folder); move it "
                                 "away or give the file itself")
        if info.st_size > limit:
            raise SymfusionError(f"{path} is {info.st_size} bytes, more than a result file holds ({limit} at most); "
                                 "give the stage's own output")
        try:
            data = handle.read(limit + 1)
        except OSError as error:
            raise SymfusionError(f"cannot read {path} ({error.strerror})") from error
    if len(data) > limit:
        raise SymfusionError(f"{path} grew past {limit} bytes while it was read; give the stage's own output")
    return data


def read_regular_text(path: str | Path, limit: int = RESULT_BYTES) -> str:
    """read_regular as UTF-8 text (a UnicodeDecodeError, a ValueError, for the caller's own message)."""
    return read_regular(path, limit).decode("utf-8")


__all__ = ["RESULT_BYTES", "is_regular", "read_regular", "read_regular_text"]
