"""The evaluate stage: metrics of a model folder on one or more tasks (image accuracy/loss; text task metrics), as JSON."""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from symfusion.errors import SymfusionError
from symfusion.modelio import compute_device, load_model, write_json_atomic
from symfusion.provenance import provenance


def model_origin(model_dir: Path) -> dict:
    """How a model folder was made: end model, or merged with which method and matching."""
    merge_json = model_dir / "merge.json"
    if merge_json.is_file():
        return merge_origin(json.loads(merge_json.read_text()))
    return {"method": "end_model", "matching": "none"}


def merge_origin(merge: dict) -> dict:
    """The origin fields of a merged model, from its merge report (merge.json)."""
    return {"method": merge["method"], "matching": merge["matching"], "merge_seconds": merge["seconds"],
            "merged_models": merge["models"]}


def evaluate_tasks(model: torch.nn.Module, model_dir: str | Path, tasks: list, heads: list | None = None,
                   split: str = "test") -> list[dict]:
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
        model.to(compute_device())
        results.append({"task": task.name, "kind": task.kind, "metric": task.metric_name,
                        "split": split, "head_from": head,
                        "metrics": task.evaluate(model, split, model_dir=model_dir)})
    return results


def evaluation_report(model: str | None, origin: dict, results: list[dict], split: str, seconds: float,
                      stamp: dict) -> dict:
    """The JSON of one evaluated model: where it came from, the first task's metrics, every task's results,
    and the provenance `stamp` of the run."""
    return {"model": model, **origin, "task": results[0]["task"], "split": split, "metrics": results[0]["metrics"],
            "results": results, "seconds": seconds, "provenance": stamp}


def run_evaluate(model: str, tasks: list, output: str, split: str = "test", resolved_config: dict | None = None,
                 heads: list | None = None) -> dict:
    """Evaluate a model folder on each task's split (text: with the head of heads[i] if given), one JSON."""
    if not model or not Path(model).is_dir():
        raise SymfusionError(f"model_dir={model}: no such model folder; pass a save_pretrained directory")
    if not output:
        raise SymfusionError("output=FILE.json is required")
    loaded = load_model(model)
    start = time.perf_counter()
    results = evaluate_tasks(loaded, model, tasks, heads, split)
    report = evaluation_report(str(model), model_origin(Path(model)), results, split,
                               time.perf_counter() - start, provenance(resolved_config))
    write_json_atomic(report, output)
    return report
