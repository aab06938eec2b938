"""Console-script entry points each run as its own process forked from one that imported what symfusion-worker imports.

One Python process imports every stage (cli.worker_modules()), then forks a new process per case (two at a time), as
the warm worker forks its jobs (cli._fresh_process_state in the child; the workflow runs every stage this way,
tests/pipeline/test_warm.py): each case is its own process, its fds 1 and 2 its own files, its argv `-c ARGS` as under
`python -c "...; m()"`, and it ends through the interpreter's own exit (an exception or SystemExit raised by the
command leaves the top level: traceback, exit code and atexit as in a fresh process). A fresh interpreter per case
pays the imports (2-7 CPU s) each time: 55 of them cost test_cli_errors 89 s on a 2-core Xeon.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FORKING_DRIVER = """
import gc, importlib, json, os, sys
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
        sys.exit(getattr(importlib.import_module(module), function)())
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
