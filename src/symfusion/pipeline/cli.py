"""The console scripts of the stages (symfusion-data, -train, -match, -merge, -statistics, -evaluate, -barrier, -layers, -multimodel, -report, -align-many): a command line composed, checked and run by the command its stage module declares.

Each stage module (pipeline/stages/<name>.py) declares its command once (pipeline/command.py: its options, groups,
usage and run); symfusion-<name>'s console script is <name>_main here (pyproject.toml), which imports only that
stage, in the warm worker when one serves (warm.py). symfusion-worker runs the pipeline's warm worker: the stages
imported once, a forked child per job.
"""
from __future__ import annotations

import gc
import importlib
import os
import resource
import sys
import time

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from symfusion.io import marks
from symfusion.pipeline.allocator import keep_freed_memory
from symfusion.pipeline import warm
from symfusion.pipeline.command import command_name, compose, declaration, help_lines, is_stage, names, read
from symfusion.pipeline.config import command_line_first, given_options
from symfusion.errors import (NOTES, SymfusionError, as_symfusion_error, erase_progress, progress_wanted,
                              said_on_success)

# The exit code of a command stopped by Ctrl-C (SIGINT), as a shell reports a process killed by it, and its line:
# the output it was writing is not swapped in (outputs.py removes the temp; a previous result stays).
INTERRUPTED = 130
INTERRUPTED_LINE = "error: interrupted (Ctrl-C); nothing was written, a previous output is kept"


def error_line(error: BaseException) -> str | None:
    """The one `error: ...` line for bad input, an operating-system error (no space left, a read-only or
    forbidden folder), an unreadable file, a missing optional package; None for a bug (it keeps its traceback)."""
    if isinstance(error, OmegaConfBaseException):    # e.g. an interpolation ${...} that does not resolve
        return f"error: {str(error).strip().splitlines()[0]}; check the command line's values"
    if isinstance(error, ModuleNotFoundError):       # an optional package of the pipeline's stages
        if not error.name or error.name.split(".")[0] == "symfusion":
            return None
        return (f"error: this stage needs the package {error.name!r}, which is not installed; "
                "install the pipeline's packages with pip install 'symfusion[pipeline]'")
    translated = as_symfusion_error(error)
    return None if translated is None else f"error: {translated}"


def report_errors(command):
    """Run a stage; bad input and the system's errors end with one line on stderr and exit code 2 (error_line)."""
    def wrapper(cfg: DictConfig):
        cached = len(marks.WRITTEN)
        try:
            return command(cfg)
        except Exception as error:      # noqa: BLE001 - translated when it is bad input or the system's; else raised
            line = error_line(error)
            if line is None:
                raise
            erase_progress()                   # a terminal shows the one line alone
            kept = marks.WRITTEN[cached:]      # caches are no outputs: what this run completed stays, for the next
            print(line + (f" (kept {len(kept)} cache file(s) it completed, in {kept[0].parent})" if kept else ""),
                  file=sys.stderr)
            sys.exit(2)
    wrapper.__name__ = command.__name__
    wrapper.__doc__ = command.__doc__
    return wrapper


def stage_command(name: str):
    """symfusion-<name>'s command run on a composed configuration, whoever composed it: its options read and checked
    by its declaration (each alone, then together), then its run (errors reported as one line, report_errors)."""
    declared = declaration(name)

    def run(cfg: DictConfig) -> None:
        options = read(name, cfg)
        options.check(cfg, set())        # (command_line checks first with the options its command line gives)
        options.run(cfg)
    run.__name__, run.__doc__ = f"{name}_command", declared.__doc__
    return report_errors(run)


def command_line(config_name: str, command, argv: list[str]) -> int:
    """Compose symfusion-<config_name>'s configuration with argv's overrides, check every value, run `command`
    (stage_command(config_name)); the exit code.

    --help prints the command's usage, its options (its declaration's) with their defaults, and the composed
    configuration (--cfg: the configuration only).
    """
    if any(arg in ("--help", "-h", "--cfg") for arg in argv):
        rest = [a for a in argv if not a.startswith("-")]
        try:
            cfg = compose(config_name, rest)
        except SymfusionError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        if "--cfg" not in argv:
            print(f"usage: {(command.__doc__ or '').strip()}\n\noptions (KEY=VALUE; the default first):")
            print("\n".join(help_lines(config_name, cfg)) + "\n\nconfiguration (the defaults, composed):")
        print(OmegaConf.to_yaml(cfg))
        return 0
    flags = [a for a in argv if a.startswith("-")]
    try:
        if flags:
            raise SymfusionError(f"unknown flag {flags[0]}; options are KEY=VALUE overrides (see --help)")
        progress_wanted()                # SYMFUSION_PROGRESS is on, off or auto
        cfg = compose(config_name, argv)
        options = read(config_name, cfg)     # every option checked by its declaration
        given = given_options(argv)          # the options the command line sets
        command_line_first(cfg, given)
        options.check(cfg, given)            # the options together, and the matching by the library's MatchConfig
    except SymfusionError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    with said_on_success(sys.stderr):       # notes and warnings, after the result; a refusal's line alone
        command(cfg)
    return 0


USAGE_VARIABLE = "SYMFUSION_USAGE"     # set (the pipeline's jobs do): each command ends with its usage line


def usage_line(name: str, start: float) -> str:
    """`usage: NAME user U s, system S s, wall W s, peak RSS M MiB` of this process and its finished children
    (benchmarks/bench_pipeline.py reads it from every job's log: exact CPU seconds, where Snakemake samples)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return (f"usage: {name} user {own.ru_utime + children.ru_utime:.2f} s, "
            f"system {own.ru_stime + children.ru_stime:.2f} s, wall {time.perf_counter() - start:.2f} s, "
            f"peak RSS {max(own.ru_maxrss, children.ru_maxrss) / 1024:.0f} MiB")


def run_command(config_name: str, argv: list[str]) -> int:
    """Run symfusion-<config_name> in this process; its exit code (or SystemExit)."""
    start = time.perf_counter()
    keep_freed_memory()        # a stage process reuses freed tensor memory (allocator.py)
    try:
        return command_line(config_name, stage_command(config_name), argv)
    except KeyboardInterrupt:            # Ctrl-C: one line, no traceback (the output's temp is already gone)
        erase_progress()
        print(INTERRUPTED_LINE, file=sys.stderr, flush=True)
        return INTERRUPTED
    finally:
        if os.environ.get(USAGE_VARIABLE):
            print(usage_line(f"symfusion-{config_name}", start), file=sys.stderr, flush=True)


def entry(config_name: str):
    """A console-script main() for symfusion-<config_name> (in the warm worker when one serves)."""
    def main(argv: list[str] | None = None) -> None:
        args = sys.argv[1:] if argv is None else list(argv)
        try:
            code = warm.run_in_worker(config_name, args, NOTES)     # a note that it did not: said on success
            code = run_command(config_name, args) if code is None else code
        except KeyboardInterrupt:
            print(INTERRUPTED_LINE, file=sys.stderr, flush=True)
            code = INTERRUPTED
        sys.exit(code)
    main.__name__ = f"{config_name}_main"
    return main


def __getattr__(attribute: str):
    """<name>_main, the console script of symfusion-<name> (pyproject.toml), for every stage module
    (pipeline/stages/<name>.py): found without importing it, since a job the warm worker runs never needs the stage in
    its own process; and <name>_command, its command on a composed configuration (its stage imported)."""
    stem = attribute.removesuffix("_main").removesuffix("_command")
    name = command_name(stem)                           # align_many_main: symfusion-align-many
    if attribute.startswith("_") or stem == attribute:
        raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
    if attribute.endswith("_main"):
        if not is_stage(name):
            raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
        return entry(name)
    try:
        declaration(name)
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}") from None
    return stage_command(name)


# What the warm worker imports before it forks: every stage module (each declares its command: command.names()),
# so that no job imports torch or transformers again ...
WORKER_PRELOAD = ("torch", "transformers.modeling_utils", "symfusion.pipeline.tasks", "symfusion.matching",
                  "transformers.models.auto.tokenization_auto")
# ... and what the stages import lazily when a job needs it (each cost a forked job 1-3 CPU s): the
# pipeline's packages (metrics, optimal transport, spaCy; skipped when not installed) and, in
# worker_modules(), the transformers modeling code of every family symfusion supports.
WORKER_PRELOAD_OPTIONAL = ("sklearn.metrics", "seqeval.metrics", "seqeval.scheme", "ot", "spacy", "tabulate")


def worker_modules() -> list[str]:
    """WORKER_PRELOAD, then transformers.models.<type>.modeling_<type> of every model type in families.MODEL_TYPES."""
    from symfusion.families import MODEL_TYPES

    families = [f"transformers.models.{t}.modeling_{t}" for t in (m.replace("-", "_") for m in MODEL_TYPES)]
    return list(WORKER_PRELOAD) + families


def _fresh_process_state(default_threads: int) -> None:
    """In a worker's child: what a new process would start with (threads from the job's environment, RNGs)."""
    import numpy as np
    import tempfile
    import torch

    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0 else default_threads)
    torch.manual_seed(torch.initial_seed())       # the generator as a new process has it
    np.random.seed()                              # numpy's global generator: fresh entropy, as at start-up
    tempfile.tempdir = None                       # re-read TMPDIR


def worker_main(argv: list[str] | None = None) -> None:
    """symfusion-worker SOCKET: the pipeline's warm worker (warm.py), serving on the new socket SOCKET.

    The Snakefile starts it for a run on this machine; it exits on SIGTERM or when its parent does.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1 or args[0].startswith("-"):
        print("error: usage: symfusion-worker SOCKET (a path that does not exist yet, in an existing folder)",
              file=sys.stderr)
        sys.exit(2)
    path = args[0]
    problem = "it exists already" if os.path.lexists(path) else warm.private_socket(path, server=True)
    if problem:
        print(f"error: {path}: {problem}; the worker makes a new socket in a folder of your own", file=sys.stderr)
        sys.exit(2)
    keep_freed_memory()
    environment = dict(os.environ)
    for name in worker_modules():
        importlib.import_module(name)
    names()                              # every stage module, each with its command
    for name in WORKER_PRELOAD_OPTIONAL:
        try:
            importlib.import_module(name)
        except ImportError:              # a pipeline package this installation lacks: its jobs import nothing
            pass
    gc.freeze()     # the imported objects leave the collector: a child's collections do not copy their pages
    torch = sys.modules["torch"]
    if torch.cuda.is_available():            # forking after CUDA is unsafe: every job starts its own process
        print("worker: a GPU is visible; jobs run in their own processes", file=sys.stderr, flush=True)
        return
    default_threads = torch.get_num_threads()
    warm.serve(path, run_command, lambda: _fresh_process_state(default_threads), environment)


if __name__ == "__main__":
    entry("match")()
