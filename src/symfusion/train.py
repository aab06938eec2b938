"""The train stage: a ViT image classifier from scratch, seeded, resumable, best checkpoint on validation."""
from __future__ import annotations

import json
import math
import shutil
import time
import warnings
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file
from torch.utils.data import DataLoader
from tqdm import tqdm

from symfusion.errors import SymfusionError
from symfusion.evaluate import evaluate_image_classifier
from symfusion.modelio import atomic_directory, compute_device, write_json_atomic
from symfusion.provenance import provenance

VIT_FIELDS = ("patch_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


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


def warmup_cosine(step: int, total: int, warmup_ratio: float) -> float:
    """Learning-rate factor: linear warmup over warmup_ratio*total steps, then cosine decay to 0."""
    warmup = max(1, int(round(warmup_ratio * total)))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


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


# ---------------------------------------------------------------- resumable checkpoints (safetensors only)

def _checkpoint_dir(output: Path) -> Path:
    return output.parent / f".{output.name}.checkpoint"


def save_checkpoint(path: Path, model, optimizer, epoch: int, best: dict, history: list, fingerprint: str,
                    generator: torch.Generator) -> None:
    """Model, AdamW moments, RNG states and progress after `epoch`, written atomically."""
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        for param in group["params"]:
            for key, value in optimizer.state.get(param, {}).items():
                tensors[f"optim.{names[id(param)]}.{key}"] = torch.as_tensor(value).detach().cpu().clone()
    tensors.update({f"best.{k}": v.cpu().contiguous() for k, v in best.get("state", {}).items()})
    tensors["rng.torch"] = torch.get_rng_state()
    tensors["rng.generator"] = generator.get_state()
    meta = {"epoch": epoch, "history": history, "fingerprint": fingerprint,
            "best_accuracy": best.get("accuracy"), "best_epoch": best.get("epoch"),
            "best": {k: v for k, v in best.items() if k != "state"}}   # any selection score (text: "score")
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "state.safetensors"))
    (tmp / "progress.json").write_text(json.dumps(meta))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


def load_checkpoint(path: Path, model, optimizer, fingerprint: str, generator: torch.Generator):
    """(epoch, best, history) from a checkpoint of the same run, or None to start afresh."""
    if not (path / "progress.json").is_file():
        return None
    meta = json.loads((path / "progress.json").read_text())
    if meta.get("fingerprint") != fingerprint:
        return None        # a checkpoint of another configuration: ignore it
    tensors = load_file(str(path / "state.safetensors"))
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    params = dict(model.named_parameters())
    for key, value in tensors.items():
        if key.startswith("optim."):
            name, slot = key[6:].rsplit(".", 1)
            param = params[name]
            optimizer.state[param][slot] = value if slot == "step" else value.to(param.device)
    torch.set_rng_state(tensors["rng.torch"])
    generator.set_state(tensors["rng.generator"])
    best_state = {k[5:]: v for k, v in tensors.items() if k.startswith("best.")}
    best = {"state": best_state, "accuracy": meta["best_accuracy"], "epoch": meta["best_epoch"], **meta.get("best", {})}
    return meta["epoch"], best, meta["history"]


# ---------------------------------------------------------------- training

def train_epoch(loader, optimizer, scheduler, description: str, batch_loss) -> float:
    """One pass over `loader` (the caller sets train mode): step on batch_loss(batch); the mean training loss."""
    running = 0.0
    bar = tqdm(loader, desc=description, mininterval=5.0, leave=False)
    for batch in bar:
        loss = batch_loss(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        running += loss.item()
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    return running / len(loader)


def train_image_classifier(output_dir: str, splits: dict, model_cfg: dict, seed: int, epochs: int,
                           batch_size: int, lr: float, weight_decay: float, warmup_ratio: float,
                           eval_batch_size: int = 512, augmentation: bool = False,
                           resolved_config: dict | None = None) -> dict:
    """Train a ViT on splits["train"], keep the best epoch on splits["validation"], save atomically."""
    output = Path(output_dir)
    train_set, validation_set = splits["train"], splits["validation"]
    torch.manual_seed(seed)
    config = vit_config(model_cfg, train_set.image_shape, train_set.num_classes)
    device = compute_device()
    model = transformers.ViTForImageClassification(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(train_set, batch_size=batch_size, shuffle=True, generator=generator, drop_last=True)
    total_steps = epochs * len(loader)
    if total_steps == 0:
        raise SymfusionError(f"train split has {len(train_set)} images, fewer than batch_size={batch_size}")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_cosine(s, total_steps, warmup_ratio))
    fingerprint = json.dumps([model_cfg, seed, epochs, batch_size, lr, weight_decay, warmup_ratio,
                              augmentation, len(train_set)], sort_keys=True)
    checkpoint = _checkpoint_dir(output)
    start_epoch, best, history = 0, {"accuracy": -1.0}, []
    resumed = load_checkpoint(checkpoint, model, optimizer, fingerprint, generator)
    if resumed:
        start_epoch, best, history = resumed
        with warnings.catch_warnings():                  # replaying the schedule, no optimizer step needed
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(start_epoch * len(loader)):
                scheduler.step()
        print(f"resumed from {checkpoint} after epoch {start_epoch}", flush=True)
    start = time.perf_counter()
    def batch_loss(batch):
        pixels = augment(batch["pixel_values"], generator) if augmentation else batch["pixel_values"]
        return model(pixel_values=pixels.to(device), labels=batch["labels"].to(device)).loss

    for epoch in range(start_epoch, epochs):
        model.train()
        train_loss = train_epoch(loader, optimizer, scheduler, f"epoch {epoch + 1}/{epochs}", batch_loss)
        metrics = evaluate_image_classifier(model, validation_set, eval_batch_size)
        history.append({"epoch": epoch + 1, "train_loss": train_loss,
                        "validation_accuracy": metrics["accuracy"], "validation_loss": metrics["loss"]})
        print(f"epoch {epoch + 1}/{epochs}: train loss {train_loss:.4f}, "
              f"validation accuracy {metrics['accuracy']:.4f}", flush=True)
        if metrics["accuracy"] > best["accuracy"]:
            best = {"accuracy": metrics["accuracy"], "epoch": epoch + 1,
                    "state": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}}
        save_checkpoint(checkpoint, model, optimizer, epoch + 1, best, history, fingerprint, generator)
    model.load_state_dict(best["state"])
    model.to("cpu").eval()
    report = {"seed": seed, "epochs": epochs, "best_epoch": best["epoch"],
              "validation_accuracy": best["accuracy"], "history": history,
              "seconds": time.perf_counter() - start, "resumed_after_epoch": resumed[0] if resumed else None,
              "num_parameters": sum(p.numel() for p in model.parameters()),
              "provenance": provenance(resolved_config, seed)}
    with atomic_directory(output) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        write_json_atomic(report, tmp / "train.json")
    shutil.rmtree(checkpoint, ignore_errors=True)
    return report
