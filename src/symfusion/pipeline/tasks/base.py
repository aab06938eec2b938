"""What every task object offers the stages: splits, statistic batches, evaluation, a manifest and a trainer."""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import torch
from omegaconf import OmegaConf

from symfusion.families import family_spec
from symfusion.errors import SymfusionError


STATISTICS_SPLITS = ("validation", "train")


def statistics_split(split: str) -> str:
    """A split statistics and matchings may read: validation or train, never the test split that scores them."""
    if split not in STATISTICS_SPLITS:
        raise SymfusionError(f"data split {split!r}: statistics and matchings read {' or '.join(STATISTICS_SPLITS)} "
                             "(the test split scores the results)")
    return split


def plain(value):
    """A Hydra/OmegaConf node as plain Python (dicts, lists), or the value itself."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


class Task(ABC):
    """A task config (conf/task/<name>.yaml, sized by the profile) with the behaviour of its kind.

    Subclasses list the `kinds` they handle and implement splits, statistic_batches, evaluate,
    manifest and train; the stages never ask which kind a task is.
    """

    kinds: tuple[str, ...] = ()
    metric: str = "accuracy"
    inputs: str = "tokens"          # what its models read (arch.FamilySpec.inputs): "tokens" or "pixels"
    profile_section: str = ""       # the profile section whose task_patch sizes it (tasks.sized_task)

    def __init__(self, cfg):
        self.cfg = cfg

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def kind(self) -> str:
        return self.cfg.kind

    @property
    def metric_name(self) -> str:
        return self.cfg.get("metric", self.metric)

    def check_model(self, model: torch.nn.Module, where: str = "the model", model_dir=None) -> None:
        """Refuse (one line) a model this task cannot feed or score: other inputs, or another label count (the
        subclasses add what their inputs need; model_dir: the folder whose tokenizer feeds it, if any)."""
        reads = family_spec(model.config).inputs
        if reads != self.inputs:
            raise SymfusionError(f"{where} reads {reads}, but task {self.name} ({self.kind}) gives {self.inputs}; "
                                 "pair image tasks with ViTs and text tasks with text encoders")
        expected, has = self.num_labels(), getattr(model.config, "num_labels", None)
        if expected is None or has is None:
            return
        # image labels are 0..classes-1 of the data: a head may have more outputs; text heads match exactly
        if (expected > has) if self.inputs == "pixels" else (expected != has):
            raise SymfusionError(f"{where} has {has} outputs, but task {self.name} has {expected} labels; "
                                 "evaluate it on a task of its own label space (or give its head with heads=)")

    def num_labels(self) -> int | None:
        """How many outputs a model of this task has (None: not known before the data are read)."""
        return None

    def manifest_header(self) -> dict:
        return {"task": self.name, "kind": self.kind, "source": self.cfg.source, "split_seed": int(self.cfg.split_seed),
                "splits": {}}

    @abstractmethod
    def statistic_batches(self, num_batches: int, model_dir: str | Path | None = None,
                          split: str = "validation") -> list[dict]:
        """See the subclasses (split: validation, or train; never test)."""

    @abstractmethod
    def evaluate(self, model: torch.nn.Module, split: str = "test", model_dir=None, examples: int | None = None) -> dict:
        """See the subclasses."""

    @abstractmethod
    def manifest(self) -> dict:
        """See the subclasses."""

    @abstractmethod
    def train(self, output: str, model_cfg: dict, seed: int, resolved_config: dict | None = None,
              precision: str = "auto", data_seed: int | None = None) -> dict:
        """See the subclasses."""

    def copy_head(self, model: torch.nn.Module, head_dir: str | Path) -> list[str]:
        """Replace `model`'s task head by the one of a fine-tuned model folder (text tasks only)."""
        raise SymfusionError(f"task {self.name} ({self.kind}) has no swappable task head; "
                             "heads=/head_from= is for text tasks")
