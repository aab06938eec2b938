"""What a task config means to the stages: its data splits, statistic batches and metrics."""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache

import torch
from torch.utils.data import DataLoader

from symfusion.errors import SymfusionError

TASK_KINDS = ("image",)


def _plain(value):
    """A Hydra/OmegaConf node as plain Python (dicts, lists), or the value itself."""
    from omegaconf import OmegaConf
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


@lru_cache(maxsize=4)
def _image_splits(source: str, seed: int, limit_json: str, options_json: str):
    from symfusion.data import load_image_splits
    return load_image_splits(source, seed=seed, limit=json.loads(limit_json), **json.loads(options_json))


def task_splits(task) -> dict:
    """train / validation / test datasets of a task config (cached per process)."""
    if task.kind not in TASK_KINDS:
        raise SymfusionError(f"task {task.name}: kind {task.kind!r} is not one of {TASK_KINDS}")
    limit = json.dumps(_plain(task.get("limit")) or {}, sort_keys=True)
    options = json.dumps(_plain(task.get("options")) or {}, sort_keys=True)
    return _image_splits(task.source, int(task.split_seed), limit, options)


def statistic_batches(task, num_batches: int) -> list[dict]:
    """The first `num_batches` validation batches (fixed order): data for Fisher, Gram and OT statistics."""
    loader = DataLoader(task_splits(task)["validation"], batch_size=int(task.fusion_batch_size), shuffle=False)
    batches = []
    for batch in loader:
        if len(batches) == num_batches:
            break
        batches.append(batch)
    return batches


def evaluate_split(model: torch.nn.Module, task, split: str = "test") -> dict:
    """Metrics of a model on one split of the task (accuracy, loss, n)."""
    from symfusion.evaluate import evaluate_image_classifier
    splits = task_splits(task)
    if split not in splits:
        raise SymfusionError(f"split={split!r}; choose one of {', '.join(splits)}")
    return evaluate_image_classifier(model, splits[split], batch_size=int(task.eval_batch_size))


def data_manifest(task) -> dict:
    """Sizes, label counts and a content hash of each split: the data stage's record."""
    manifest = {"task": task.name, "source": task.source, "split_seed": int(task.split_seed), "splits": {}}
    for name, split in task_splits(task).items():
        digest = hashlib.sha256(split.pixels.numpy().tobytes())
        digest.update(split.labels.numpy().tobytes())
        counts = torch.bincount(split.labels).tolist()
        manifest["splits"][name] = {"size": len(split), "image_shape": list(split.image_shape),
                                    "label_counts": counts, "sha256": digest.hexdigest()}
    return manifest
