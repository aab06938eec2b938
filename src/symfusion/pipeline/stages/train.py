"""The train stage: one end model per (task, model, seed), trained by the task's own trainer, written atomically."""
from __future__ import annotations

import torch

from symfusion.errors import SymfusionError


def run_train(task, model_cfg: dict, seed: int, output: str, threads: int | None = None,
              resolved_config: dict | None = None, precision: str = "auto") -> dict:
    """A ViT from scratch (image tasks) or a fine-tuned encoder (text tasks) in `output`; returns train.json."""
    if not output:
        raise SymfusionError("output=DIR is required")
    if threads:
        torch.set_num_threads(int(threads))
    return task.train(output, model_cfg, int(seed), resolved_config, precision=precision)
