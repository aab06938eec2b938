"""The merge stage: fuse the anchor with (matched) source models; write the merged model folder, or evaluate it in place."""
from __future__ import annotations

import copy
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch

from symfusion.arch import check_finite
from symfusion.errors import SymfusionError
from symfusion.fusion import FUSION_METHODS, STAGE_KEYS, fusion_method, merge_models
from symfusion.fusion import fusion_config
from symfusion.fusion.common import batches_of
from symfusion.io.modelio import compute_device, copy_auxiliary_files, write_json
from symfusion.io.outputs import folder_marker, safe_output, writing_together
from symfusion.io.provenance import provenance
from symfusion.pipeline.command import PRECISION, Command, choice, command, listing, mapping, option, text
from symfusion.pipeline.training import autocast, use_autocast
from symfusion.pipeline.stages.common import (fusion_batches, load_models, matching_of, plain, resolved, task_of,
                                              tasks_of)
from symfusion.pipeline.stages.statistics import (STATISTIC_METHODS, StatisticFiles, batches_digest, model_digest,
                                         statistic_identity)
from symfusion.pipeline.stages.evaluate import EVAL_MARKER, evaluate_tasks, evaluation_report, merge_origin
from symfusion.pipeline.stages.mergekit import check_client, merge_by_mergekit, mergekit_cli

# Fusion options that select data rather than being passed to the method.
DATA_OPTIONS = STAGE_KEYS


def check_fusion(fusion: dict) -> str:
    """The fusion method a fusion config names (one error line when it names none)."""
    return fusion_method(fusion.get("name")).name


def statistic_examples(method: str, fusion: dict, batches: list | None, family: str) -> int:
    """How many examples per model the method's statistics used: its declared count, at most what was given."""
    if not batches:
        return 0
    first = batches[0] if isinstance(batches[0], (list, tuple)) else batches
    given = sum(int(batch["labels"].shape[0]) for batch in first)
    wanted = FUSION_METHODS[method].examples(fusion, family)
    return given if wanted is None else min(given, int(wanted))


def precomputed_statistics(method: str, fusion: dict, loaded: list, model_shas: list[str], batches: list | None,
                           files: StatisticFiles, precision: str) -> tuple[list | None, float]:
    """(per model, its statistic from `files` (symfusion-statistics) when one has its identity, else None;
    the seconds those took to compute), or (None, 0) when the method has no statistic or no file is given.
    model_shas: each loaded model's weight digest (model_digest)."""
    if not files.paths or method not in STATISTIC_METHODS or not batches:
        return None, 0.0
    device = next(loaded[0].parameters()).device
    found, seconds = [], 0.0
    for i, model in enumerate(loaded):
        identity = statistic_identity(method, fusion, model.config.model_type, model_shas[i],
                                      batches_digest(batches_of(batches, i)), f"{precision}@{device.type}")
        hit = files.lookup(identity)
        found.append(None if hit is None else {k: v.to(device) for k, v in hit[0].items()})
        seconds += 0.0 if hit is None else hit[1]
    return found, seconds


def model_digests(loaded: list, files: StatisticFiles) -> list[str] | None:
    """Each loaded model's weight digest when statistics files are given (their statistics are found by it)."""
    return [model_digest(model) for model in loaded] if files.paths else None


def fuse_loaded(loaded: list[torch.nn.Module], models: list[str], fusion: dict, task, tasks: list,
                batch_cache: dict, precision: str, files: StatisticFiles,
                model_shas: list[str] | None) -> tuple[torch.nn.Module, dict]:
    """(merged model on the CPU, merge report) of already loaded models; the loaded models are left unchanged.
    `files`: precomputed statistics (stages/statistics.py) used for the models they fit; model_shas: the
    models' digests (model_digests)."""
    method = check_fusion(fusion)
    for i, statistics_task in enumerate(tasks):
        statistics_task.check_model(loaded[i if len(tasks) > 1 else 0], f"model {models[i]}", models[i])
    options = {k: v for k, v in fusion.items() if k not in DATA_OPTIONS}
    batches = fusion_batches(models, tasks, fusion, batch_cache)
    start = time.perf_counter()
    statistics, elsewhere = precomputed_statistics(method, fusion, loaded, model_shas, batches, files, precision)
    device = next(loaded[0].parameters()).device
    with autocast(device, use_autocast(precision, device)):      # the statistic passes (Fisher, Gram, OT)
        merged_state = merge_models(method, loaded, batches, statistics, **options)
    seconds = time.perf_counter() - start + elsewhere   # a precomputed statistic's time counts as the merge's
    check_finite(merged_state, f"merged model ({method})")
    merged = copy.deepcopy(loaded[0]).to("cpu")
    merged.load_state_dict({k: v.cpu() for k, v in merged_state.items()})
    report = {
        "method": method, "matching": matching_of(Path(models[-1])), "models": list(models),
        "task": task.name, "statistics_tasks": [t.name for t in tasks], "fusion": fusion, "seconds": seconds,
        "statistic_examples": statistic_examples(method, fusion, batches, loaded[0].config.model_type),
        "precomputed_statistics": [] if statistics is None else [models[i] for i, s in enumerate(statistics)
                                                                 if s is not None],
    }
    return merged, report


# A folder is a previous output of this stage when it holds a merge report.
MERGE_MARKER = folder_marker("merge.json", ("method", "models"))


def run_merge(models: list[str], fusion: dict, task, output: str, resolved_config: dict | None = None,
              tasks: list | None = None, precision: str = "auto", statistics: list[str] | None = None) -> dict:
    """Merge `models` (anchor first) with one fusion method and write `output` atomically.

    `tasks` (one per model) makes Fisher / RegMean statistics use each model's own task data;
    otherwise every model's statistics use `task`. `statistics`: files of symfusion-statistics whose
    statistics are used for the models they fit (each file must fit one).
    """
    check_fusion(fusion)
    files = StatisticFiles(statistics)
    with safe_output(output, "symfusion-merge", MERGE_MARKER, inputs=list(models or []) + files.paths,
                     is_dir=True) as claim:
        loaded = [m.to(compute_device()) for m in load_models(models)]
        merged, report = fuse_loaded(loaded, models, fusion, task, tasks or [task], {}, precision, files,
                                     model_digests(loaded, files))
        files.check_all_used()
        report["provenance"] = provenance(resolved_config)
        with claim.writing() as tmp:
            merged.save_pretrained(str(tmp), safe_serialization=True)
            copy_auxiliary_files(models[0], tmp)
            write_json(report, tmp / "merge.json")
    return report


def merged_by_client(client: str, fusion: dict, loaded: list, models: list[str], task) -> tuple[torch.nn.Module, dict]:
    """(merged model, merge report) of a merge done by another client (mergekit: stages/mergekit.py)."""
    method = check_fusion(fusion)
    merged, done = merge_by_mergekit(method, models, loaded)
    report = {"method": method, "matching": matching_of(Path(models[-1])), "models": list(models), "task": task.name,
              "statistics_tasks": [], "fusion": fusion, "statistic_examples": 0, "precomputed_statistics": [], **done}
    return merged, report


def run_merge_evaluate(models: list[str], fusions: list[dict], task, eval_dir: str, eval_tasks: list,
                       eval_heads: list | None = None, resolved_config: dict | None = None,
                       tasks: list | None = None, precision: str = "auto",
                       statistics: list[str] | None = None, client: str = "symfusion") -> list[dict]:
    """Merge `models` with each fusion method in turn and evaluate every merged model in this process.

    Writes eval_dir/<method>.json (as symfusion-evaluate writes, plus the merge's timing) and no model
    folder: one process instead of a merge and an evaluation per method, the models loaded once.
    The merged model's tokenizer is the anchor's. client=mergekit: the merge is done by mergekit's CLI.
    """
    methods = [check_fusion(f) for f in fusions]
    if not methods or len(set(methods)) != len(methods):
        raise SymfusionError(f"methods={methods}: give one or more distinct fusion methods")
    if not eval_dir:
        raise SymfusionError("eval_dir=DIR is required (where <method>.json of each merged model is written)")
    check_client(client, methods)
    if client == "mergekit":
        mergekit_cli()                        # installed, before anything is claimed or loaded
    files = StatisticFiles(statistics)
    inputs = list(models or []) + [h for h in (eval_heads or []) if h] + files.paths
    with ExitStack() as stack:
        claims = [stack.enter_context(safe_output(Path(eval_dir) / f"{m}.json", "symfusion-merge", EVAL_MARKER,
                                                  inputs=inputs, what="eval_dir")) for m in methods]
        loaded = [m.to(compute_device()) for m in load_models(models)]
        stamp, batch_cache, model_shas, reports = provenance(resolved_config), {}, model_digests(loaded, files), []
        for fusion in fusions:
            if client != "symfusion":
                merged, merge = merged_by_client(client, fusion, loaded, models, task)
            else:
                merged, merge = fuse_loaded(loaded, models, fusion, task, tasks or [task], batch_cache, precision,
                                            files, model_shas)
            start = time.perf_counter()
            results = evaluate_tasks(merged, models[0], eval_tasks, eval_heads, precision=precision)
            origin = {**merge_origin(merge), "fusion": fusion}
            reports.append(evaluation_report(None, origin, results, "test", time.perf_counter() - start, stamp))
        files.check_all_used()
        with writing_together(claims) as temps:      # all appear together at the end, or none
            for tmp, report in zip(temps, reports):
                write_json(report, tmp)
    return reports


@command("merge")
@dataclass(frozen=True)
class Merge(Command):
    """symfusion-merge task=NAME fusion=METHOD models=[ANCHOR,SOURCE,...] output=DIR [tasks=[T_ANCHOR,T_SOURCE,...]]
    or, several methods merged and evaluated in one process (no model folder written):
    symfusion-merge task=NAME models=[..] methods=[M1,M2] eval_dir=DIR [eval_tasks=[..] eval_heads=[..]] [client=mergekit]"""
    groups = {"task": "fashion_mnist", "fusion": "simple", "profile": "mini"}
    models: list[str] = option(listing(text(), 2), "model folders; the first is the anchor (sources matched onto it)")
    tasks: list[str] | None = option(listing(text(), 1, optional=True),
                                     "one task per model: each model's Fisher/Gram statistics on its own task")
    output: str | None = option(text(optional=True), "DIR: the merged model folder (one method: fusion=NAME)")
    methods: list[str] | None = option(listing(text(), 1, optional=True),
                                       "or several methods in one process, each merged model evaluated in place "
                                       "(presets/fusion/<name>.yaml each; no model folder written)")
    method_options: dict | None = option(mapping(optional=True), "per method, on top of its preset and declared "
                                         "defaults: {regmean: {alpha: 0.1, num_batches: 2}}")
    eval_dir: str | None = option(text(optional=True), "eval_dir/<method>.json: test metrics of each merged model")
    eval_tasks: list[str] | None = option(listing(text(), 1, optional=True), "tasks to evaluate on (default: task)")
    eval_heads: list[str] | None = option(listing(text(), 1, optional=True),
                                          "text: evaluate eval_tasks[i] with the task head of the folder eval_heads[i]")
    precision: str = option(PRECISION, "auto: statistic passes under bfloat16 autocast and TF32 on a GPU, scores in "
                                       "float32 | bf16 | fp32", "auto")
    statistics: list[str] | None = option(listing(text(), 1, optional=True),
                                          "FILEs of symfusion-statistics: statistics of models fused unmoved, read "
                                          "instead of computed (each file must fit one of the models)")
    client: str = option(choice("symfusion", "mergekit"), "who merges (with methods=[..]): symfusion | mergekit "
                         "(its mergekit-yaml CLI; methods=[simple] only, the `merge` extra)", "symfusion")

    def check(self, cfg, given: set[str]) -> None:
        if self.methods and self.output:
            raise SymfusionError("give output=DIR (one method, model folder) or methods=[..] eval_dir=DIR, not both")
        if not self.methods and (self.client != "symfusion" or self.eval_dir):   # one kind of output: never both
            raise SymfusionError(f"client={self.client} and eval_dir=DIR go with methods=[..] (merged and evaluated "
                                 "in place, no model folder); a merged model folder: fusion=METHOD output=DIR")

    def run(self, cfg) -> None:
        tasks = tasks_of(cfg, self.tasks)
        if self.methods:
            options = self.method_options or {}
            fusions = [fusion_config(name, options.get(name)) for name in self.methods]
            reports = run_merge_evaluate(self.models, fusions, task_of(cfg), self.eval_dir,
                                         tasks_of(cfg, self.eval_tasks) or [task_of(cfg)], self.eval_heads,
                                         resolved(cfg), tasks=tasks, precision=self.precision,
                                         statistics=self.statistics, client=self.client)
            for report in reports:
                summary = "; ".join(f"{r['task']}: {r['metrics']}" for r in report["results"])
                print(f"merged with {report['method']} (matching {report['matching']}) in "
                      f"{report['merge_seconds']:.2f}s, evaluated: {summary} -> {self.eval_dir}/{report['method']}.json")
            return
        fusion = fusion_config(cfg.fusion.name, plain(cfg.fusion))      # the declared defaults filled in
        report = run_merge(self.models, fusion, task_of(cfg), self.output, resolved(cfg), tasks=tasks,
                           precision=self.precision, statistics=self.statistics)
        print(f"merged {len(report['models'])} models with {report['method']} "
              f"(matching {report['matching']}) in {report['seconds']:.2f}s -> {self.output}")
