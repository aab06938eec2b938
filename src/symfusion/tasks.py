"""What a task config means to the stages: its data splits, statistic batches and evaluation."""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader

from symfusion.errors import SymfusionError

IMAGE_KINDS = ("image",)
TEXT_KINDS = ("text_classification", "token_classification", "regression")


def conf_dir() -> Path:
    from symfusion.cli import CONF_DIR
    return Path(CONF_DIR)


def load_task(name: str) -> DictConfig:
    """conf/task/<name>.yaml with its `defaults` bases merged in (for stages that use several tasks)."""
    path = conf_dir() / "task" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise SymfusionError(f"unknown task {name!r}; tasks are {', '.join(known)}")
    config = OmegaConf.load(path)
    bases = [d for d in config.pop("defaults", []) if d != "_self_"]
    return OmegaConf.merge(*(load_task(base) for base in bases), config) if bases else config


def sized_task(task, profile=None) -> DictConfig:
    """A text task with the profile's size patches merged in (profile.language.task_patch, .source_patch).

    The smoke profile shrinks every text task this way; image tasks are returned unchanged.
    """
    language = (profile or {}).get("language") or {}
    if task.kind not in TEXT_KINDS or not language:
        return task
    patches = [language.get("task_patch") or {}, (language.get("source_patch") or {}).get(task.source) or {}]
    return OmegaConf.merge(task, *patches)


def _plain(value):
    """A Hydra/OmegaConf node as plain Python (dicts, lists), or the value itself."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _check_kind(task) -> None:
    if task.kind not in IMAGE_KINDS + TEXT_KINDS:
        raise SymfusionError(f"task {task.name}: kind {task.kind!r} is not one of {IMAGE_KINDS + TEXT_KINDS}")


def is_text(task) -> bool:
    _check_kind(task)
    return task.kind in TEXT_KINDS


@lru_cache(maxsize=8)
def _splits(kind: str, source: str, seed: int, limit_json: str, options_json: str):
    if kind in IMAGE_KINDS:
        from symfusion.data import load_image_splits
        return load_image_splits(source, seed=seed, limit=json.loads(limit_json), **json.loads(options_json))
    from symfusion.data.text import load_text_splits
    return load_text_splits(source, seed=seed, limit=json.loads(limit_json), **json.loads(options_json))


def task_splits(task):
    """Image tasks: {"train", "validation", "test"} datasets; text tasks: a TextSplits (cached per process)."""
    _check_kind(task)
    limit = json.dumps(_plain(task.get("limit")) or {}, sort_keys=True)
    options = dict(_plain(task.get("options")) or {})
    if task.kind in TEXT_KINDS and task.get("cache_dir"):
        options["cache_dir"] = str(task.cache_dir)
    splits = _splits(task.kind, task.source, int(task.split_seed), limit, json.dumps(options, sort_keys=True))
    if task.kind in TEXT_KINDS and splits.kind != task.kind:
        raise SymfusionError(f"task {task.name} says kind {task.kind} but source {task.source} gives {splits.kind}")
    return splits


def statistic_batches(task, num_batches: int, model_dir: str | Path | None = None) -> list[dict]:
    """The first `num_batches` validation batches (fixed order): data for Fisher, Gram and OT statistics.

    Text tasks are tokenized with the tokenizer saved in `model_dir`.
    """
    if not is_text(task):
        loader = DataLoader(task_splits(task)["validation"], batch_size=int(task.fusion_batch_size), shuffle=False)
        return [batch for _, batch in zip(range(num_batches), loader)]
    from symfusion.evaluate_text import statistic_batches_text
    from symfusion.train_text import load_tokenizer

    splits = task_splits(task)
    return statistic_batches_text(splits.splits["validation"], load_tokenizer(model_dir), task.kind,
                                  int(task.max_length), int(task.fusion_batch_size), num_batches)


def evaluate_split(model: torch.nn.Module, task, split: str = "test", model_dir: str | Path | None = None) -> dict:
    """Metrics of a model on one split of the task: accuracy/loss (images) or the task metric/loss (text)."""
    splits = task_splits(task)
    if not is_text(task):
        from symfusion.evaluate import evaluate_image_classifier
        if split not in splits:
            raise SymfusionError(f"split={split!r}; choose one of {', '.join(splits)}")
        return evaluate_image_classifier(model, splits[split], batch_size=int(task.eval_batch_size))
    from symfusion.evaluate_text import evaluate_text_model
    from symfusion.train_text import load_tokenizer

    if split not in splits.splits:
        raise SymfusionError(f"split={split!r}; choose one of {', '.join(splits.splits)}")
    return evaluate_text_model(model, load_tokenizer(model_dir), splits.splits[split], task.kind,
                               int(task.max_length), task.metric, int(task.eval_batch_size),
                               label_names=splits.label_names)


def evaluate_subset(model: torch.nn.Module, task, examples: int | None, split: str = "test",
                    model_dir: str | Path | None = None) -> dict:
    """Text: the task metric/loss on the first `examples` examples of a split (all when None)."""
    from symfusion.evaluate_text import evaluate_text_model
    from symfusion.train_text import load_tokenizer

    if not is_text(task):
        raise SymfusionError(f"task {task.name} is not a text task; the layer sweep is for text models")
    splits = task_splits(task)
    chosen = splits.splits[split][: examples or None]
    return evaluate_text_model(model, load_tokenizer(model_dir), chosen, task.kind, int(task.max_length),
                               task.metric, int(task.eval_batch_size), label_names=splits.label_names)


def data_manifest(task) -> dict:
    """Sizes, label counts and a content hash of each split: the data stage's record."""
    manifest = {"task": task.name, "kind": task.kind, "source": task.source, "split_seed": int(task.split_seed),
                "splits": {}}
    if is_text(task):
        splits = task_splits(task)
        manifest["label_names"] = splits.label_names
        for name, examples in splits.splits.items():
            digest = hashlib.sha256(json.dumps(examples, sort_keys=True).encode())
            manifest["splits"][name] = {"size": len(examples), "sha256": digest.hexdigest()}
        return manifest
    for name, split in task_splits(task).items():
        digest = hashlib.sha256(split.pixels.numpy().tobytes())
        digest.update(split.labels.numpy().tobytes())
        manifest["splits"][name] = {"size": len(split), "image_shape": list(split.image_shape),
                                    "label_counts": torch.bincount(split.labels).tolist(), "sha256": digest.hexdigest()}
    return manifest
