"""What several stages share: their commands' task and matching objects, loading and checking model folders, fusion statistic batches, and checking that a symmetry kept the function."""
from __future__ import annotations

import os
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from symfusion.families import check_compatible
from symfusion.errors import SymfusionError
from symfusion.matching import MatchConfig
from symfusion.pipeline.tasks import make_task
from symfusion.measures import model_outputs, probe_inputs
from symfusion.io.folder import read_json
from symfusion.io.modelio import load_config, load_model
from symfusion.io.untie import is_tied, untied


def plain(value):
    """A composed configuration's value as plain Python (lists, dicts), interpolations resolved."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def resolved(cfg: DictConfig) -> dict:
    """The whole composed configuration of a command, for its result's provenance."""
    return OmegaConf.to_container(cfg, resolve=True)


def task_of(cfg: DictConfig, name: str | None = None):
    """A command's task object (cfg.task, or conf/task/<name>.yaml) sized by the profile (smoke shrinks text tasks)."""
    return make_task(name if name else cfg.task, cfg.get("profile"))


def tasks_of(cfg: DictConfig, names: list[str] | None) -> list | None:
    """The task objects of a list option (e.g. tasks=[a,b]), or None when it is not set."""
    return [task_of(cfg, name) for name in names] if names else None


def match_config(cfg: DictConfig) -> MatchConfig:
    """The MatchConfig of cfg.matching: the chosen matching preset with every command-line override applied."""
    return MatchConfig.from_mapping(cfg.matching)


def require_folder(value, name: str) -> Path:
    """An existing folder given as `name=DIR`, or a one-line error."""
    if not value:
        raise SymfusionError(f"{name}=DIR is required (a save_pretrained model folder)")
    path = Path(value)
    if not path.is_dir():
        raise SymfusionError(f"{name}={value}: no such directory")
    return path


def matching_of(model_dir: Path) -> str:
    """The matching a model folder went through ('none' for an end model)."""
    if not os.path.lexists(Path(model_dir) / "match.json"):
        return "none"
    record = read_json(model_dir, "match.json", "match report")          # inside the folder, a regular file, bounded
    if not isinstance(record, dict) or not isinstance(record.get("matching"), str):
        raise SymfusionError(f"{Path(model_dir) / 'match.json'} is not symfusion-match's report (no `matching`); "
                             "rerun symfusion-match")
    return record["matching"]


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


def load_models(paths: list[str], same_shapes: bool = True, use: str = "merge") -> list[torch.nn.Module]:
    """Models in order (the first is the anchor), after checking they exist, are compatible and finite.

    same_shapes=False allows different task heads (models of different tasks whose bodies are fused); use: what
    the models are loaded for, "match" or "merge" (families.FUNCTION_FIELDS: which config differences may pass).
    For a merge (or a path) of tied and untied decoders, the tied ones are untied (io/untie.py: the same function),
    so the merge is the standard untied model.
    """
    if not paths or len(paths) < 2:
        raise SymfusionError("models=[ANCHOR,SOURCE,...] needs at least two model folders")
    dirs = [Path(p) for p in paths]
    for path in dirs:
        if not path.is_dir():
            raise SymfusionError(f"model folder {path} does not exist")
    configs = [load_config(p) for p in dirs]
    for path, config in zip(dirs[1:], configs[1:]):
        check_compatible(config, configs[0], str(path), str(dirs[0]), use=use)
    models = [load_model(p) for p in dirs]                # each checked finite by load_model
    if use == "merge" and len({is_tied(m) for m in models}) > 1:
        models = [untied(m) for m in models]
    if same_shapes:
        check_same_shapes(models, dirs)
    return models


def model_batches(models: list[str], tasks: list, num_batches: int) -> list:
    """Statistic batches: one list shared by all models (one task), or each model's own task's batches."""
    if len(tasks) == 1:
        return tasks[0].statistic_batches(num_batches, models[0])
    if len(tasks) != len(models):
        raise SymfusionError(f"{len(tasks)} tasks for {len(models)} models: give one task, or one per model")
    return [task.statistic_batches(num_batches, model) for task, model in zip(tasks, models)]


def fusion_batches(models: list[str], tasks: list, fusion: dict, cache: dict) -> list | None:
    """The statistic batches `fusion` asks for (its num_batches), built once per count and shared by methods."""
    if "num_batches" not in fusion:
        return None
    count = int(fusion["num_batches"])
    if count not in cache:
        cache[count] = model_batches(models, tasks, count)
    return cache[count]


def function_change(model: torch.nn.Module, new_state: dict, seed: int = 0, batch_size: int = 2,
                    seq_len: int = 16) -> tuple[float, float]:
    """(max |f_new(x) - f(x)|, relative to max(1, max |f(x)|)) on probe inputs; `model` ends holding new_state."""
    inputs = probe_inputs(model.config, batch_size, seq_len, seed)
    before = model_outputs(model, inputs)
    model.load_state_dict(new_state)
    change = (model_outputs(model, inputs) - before).abs().max().item()
    return change, change / max(1.0, before.abs().max().item())


def check_function_preserved(model: torch.nn.Module, new_state: dict, limit: float, what: str, output,
                             **probe) -> tuple[float, float]:
    """Load new_state into `model` and refuse (one-line error) when its outputs moved by more than `limit`
    (relative): a symmetry must not change the function. Returns (change, relative change)."""
    change, relative = function_change(model, new_state, **probe)
    if not relative <= limit:                  # NaN fails too
        raise SymfusionError(
            f"{what} changes its outputs by {change:.3g} (relative {relative:.3g} > {limit}); "
            f"not writing {output}. Run in float64 or report this as a bug"
        )
    return change, relative
