"""The evaluate stage: accuracy and loss of an image classifier on one split, as JSON."""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from symfusion.errors import SymfusionError


@torch.no_grad()
def evaluate_image_classifier(model: torch.nn.Module, dataset, batch_size: int = 512) -> dict:
    """{"accuracy", "loss" (mean cross-entropy), "n"} of `model` on `dataset`; the model is left in eval mode."""
    model.eval()
    correct, loss_sum, count = 0, 0.0, 0
    for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False):
        logits = model(pixel_values=batch["pixel_values"]).logits
        loss_sum += torch.nn.functional.cross_entropy(logits.double(), batch["labels"], reduction="sum").item()
        correct += (logits.argmax(dim=-1) == batch["labels"]).sum().item()
        count += batch["labels"].shape[0]
    if count == 0:
        raise SymfusionError("the evaluation split is empty; check the task's limit settings")
    return {"accuracy": correct / count, "loss": loss_sum / count, "n": count}


def model_origin(model_dir: Path) -> dict:
    """How a model folder was made: end model, or merged with which method and matching."""
    merge_json = model_dir / "merge.json"
    if merge_json.is_file():
        merge = json.loads(merge_json.read_text())
        return {"method": merge["method"], "matching": merge["matching"]}
    return {"method": "end_model", "matching": "none"}


def run_evaluate(model: str, task, output: str, split: str = "test", resolved_config: dict | None = None) -> dict:
    """Evaluate a model folder on a task's split and write the JSON atomically."""
    from symfusion.modelio import load_model, write_json_atomic
    from symfusion.provenance import provenance
    from symfusion.tasks import evaluate_split

    if not model or not Path(model).is_dir():
        raise SymfusionError(f"model={model}: no such model folder; pass a save_pretrained directory")
    if not output:
        raise SymfusionError("output=FILE.json is required")
    loaded = load_model(model)
    start = time.perf_counter()
    metrics = evaluate_split(loaded, task, split)
    report = {"model": str(model), **model_origin(Path(model)), "task": task.name, "split": split,
              "metrics": metrics, "seconds": time.perf_counter() - start, "provenance": provenance(resolved_config)}
    write_json_atomic(report, output)
    return report
