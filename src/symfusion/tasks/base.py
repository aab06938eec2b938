"""What every task object offers the stages: splits, statistic batches, evaluation, a manifest and a trainer."""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import torch
from omegaconf import OmegaConf

from symfusion.errors import SymfusionError


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

    def manifest_header(self) -> dict:
        return {"task": self.name, "kind": self.kind, "source": self.cfg.source, "split_seed": int(self.cfg.split_seed),
                "splits": {}}

    @abstractmethod
    def statistic_batches(self, num_batches: int, model_dir: str | Path | None = None) -> list[dict]:
        """See the subclasses."""

    @abstractmethod
    def evaluate(self, model: torch.nn.Module, split: str = "test", model_dir=None, examples: int | None = None) -> dict:
        """See the subclasses."""

    @abstractmethod
    def manifest(self) -> dict:
        """See the subclasses."""

    @abstractmethod
    def train(self, output: str, model_cfg: dict, seed: int, resolved_config: dict | None = None) -> dict:
        """See the subclasses."""

    def copy_head(self, model: torch.nn.Module, head_dir: str | Path) -> list[str]:
        """Replace `model`'s task head by the one of a fine-tuned model folder (text tasks only)."""
        raise SymfusionError(f"task {self.name} ({self.kind}) has no swappable task head; "
                             "heads=/head_from= is for text tasks")
