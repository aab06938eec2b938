"""The image task: its splits, statistic batches, evaluation and manifest, and the ViT trainer (from scratch)."""
from __future__ import annotations

import hashlib
import json
import math
from functools import lru_cache
from pathlib import Path

import torch
import transformers
from omegaconf import OmegaConf
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

from symfusion.pipeline.data import load_image_splits
from symfusion.errors import SymfusionError
from symfusion.io.modelio import compute_device, write_json
from symfusion.io.outputs import safe_output
from symfusion.io.provenance import provenance
from symfusion.pipeline.tasks.base import Task, plain, statistics_split
from symfusion.pipeline.training import (TRAIN_MARKER, adamw, autocast, cosine_schedule, evaluation_precision, fit,
                                         remove_checkpoint, tensors_digest, training_run, use_autocast)

VIT_FIELDS = ("patch_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


@lru_cache(maxsize=8)
def _splits(source: str, seed: int, limit_json: str, options_json: str) -> dict:
    return load_image_splits(source, seed=seed, limit=json.loads(limit_json), **json.loads(options_json))


@torch.inference_mode()
def evaluate_image_classifier(model: torch.nn.Module, dataset, batch_size: int = 512) -> dict:
    """{"accuracy", "loss" (mean cross-entropy), "n", "per_example": {"correct", "loss"}} of `model` on
    `dataset` (per_example: the bootstrap's record, uncertainty.py); the model is left in eval mode.
    The mean loss is the correctly rounded sum of the per-example losses (math.fsum) over n: it does not
    depend on how the examples were batched."""
    model.eval()
    device = next(model.parameters()).device
    hits, losses = [], []
    for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False):
        labels = batch["labels"].to(device)
        logits = model(pixel_values=batch["pixel_values"].to(device)).logits
        hits += (logits.argmax(dim=-1) == labels).int().tolist()
        losses += torch.nn.functional.cross_entropy(logits.double(), labels, reduction="none").tolist()
    if not hits:
        raise SymfusionError("the evaluation split is empty; check the task's limit settings")
    return {"accuracy": sum(hits) / len(hits), "loss": math.fsum(losses) / len(losses), "n": len(hits),
            "per_example": {"correct": hits, "loss": losses}}


class ImageTask(Task):
    """Image classification (kind `image`): in-memory ImageDatasets, accuracy and cross-entropy."""

    kinds = ("image",)
    metric = "accuracy"
    inputs = "pixels"
    profile_section = "vision"

    def splits(self) -> dict:
        """{"train", "validation", "test"} ImageDatasets (cached per process)."""
        limit = json.dumps(plain(self.cfg.get("limit")) or {}, sort_keys=True)
        options = json.dumps(dict(plain(self.cfg.get("options")) or {}), sort_keys=True)
        return _splits(self.cfg.source, int(self.cfg.split_seed), limit, options)

    def split(self, name: str):
        splits = self.splits()
        if name not in splits:
            raise SymfusionError(f"split={name!r}; choose one of {', '.join(splits)}")
        return splits[name]

    def statistic_batches(self, num_batches: int, model_dir: str | Path | None = None,
                          split: str = "validation") -> list[dict]:
        """The first `num_batches` validation batches (fixed order): data for Fisher, Gram and OT statistics; of the
        train split (the learned refinement's data), batches in a seeded order."""
        data, size = self.split(statistics_split(split)), int(self.cfg.fusion_batch_size)
        if split == "validation":
            loader = DataLoader(data, batch_size=size, shuffle=False)
            return [batch for _, batch in zip(range(num_batches), loader)]
        order = torch.randperm(len(data), generator=torch.Generator().manual_seed(int(self.cfg.split_seed)))
        return [{"pixel_values": data.pixels[part], "labels": data.labels[part]}
                for part in order[: size * num_batches].split(size)]

    def evaluate(self, model: torch.nn.Module, split: str = "test", model_dir=None, examples: int | None = None) -> dict:
        """Accuracy, loss and n on a split; `examples` = a seeded subset of that many images (the limit mechanism)."""
        self.check_model(model)
        task = self.limited(split, examples) if examples else self
        return evaluate_image_classifier(model, task.split(split), batch_size=int(self.cfg.eval_batch_size))

    def num_labels(self) -> int:
        return self.split("train").num_classes

    def check_model(self, model: torch.nn.Module, where: str = "the model", model_dir=None) -> None:
        """Also refuse (one line) a ViT whose config expects other images: channels, height or width."""
        super().check_model(model, where, model_dir)
        channels, height, width = self.split("train").image_shape
        config = model.config
        size = getattr(config, "image_size", None)
        size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
        expected = (getattr(config, "num_channels", channels), *size)
        if expected != (channels, height, width):
            raise SymfusionError(f"{where} takes {expected[0]}-channel {expected[1]}x{expected[2]} images (its "
                                 f"config.json), but task {self.name} has {channels}-channel {height}x{width} images; "
                                 "use a model trained on this task's images")

    def limited(self, split: str, examples: int) -> "ImageTask":
        """This task with a seeded subset of `examples` images of `split` (as the task's `limit` option)."""
        config = OmegaConf.to_container(self.cfg, resolve=True)       # Hydra's configs are struct: no new keys
        config["limit"] = {**(config.get("limit") or {}), split: int(examples)}
        return ImageTask(OmegaConf.create(config))

    def manifest(self) -> dict:
        """Sizes, label counts and a content hash of each split."""
        manifest = self.manifest_header()
        for name, split in self.splits().items():
            digest = hashlib.sha256(split.pixels.numpy().tobytes())
            digest.update(split.labels.numpy().tobytes())
            manifest["splits"][name] = {"size": len(split), "image_shape": list(split.image_shape),
                                        "label_counts": torch.bincount(split.labels).tolist(),
                                        "sha256": digest.hexdigest()}
        return manifest

    def train(self, output: str, model_cfg: dict, seed: int, resolved_config: dict | None = None,
              precision: str = "auto", data_seed: int | None = None) -> dict:
        """A ViT trained from scratch on this task (model_cfg: a conf/model/vit_*.yaml)."""
        if model_cfg.get("base_model"):
            raise SymfusionError(f"model={model_cfg.get('name')} is a text encoder; image tasks need a ViT config (vit_*)")
        train = self.cfg.train
        return train_image_classifier(
            output, self.splits(), model_cfg, seed=seed, epochs=int(train.epochs), batch_size=int(train.batch_size),
            lr=float(train.lr), weight_decay=float(train.weight_decay), warmup_ratio=float(train.warmup_ratio),
            eval_batch_size=int(self.cfg.eval_batch_size), augmentation=bool(train.get("augment", False)),
            resolved_config=resolved_config, precision=precision, data_seed=data_seed)


# ---------------------------------------------------------------- the ViT trainer

def vit_config(model_cfg: dict, image_shape: tuple[int, int, int], num_labels: int) -> transformers.ViTConfig:
    """A ViT config for images of `image_shape` (C, H, W); dropout off (the paper trains without it)."""
    missing = [f for f in VIT_FIELDS if f not in model_cfg]
    if missing:
        raise SymfusionError(f"model config lacks {missing}; see conf/model/vit_*.yaml")
    channels, height, width = image_shape
    if height != width or height % int(model_cfg["patch_size"]):
        raise SymfusionError(f"images are {height}x{width}: need square images divisible by patch_size")
    return transformers.ViTConfig(
        image_size=height, num_channels=channels, num_labels=num_labels,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        **{f: int(model_cfg[f]) for f in VIT_FIELDS},
    )


def augment(pixels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random crop (pad 4, reflect) and horizontal flip, per image, seeded. pixels (B, C, H, W)."""
    batch, _, height, width = pixels.shape
    padded = torch.nn.functional.pad(pixels, (4, 4, 4, 4), mode="reflect")
    dy = torch.randint(0, 9, (batch,), generator=generator)
    dx = torch.randint(0, 9, (batch,), generator=generator)
    flip = torch.rand(batch, generator=generator) < 0.5
    out = torch.stack([padded[i, :, dy[i]:dy[i] + height, dx[i]:dx[i] + width] for i in range(batch)])
    out[flip] = out[flip].flip(-1)
    return out


class _Gathered(Dataset):
    """An in-memory image split read a batch at a time: one gather per list of indices."""

    def __init__(self, data):
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, indices: list[int]) -> dict:
        index = torch.as_tensor(indices, dtype=torch.long)
        return {"pixel_values": self.data.pixels[index], "labels": self.data.labels[index]}


def shuffled_batches(data, batch_size: int, generator: torch.Generator, device: torch.device) -> DataLoader:
    """The training batches of an in-memory image split: the batches DataLoader(data, batch_size, shuffle=True,
    generator=generator, drop_last=True) gives, drawn from `generator` in the same order (the iterator's base seed,
    then each epoch's permutation), each taken by one gather in this process rather than stacked image by image.
    No worker processes, on a GPU too: the images are in memory already, and there workers cost more than they save
    (measured on an H200: docs/cluster.md)."""
    batches = BatchSampler(RandomSampler(data, generator=generator), batch_size, drop_last=True)
    return DataLoader(_Gathered(data), sampler=batches, batch_size=None, generator=generator,
                      pin_memory=device.type == "cuda")


def train_image_classifier(output_dir: str, splits: dict, model_cfg: dict, seed: int, epochs: int,
                           batch_size: int, lr: float, weight_decay: float, warmup_ratio: float,
                           eval_batch_size: int = 512, augmentation: bool = False,
                           resolved_config: dict | None = None, precision: str = "auto",
                           data_seed: int | None = None) -> dict:
    """Train a ViT on splits["train"], keep the best epoch on splits["validation"], save atomically.
    precision: training.use_autocast (auto: bfloat16 autocast and TF32 on a GPU, float32 on the CPU); data_seed:
    the seed of the data order and augmentation (None: `seed`, which always seeds the initialisation)."""
    with safe_output(output_dir, "symfusion-train", TRAIN_MARKER, is_dir=True) as claim, training_run(output_dir):
        return _train_vit(claim, Path(output_dir), splits, model_cfg, seed, epochs, batch_size, lr, weight_decay,
                          warmup_ratio, eval_batch_size, augmentation, resolved_config, precision, data_seed)


def _train_vit(claim, output: Path, splits: dict, model_cfg: dict, seed: int, epochs: int, batch_size: int, lr: float,
               weight_decay: float, warmup_ratio: float, eval_batch_size: int, augmentation: bool,
               resolved_config: dict | None, precision: str, data_seed: int | None) -> dict:
    train_set, validation_set = splits["train"], splits["validation"]
    torch.manual_seed(seed)
    config = vit_config(model_cfg, train_set.image_shape, train_set.num_classes)
    device = compute_device()
    amp = use_autocast(precision, device)
    model = transformers.ViTForImageClassification(config).to(device)
    optimizer = adamw(model, lr, weight_decay)
    generator = torch.Generator().manual_seed(seed if data_seed is None else data_seed)     # the data order
    loader = shuffled_batches(train_set, batch_size, generator, device)
    total_steps = epochs * len(loader)
    if total_steps == 0:
        raise SymfusionError(f"train split has {len(train_set)} images, fewer than batch_size={batch_size}")
    scheduler = cosine_schedule(optimizer, total_steps, warmup_ratio)
    fingerprint = json.dumps([model_cfg, seed, epochs, batch_size, lr, weight_decay, warmup_ratio,
                              augmentation, len(train_set),
                              tensors_digest(train_set.pixels, train_set.labels, validation_set.pixels,
                                             validation_set.labels)] + (["bf16"] if amp else [])
                             + ([] if data_seed is None else [{"data_seed": data_seed}]), sort_keys=True)

    def batch_loss(batch):
        pixels = augment(batch["pixel_values"], generator) if augmentation else batch["pixel_values"]
        with autocast(device, amp):
            return model(pixel_values=pixels.to(device, non_blocking=True),
                         labels=batch["labels"].to(device, non_blocking=True)).loss

    def validate(model):
        with evaluation_precision(precision, device):
            metrics = evaluate_image_classifier(model, validation_set, eval_batch_size)
        return metrics["accuracy"], {"validation_accuracy": metrics["accuracy"], "validation_loss": metrics["loss"]}

    fitted = fit(output, model, optimizer, scheduler, loader, batch_loss, validate, epochs, fingerprint, generator,
                 "accuracy")
    report = {"seed": seed, "data_seed": seed if data_seed is None else data_seed,
              "epochs": epochs, "best_epoch": fitted.best_epoch, "bf16_autocast": amp,
              "validation_accuracy": fitted.best_score, "validation_score": fitted.best_score,
              "history": fitted.history, "seconds": fitted.seconds,
              "resumed_after_epoch": fitted.resumed_after_epoch,
              "num_parameters": sum(p.numel() for p in model.parameters()),
              "provenance": provenance(resolved_config, seed)}
    with claim.writing() as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        write_json(report, tmp / "train.json")
    remove_checkpoint(output)
    return report
