"""The evaluate stage: metrics of a model folder on one or more tasks (image accuracy/loss; text task metrics), as JSON."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from symfusion.errors import SymfusionError
from symfusion.io.folder import read_json
from symfusion.io.modelio import compute_device, load_model, write_json
from symfusion.io.outputs import file_marker, safe_output
from symfusion.io.provenance import provenance
from symfusion.pipeline.command import PATH, PRECISION, SPLIT, Command, command, listing, option, text
from symfusion.pipeline.stages.common import resolved, task_of, tasks_of
from symfusion.pipeline.training import evaluation_precision

# A file is a previous output of this stage (or of the merge stage's in-process evaluation) when it is an
# evaluation report.
EVAL_MARKER = file_marker(("method", "metrics", "results"))


def model_origin(model_dir: Path) -> dict:
    """How a model folder was made: end model, or merged with which method and matching."""
    if os.path.lexists(Path(model_dir) / "merge.json"):             # inside the folder, a regular file, bounded
        merge = read_json(model_dir, "merge.json", "merge report")
        missing = [key for key in MERGE_FIELDS if key not in merge]
        if missing:
            raise SymfusionError(f"{Path(model_dir) / 'merge.json'} lacks {', '.join(missing)}: it is no merge report "
                                 "of symfusion-merge; merge the models again")
        return merge_origin(merge)
    return {"method": "end_model", "matching": "none"}


MERGE_FIELDS = ("method", "matching", "seconds", "models")       # what merge_origin reads of a merge report


def merge_origin(merge: dict) -> dict:
    """The origin fields of a merged model, from its merge report (merge.json)."""
    return {"method": merge["method"], "matching": merge["matching"], "merge_seconds": merge["seconds"],
            "merged_models": merge["models"], "statistic_examples": merge.get("statistic_examples"),
            **{key: merge[key] for key in ("client", "mergekit") if key in merge}}   # a merge by another client


def evaluate_tasks(model: torch.nn.Module, model_dir: str | Path, tasks: list, heads: list | None = None,
                   split: str = "test", precision: str = "auto") -> list[dict]:
    """Per task object: metrics of `model` on its split (with the head of heads[i] copied in first, if given).

    `model_dir` is where the tokenizer of a text model lives; `model` is moved to the compute device.
    """
    heads = heads or [None] * len(tasks)
    if len(heads) != len(tasks):
        raise SymfusionError(f"{len(heads)} heads for {len(tasks)} tasks: give one head folder per task")
    results = []
    for task, head in zip(tasks, heads):
        if head:
            task.copy_head(model, head)
        device = compute_device()
        model.to(device)
        with evaluation_precision(precision, device):
            metrics = task.evaluate(model, split, model_dir=model_dir)
        results.append({"task": task.name, "kind": task.kind, "metric": task.metric_name,
                        "split": split, "head_from": head, "per_example": metrics.pop("per_example"),
                        "metrics": metrics})
    return results


def evaluation_report(model: str | None, origin: dict, results: list[dict], split: str, seconds: float,
                      stamp: dict) -> dict:
    """The JSON of one evaluated model: where it came from, the first task's metrics, every task's results,
    and the provenance `stamp` of the run."""
    return {"model": model, **origin, "task": results[0]["task"], "split": split, "metrics": results[0]["metrics"],
            "results": results, "seconds": seconds, "provenance": stamp}


def run_evaluate(model: str, tasks: list, output: str, split: str = "test", resolved_config: dict | None = None,
                 heads: list | None = None, precision: str = "auto") -> dict:
    """Evaluate a model folder on each task's split (text: with the head of heads[i] if given), one JSON."""
    if not model or not Path(model).is_dir():
        raise SymfusionError(f"model_dir={model}: no such model folder; pass a save_pretrained directory")
    inputs = [model] + [h for h in (heads or []) if h]
    with safe_output(output, "symfusion-evaluate", EVAL_MARKER, inputs=inputs) as claim:
        loaded = load_model(model)
        start = time.perf_counter()
        results = evaluate_tasks(loaded, model, tasks, heads, split, precision)
        report = evaluation_report(str(model), model_origin(Path(model)), results, split,
                                   time.perf_counter() - start, provenance(resolved_config))
        with claim.writing() as tmp:
            write_json(report, tmp)
    return report


@command("evaluate")
@dataclass(frozen=True)
class Evaluate(Command):
    """symfusion-evaluate task=NAME model_dir=DIR output=FILE.json [split=test] [head_from=DIR]
    or, several tasks in one process: tasks=[T1,T2] heads=[DIR1,DIR2] (each task with its model's head)"""
    groups = {"task": "fashion_mnist", "profile": "mini"}
    model_dir: str = option(PATH, "save_pretrained folder (end model or merged model)")
    output: str = option(PATH, "FILE.json: the metrics")
    split: str = option(SPLIT, "the split evaluated", "test")
    head_from: str | None = option(text(optional=True), "text: evaluate with the task head of this model folder")
    precision: str = option(PRECISION, "auto, fp32: scores in float32 (no TF32 on a GPU) | bf16: bfloat16 autocast",
                            "auto")
    tasks: list[str] | None = option(listing(text(), 1, optional=True), "or several tasks in one process ...")
    heads: list[str] | None = option(listing(text(), 1, optional=True), "... each with the head of heads[i]")

    def run(self, cfg) -> None:
        if self.tasks:
            tasks = tasks_of(cfg, self.tasks)
            heads = self.heads or [None] * len(tasks)
        else:
            tasks, heads = [task_of(cfg)], [self.head_from]
        report = run_evaluate(self.model_dir, tasks, self.output, self.split, resolved(cfg), heads=heads,
                              precision=self.precision)
        summary = "; ".join(f"{r['task']}: {r['metrics']}" for r in report["results"])
        print(f"evaluated {self.model_dir}/{self.split}: {summary} -> {self.output}")
