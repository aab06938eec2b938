"""The train stage: one end model per (task, model, seed), trained by the task's own trainer, written atomically."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from symfusion.errors import SymfusionError
from symfusion.pipeline.command import PATH, PRECISION, Command, command, integer, option
from symfusion.pipeline.stages.common import plain, resolved, task_of
from symfusion.pipeline.tasks import profile_model


def run_train(task, model_cfg: dict, seed: int, output: str, threads: int | None = None,
              resolved_config: dict | None = None, precision: str = "auto", data_seed: int | None = None) -> dict:
    """A ViT from scratch (image tasks), a fine-tuned encoder (text tasks) or a decoder (causal_lm tasks) in
    `output`; returns train.json. data_seed: the data order's seed when it is not `seed` (the initialisation's)."""
    if not output:
        raise SymfusionError("output=DIR is required")
    if threads:
        torch.set_num_threads(int(threads))
    return task.train(output, model_cfg, int(seed), resolved_config, precision=precision,
                      data_seed=None if data_seed is None else int(data_seed))


@command("train")
@dataclass(frozen=True)
class Train(Command):
    """symfusion-train task=NAME model=NAME seed=S output=DIR [data_seed=D] [threads=N]: a ViT, a text fine-tune or a decoder"""
    groups = {"task": "fashion_mnist", "model": "vit_mini", "profile": "mini"}
    output: str = option(PATH, "DIR: the trained model folder")
    seed: int = option(integer(0), "the training seed (initialisation and data order)", 0)
    data_seed: int | None = option(integer(0, optional=True), "the data order's own seed (shuffling, augmentation); "
                                   "null: seed's. Two runs of one seed and two data_seeds start from one "
                                   "initialisation", None)
    threads: int | None = option(integer(1, optional=True), "torch CPU threads; null: torch's default")
    precision: str = option(PRECISION, "auto: training under bfloat16 autocast and TF32 on a GPU, validation in "
                                       "float32 | bf16 | fp32", "auto")

    def run(self, cfg) -> None:
        model = plain(profile_model(cfg.model, cfg.get("profile")))
        report = run_train(task_of(cfg), model, self.seed, self.output, self.threads, resolved(cfg), self.precision,
                           self.data_seed)
        order = "" if self.data_seed is None else f", data order {self.data_seed}"
        print(f"trained {cfg.model.name} on {cfg.task.name} (seed {self.seed}{order}): validation score "
              f"{report['validation_score']:.4f} (epoch {report['best_epoch']}), {report['seconds']:.0f}s -> "
              f"{self.output}")
