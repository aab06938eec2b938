"""A pseudo-terminal for stderr (what a person at a terminal sees of a command's progress), and how a terminal shows
a stream of bytes (carriage returns overwrite the line)."""
from __future__ import annotations

import fcntl
import io
import os
import struct
import sys
import termios
import threading
from contextlib import contextmanager


def shown(text: str) -> list[str]:
    """The lines a terminal shows for `text`: a carriage return goes back to the line's start, later characters
    overwrite earlier ones; trailing blanks and a last empty line are not shown."""
    lines, line, column = [], [], 0
    for char in text:
        if char == "\r":
            column = 0
        elif char == "\n":
            lines.append("".join(line).rstrip())
            line, column = [], 0
        else:
            line[column:column + 1] = [char]
            column += 1
    if "".join(line).strip():
        lines.append("".join(line).rstrip())
    return lines


class Screen:
    """What was written to the terminal: `raw` (every byte, as text), `lines` (as the terminal shows them)."""

    def __init__(self):
        self.chunks: list[bytes] = []

    @property
    def raw(self) -> str:
        return b"".join(self.chunks).decode("utf-8", "replace")

    @property
    def lines(self) -> list[str]:
        return shown(self.raw)


@contextmanager
def terminal_stderr(columns: int = 120):
    """sys.stderr on the slave side of a new pseudo-terminal (isatty() is true) for the block; yields the Screen
    read from its master side (a terminal of 24 rows and `columns` columns)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    screen, stream = Screen(), io.TextIOWrapper(os.fdopen(slave, "wb", buffering=0), write_through=True)

    def drain():
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:                 # the slave side closed
                return
            if not chunk:
                return
            screen.chunks.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    saved = sys.stderr
    sys.stderr = stream
    try:
        yield screen
    finally:
        sys.stderr = saved
        stream.close()
        reader.join(timeout=10)
        os.close(master)

