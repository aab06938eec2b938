"""The Hydra entry points of the stages: symfusion-data, -train, -match, -merge, -statistics, -evaluate, -barrier, -layers, -multimodel, -report.

symfusion-worker runs the pipeline's warm worker (warm.py): the stages imported once, a forked child per job.

Each entry point imports its own stage inside the function (the one place in symfusion where imports
sit inside functions): a pipeline job then loads only what its stage needs, which keeps the start-up
of every one of the pipeline's jobs cheap (transformers' modeling code, POT, spaCy, matplotlib).
"""
from __future__ import annotations

import gc
import os
import resource
import sys
import time

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from symfusion.io import marks
from symfusion.pipeline.allocator import keep_freed_memory
from symfusion.pipeline import warm
from symfusion.pipeline.config import check_data_options, command_line_first, compose_config, given_options
from symfusion.pipeline.options import OPTIONS, checks, help_lines, read, texts
from symfusion.errors import (NOTES, SymfusionError, as_symfusion_error, erase_progress, note, progress_wanted,
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


# symfusion-<name> -> its command, registered by @stage(name); its options are declared in options.py's OPTIONS,
# its console script is the entry <name>_main of this module (pyproject.toml; __getattr__ below).
COMMANDS: dict = {}


def stage(name: str):
    """Register a stage command: the function (its errors reported as one line, report_errors) run for
    symfusion-<name> once conf/<name>.yaml is composed with the command line and every option checked."""
    def register(command):
        COMMANDS[name] = report_errors(command)
        return COMMANDS[name]
    return register


def _container(value):
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _resolved(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


def _task(cfg: DictConfig, name: str | None = None):
    """The stage's task object (cfg.task, or conf/task/<name>.yaml) sized by the profile (smoke shrinks text tasks)."""
    from symfusion.pipeline.tasks import make_task

    return make_task(name if name else cfg.task, cfg.get("profile"))


def _tasks(cfg: DictConfig, key: str) -> list | None:
    """The task objects named by the list option `key` (e.g. tasks=[a,b]), or None when it is not set."""
    return [_task(cfg, name) for name in _container(cfg[key])] if cfg.get(key) else None


def _matching(cfg: DictConfig):
    """The MatchConfig of cfg.matching: the chosen matching preset with every command-line override applied."""
    from symfusion.matching import MatchConfig

    return MatchConfig.from_mapping(cfg.matching)


@stage("match")
def match_command(cfg: DictConfig) -> None:
    """symfusion-match source=DIR anchor=DIR output=DIR matching=NAME [layers=[..] | last_layers=K]"""
    from symfusion.matching import matching_config
    from symfusion.pipeline.stages.match import run_match

    name, matching = cfg.matching.name, _matching(cfg)
    if matching_config(name) != matching:
        note(f"note: matching={name} overridden to {matching}")
    report = run_match(
        source=cfg.source, anchor=cfg.anchor, output=cfg.output, matching=matching, matching_name=name,
        layers=_container(cfg.layers), last_layers=cfg.last_layers,
        max_relative_output_change=cfg.max_relative_output_change, resolved_config=_resolved(cfg),
        data_task=_task(cfg, cfg.data_task) if matching.needs_data else None, data_batches=cfg.data_batches,
        data_split=cfg.data_split,
    )
    check = report.get("relative_output_change", report.get("max_block_relative_output_change"))
    print(
        f"matched {report['source']} onto {report['anchor']} ({name}): distance "
        f"{report['distance_before']:.4f} -> {report['distance_after']:.4f}, "
        f"relative output change {check:.2e}, {report['seconds']:.2f}s -> {report['output']}"
    )


@stage("data")
def data_command(cfg: DictConfig) -> None:
    """symfusion-data task=NAME output=FILE.json"""
    from symfusion.pipeline.stages.data import run_data

    manifest = run_data(_task(cfg), cfg.output, _resolved(cfg))
    sizes = ", ".join(f"{k} {v['size']}" for k, v in manifest["splits"].items())
    print(f"data {cfg.task.name}: {sizes} -> {cfg.output}")


@stage("train")
def train_command(cfg: DictConfig) -> None:
    """symfusion-train task=NAME model=NAME seed=S output=DIR [threads=N]: a ViT from scratch or a text fine-tune"""
    from symfusion.pipeline.stages.train import run_train
    from symfusion.pipeline.tasks import profile_model

    if not cfg.output:
        raise SymfusionError("output=DIR is required")
    model = _container(profile_model(cfg.model, cfg.get("profile")))
    report = run_train(_task(cfg), model, cfg.seed, cfg.output, cfg.threads, _resolved(cfg), cfg.precision)
    print(f"trained {cfg.model.name} on {cfg.task.name} (seed {cfg.seed}): validation score "
          f"{report['validation_score']:.4f} (epoch {report['best_epoch']}), {report['seconds']:.0f}s -> {cfg.output}")


@stage("merge")
def merge_command(cfg: DictConfig) -> None:
    """symfusion-merge task=NAME fusion=METHOD models=[ANCHOR,SOURCE,...] output=DIR [tasks=[T_ANCHOR,T_SOURCE,...]]
    or, several methods merged and evaluated in one process (no model folder written):
    symfusion-merge task=NAME models=[..] methods=[M1,M2] eval_dir=DIR [eval_tasks=[..] eval_heads=[..]] [client=mergekit]"""
    from symfusion.pipeline.stages.merge import fusion_config, run_merge, run_merge_evaluate

    tasks = _tasks(cfg, "tasks")
    if cfg.get("methods"):
        if cfg.get("output"):
            raise SymfusionError("give output=DIR (one method, model folder) or methods=[..] eval_dir=DIR, not both")
        options = _container(cfg.get("method_options")) or {}
        fusions = [fusion_config(name, options.get(name)) for name in _container(cfg.methods)]
        eval_tasks = _tasks(cfg, "eval_tasks") or [_task(cfg)]
        reports = run_merge_evaluate(_container(cfg.models), fusions, _task(cfg), cfg.eval_dir, eval_tasks,
                                     _container(cfg.get("eval_heads")), _resolved(cfg), tasks=tasks,
                                     precision=cfg.precision, statistics=_container(cfg.get("statistics")),
                                     client=cfg.client)
        for report in reports:
            summary = "; ".join(f"{r['task']}: {r['metrics']}" for r in report["results"])
            print(f"merged with {report['method']} (matching {report['matching']}) in {report['merge_seconds']:.2f}s, "
                  f"evaluated: {summary} -> {cfg.eval_dir}/{report['method']}.json")
        return
    if cfg.client != "symfusion" or cfg.get("eval_dir"):     # one command, one kind of output: never both
        raise SymfusionError(f"client={cfg.client} and eval_dir=DIR go with methods=[..] (merged and evaluated in "
                             "place, no model folder); a merged model folder: fusion=METHOD output=DIR")
    fusion = fusion_config(cfg.fusion.name, _container(cfg.fusion))      # the declared defaults filled in
    report = run_merge(_container(cfg.models), fusion, _task(cfg), cfg.output, _resolved(cfg),
                       tasks=tasks, precision=cfg.precision, statistics=_container(cfg.get("statistics")))
    print(f"merged {len(report['models'])} models with {report['method']} "
          f"(matching {report['matching']}) in {report['seconds']:.2f}s -> {cfg.output}")


@stage("statistics")
def statistics_command(cfg: DictConfig) -> None:
    """symfusion-statistics task=NAME model_dir=DIR methods=[fisher,regmean] output=FILE.safetensors
    [method_options={fisher: {num_batches: 2}}]: one model's Fisher / Gram statistics, for merges that fuse it unmoved"""
    from symfusion.pipeline.stages.merge import fusion_config
    from symfusion.pipeline.stages.statistics import run_statistics

    options = _container(cfg.get("method_options")) or {}
    fusions = [fusion_config(name, options.get(name)) for name in _container(cfg.methods)]
    report = run_statistics(cfg.model_dir, fusions, _task(cfg), cfg.output, _resolved(cfg), precision=cfg.precision)
    took = ", ".join(f"{m} {s:.2f}s" for m, s in report["seconds"].items())
    print(f"statistics of {report['model']} on {report['task']} ({took}) -> {cfg.output}")


@stage("evaluate")
def evaluate_command(cfg: DictConfig) -> None:
    """symfusion-evaluate task=NAME model_dir=DIR output=FILE.json [split=test] [head_from=DIR]
    or, several tasks in one process: tasks=[T1,T2] heads=[DIR1,DIR2] (each task with its model's head)"""
    from symfusion.pipeline.stages.evaluate import run_evaluate

    if cfg.get("tasks"):
        tasks = _tasks(cfg, "tasks")
        heads = _container(cfg.get("heads")) or [None] * len(tasks)
    else:
        tasks, heads = [_task(cfg)], [cfg.get("head_from")]
    report = run_evaluate(cfg.model_dir, tasks, cfg.output, cfg.split, _resolved(cfg), heads=heads,
                          precision=cfg.precision)
    summary = "; ".join(f"{r['task']}: {r['metrics']}" for r in report["results"])
    print(f"evaluated {cfg.model_dir}/{cfg.split}: {summary} -> {cfg.output}")


@stage("barrier")
def barrier_command(cfg: DictConfig) -> None:
    """symfusion-barrier task=NAME anchor=DIR source=DIR output=FILE.json [points=11]"""
    from symfusion.pipeline.stages.barrier import run_barrier

    report = run_barrier(cfg.anchor, cfg.source, _task(cfg), cfg.output, int(cfg.points), cfg.split,
                         _resolved(cfg), examples=cfg.get("examples"))
    print(f"barrier {report['matching']}: {report['barrier']:.4f} -> {cfg.output}")


@stage("layers")
def layers_command(cfg: DictConfig) -> None:
    """symfusion-layers anchor=DIR source=DIR tasks=[T_ANCHOR,T_SOURCE] output=FILE.json [matching=NAME] [examples=N]"""
    from symfusion.pipeline.stages.layers import run_layer_sweep

    if not cfg.get("tasks"):
        raise SymfusionError("tasks=[ANCHOR_TASK,SOURCE_TASK] is required")
    report = run_layer_sweep(cfg.anchor, cfg.source, _tasks(cfg, "tasks"), _matching(cfg), cfg.output,
                             int(cfg.examples) if cfg.examples else None, _resolved(cfg),
                             matching_name=cfg.matching.name)
    print(f"layer sweep: {len(report['rows'])} evaluations in {report['seconds']:.0f}s -> {cfg.output}")


@stage("multimodel")
def multimodel_command(cfg: DictConfig) -> None:
    """symfusion-multimodel models=[ANCHOR,M1,...] output=FILE.json [matching=NAME] [output_models=DIR matching.multi=anchor|barycenter]"""
    from symfusion.pipeline.stages.multimodel import run_multimodel

    report = run_multimodel(_container(cfg.models) or [], cfg.output, _matching(cfg), cfg.matching.name,
                            _resolved(cfg), output_models_dir=cfg.output_models,
                            multi=cfg.matching.get("multi", "anchor"))
    anchor, bary = report["methods"]["anchor"], report["methods"]["barycenter"]
    print(f"{report['k']} models: sum of pairwise distances {report['sum_pairwise_distance_before']:.3f} -> "
          f"{anchor['sum_pairwise_distance']:.3f} (anchor) / {bary['sum_pairwise_distance']:.3f} (barycenter) "
          f"-> {cfg.output}")


@stage("report")
def report_command(cfg: DictConfig) -> None:
    """symfusion-report artefact=NAME inputs=[FILES] output=PATH: an entry of conf/experiments.yaml (a table: output=X.csv,
    a figure: output=X.png), or artefact=report (output=report.md)"""
    from symfusion.pipeline.report.artefacts import run_report

    rows = run_report(cfg.artefact, _container(cfg.inputs) or [], cfg.output)
    print(f"{cfg.artefact}: {len(rows)} rows -> {cfg.output}")


# What every command accepts: its options' declaration (pipeline/options.py), the checks derived from it.
CHECKS = {name: checks(name) for name in OPTIONS}


def command_line(config_name: str, command, argv: list[str]) -> int:
    """Compose conf/<config_name>.yaml with argv's overrides, check every value, run `command`; the exit code.

    --help prints the command's usage, its options (declared in pipeline/options.py) with their defaults, and the
    composed configuration (--cfg: the configuration only).
    """
    if any(arg in ("--help", "-h", "--cfg") for arg in argv):
        rest = [a for a in argv if not a.startswith("-")]
        try:
            cfg = compose_config(config_name, rest, texts(config_name))
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
        cfg = compose_config(config_name, argv, texts(config_name))
        read(config_name, cfg)           # every option checked by its declaration (pipeline/options.py)
        given = given_options(argv)      # the options the command line sets
        command_line_first(cfg, given)
        if "matching" in cfg:            # matching.* is checked by the library's declaration (MatchConfig), once
            matching = _matching(cfg)
            if config_name == "match":
                check_data_options(cfg, matching, given)
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
    """Run the stage command of conf/<config_name>.yaml in this process; its exit code (or SystemExit)."""
    start = time.perf_counter()
    keep_freed_memory()        # a stage process reuses freed tensor memory (allocator.py)
    try:
        return command_line(config_name, COMMANDS[config_name], argv)
    except KeyboardInterrupt:            # Ctrl-C: one line, no traceback (the output's temp is already gone)
        erase_progress()
        print(INTERRUPTED_LINE, file=sys.stderr, flush=True)
        return INTERRUPTED
    finally:
        if os.environ.get(USAGE_VARIABLE):
            print(usage_line(f"symfusion-{config_name}", start), file=sys.stderr, flush=True)


def entry(config_name: str, command):
    """A console-script main() for `command` with conf/<config_name>.yaml (in the warm worker when one serves)."""
    def main(argv: list[str] | None = None) -> None:
        args = sys.argv[1:] if argv is None else list(argv)
        try:
            code = warm.run_in_worker(config_name, args, NOTES)     # a note that it did not: said on success
            code = run_command(config_name, args) if code is None else code
        except KeyboardInterrupt:
            print(INTERRUPTED_LINE, file=sys.stderr, flush=True)
            code = INTERRUPTED
        sys.exit(code)
    main.__doc__ = command.__doc__
    return main


def __getattr__(attribute: str):
    """<name>_main, the console script of symfusion-<name> (pyproject.toml) for every registered command."""
    name = attribute.removesuffix("_main")
    if attribute.endswith("_main") and name in COMMANDS:
        return entry(name, COMMANDS[name])
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


# What the warm worker imports before it forks: every stage (each command's declaration names its module), so that
# no job imports torch or transformers again.
WORKER_PRELOAD = ("torch", "transformers.modeling_utils", "symfusion.pipeline.tasks", "symfusion.matching",
                  *(declared.stage for declared in OPTIONS.values()), "transformers.models.auto.tokenization_auto")
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
    import importlib

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
    entry("match", COMMANDS["match"])()
