"""Console-script entry points each run as its own process forked from one that imported what symfusion-worker imports.

One Python process imports every stage (cli.worker_modules()), then forks a new process per case (two at a time), as
the warm worker forks its jobs (cli._fresh_process_state in the child; the workflow runs every stage this way,
tests/pipeline/test_warm.py): each case is its own process, its fds 1 and 2 its own files, its argv `-c ARGS` as under
`python -c "...; m()"`, and it ends as the interpreter ends when the command's exception or SystemExit leaves the
top level (traceback, exit code, stopped threads joined, every atexit handler run, streams flushed) but for the
teardown of the modules it was forked with: the same in every case, 0.65 of a refusal's 1.0 CPU s on a 2-core
Xeon (a warm worker's job skips it too, warm._child). A fresh interpreter per case pays the imports (2-7 CPU s) each
time: 55 of them cost test_cli_errors 89 s on a 2-core Xeon.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FORKING_DRIVER = """
import atexit, gc, importlib, io, json, os, signal, sys, threading
from symfusion.pipeline import cli
for name in cli.worker_modules():
    importlib.import_module(name)
for name in cli.WORKER_PRELOAD_OPTIONAL:
    try:
        importlib.import_module(name)
    except ImportError:          # as the worker: a package this installation lacks is imported by no case
        pass
gc.freeze()
threads = sys.modules["torch"].get_num_threads()
cases, out = json.loads(sys.stdin.read()), sys.argv[1]
running, codes = {}, {}


def reap():
    pid, status = os.wait()
    codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)


def leave(error):
    # As the interpreter ends when `error` leaves the top level, up to the teardown of its modules (the same in every
    # case): the exit code (SystemExit's, or 1 after the traceback), stopped threads joined, the atexit handlers run
    # (all of them, the inherited ones too), garbage collected, open files flushed; Ctrl-C ends by SIGINT as in Python.
    if isinstance(error, SystemExit):
        code = error.code
        if code is not None and not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    else:
        sys.excepthook(type(error), error, error.__traceback__)
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    gc.collect()
    for stream in gc.get_objects():         # files left open (the collector's, not the frozen): flushed as freed
        if isinstance(stream, io.IOBase) and not stream.closed and stream.writable():
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    sys.stdout.flush(), sys.stderr.flush()
    if isinstance(error, KeyboardInterrupt):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code or 0)


for index, (entry, args) in enumerate(cases):
    if len(running) == 2:
        reap()
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for fd, stream in ((1, "out"), (2, "err")):
            os.dup2(os.open(os.path.join(out, f"{index}.{stream}"), os.O_WRONLY | os.O_CREAT | os.O_EXCL), fd)
        sys.argv = ["-c", *args]
        cli._fresh_process_state(threads)
        module, function = entry.split(":")
        try:
            sys.exit(getattr(importlib.import_module(module), function)())
        except BaseException as error:
            ended = error
        leave(ended)
    running[pid] = index
while running:
    reap()
print(json.dumps([codes[index] for index in range(len(cases))]))
"""


def run_forked(cases: list[tuple[str, list[str]]], out: Path, env: dict) -> list[subprocess.CompletedProcess]:
    """Each (entry point "module:function", args) run as its own forked process; `out` an empty folder for its
    streams. Returns what a fresh process would: exit code, stdout, stderr (carriage returns kept)."""
    out.mkdir(parents=True, exist_ok=True)
    driver = subprocess.run([sys.executable, "-c", FORKING_DRIVER, str(out)], input=json.dumps(cases),
                            capture_output=True, text=True, timeout=1800, env=env)
    assert driver.returncode == 0, driver.stderr[-2000:]
    codes = json.loads(driver.stdout.strip().splitlines()[-1])
    return [subprocess.CompletedProcess([entry, *args], code,
                                        (out / f"{index}.out").read_bytes().decode(),
                                        (out / f"{index}.err").read_bytes().decode())
            for index, ((entry, args), code) in enumerate(zip(cases, codes))]
