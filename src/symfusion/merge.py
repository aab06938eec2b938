"""The merge stage: fuse the anchor with (matched) source models and write the merged model folder."""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from symfusion.arch import check_compatible, check_finite
from symfusion.errors import SymfusionError
from symfusion.fusion import FUSION_METHODS, merge_models
from symfusion.modelio import (atomic_directory, compute_device, copy_auxiliary_files, load_config, load_model,
                               write_json_atomic)
from symfusion.provenance import provenance
from symfusion.tasks import statistic_batches

# Fusion options that select data rather than being passed to the method.
DATA_OPTIONS = ("name", "num_batches")


def matching_of(model_dir: Path) -> str:
    """The matching a model folder went through ('none' for an end model)."""
    match_json = model_dir / "match.json"
    return json.loads(match_json.read_text())["matching"] if match_json.is_file() else "none"


def load_models(paths: list[str]) -> list[torch.nn.Module]:
    """Models in order (the first is the anchor), after checking they can be merged."""
    if not paths or len(paths) < 2:
        raise SymfusionError("models=[ANCHOR,SOURCE,...] needs at least two model folders")
    dirs = [Path(p) for p in paths]
    for path in dirs:
        if not path.is_dir():
            raise SymfusionError(f"model folder {path} does not exist")
    configs = [load_config(p) for p in dirs]
    for path, config in zip(dirs[1:], configs[1:]):
        check_compatible(config, configs[0], str(path), str(dirs[0]))
    models = [load_model(p) for p in dirs]
    for path, model in zip(dirs, models):
        check_finite(model.state_dict(), f"model {path}")
    check_same_shapes(models, dirs)
    return models


def check_same_shapes(models: list, dirs: list[Path]) -> None:
    """Raise naming the first tensor whose shape differs (e.g. task heads with other label counts)."""
    reference = models[0].state_dict()
    for path, model in zip(dirs[1:], models[1:]):
        for key, tensor in model.state_dict().items():
            if key not in reference or reference[key].shape != tensor.shape:
                found = tuple(reference[key].shape) if key in reference else "missing"
                raise SymfusionError(
                    f"{path} and {dirs[0]} differ in {key!r} ({tuple(tensor.shape)} vs {found}); "
                    "models with different task heads cannot be fused whole: fuse models of one label space"
                )


def model_batches(models: list[str], tasks: list, num_batches: int) -> list:
    """Statistic batches: one list shared by all models (one task), or each model's own task's batches."""
    if len(tasks) == 1:
        return statistic_batches(tasks[0], num_batches, models[0])
    if len(tasks) != len(models):
        raise SymfusionError(f"{len(tasks)} tasks for {len(models)} models: give one task, or one per model")
    return [statistic_batches(task, num_batches, model) for task, model in zip(tasks, models)]


def run_merge(models: list[str], fusion: dict, task, output: str, resolved_config: dict | None = None,
              tasks: list | None = None) -> dict:
    """Merge `models` (anchor first) with one fusion method and write `output` atomically.

    `tasks` (one per model) makes Fisher / RegMean statistics use each model's own task data;
    otherwise every model's statistics use `task`.
    """
    method = fusion["name"]
    if method not in FUSION_METHODS:
        raise SymfusionError(f"unknown fusion method {method!r}; choose one of {', '.join(FUSION_METHODS)}")
    if not output:
        raise SymfusionError("output=DIR is required (where the merged model folder is written)")
    loaded = [m.to(compute_device()) for m in load_models(models)]
    options = {k: v for k, v in fusion.items() if k not in DATA_OPTIONS}
    tasks = tasks or [task]
    batches = model_batches(models, tasks, int(fusion["num_batches"])) if "num_batches" in fusion else None
    start = time.perf_counter()
    merged_state = merge_models(method, loaded, batches, **options)
    seconds = time.perf_counter() - start
    check_finite(merged_state, f"merged model ({method})")
    merged = loaded[0].to("cpu")
    merged.load_state_dict({k: v.cpu() for k, v in merged_state.items()})
    report = {
        "method": method, "matching": matching_of(Path(models[-1])), "models": list(models),
        "task": task.name, "statistics_tasks": [t.name for t in tasks], "fusion": fusion, "seconds": seconds,
        "provenance": provenance(resolved_config),
    }
    with atomic_directory(output) as tmp:
        merged.save_pretrained(str(tmp), safe_serialization=True)
        copy_auxiliary_files(models[0], tmp)
        write_json_atomic(report, tmp / "merge.json")
    return report
