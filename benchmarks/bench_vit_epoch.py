"""Where an epoch of the ViT trainer goes: the loader, the augmentation, the model step (a GPU's question, CPU too).

    python benchmarks/bench_vit_epoch.py [--model vit_paper] [--images 43200] [--batch 128] [--device cuda]

In-memory images of CIFAR-10's shape (3 x 32 x 32, standardised float32, as the image task holds them), the
project's own ViT (tasks/image.vit_config from conf/model/<model>.yaml), AdamW fused, augment() (random crop, flip)
and the trainer's batches (tasks/image.shuffled_batches: one gather per batch in the trainer's process) beside
DataLoader's image-by-image stacking with and without the worker processes the text trainers use on a GPU
(training.loader_options). Each variant runs one epoch after a warm-up of 40 steps; the table splits its seconds
into waiting for the loader, the augmentation and the model step (synchronised), and ends with the model step alone
on a batch already on the device (the floor). Under bfloat16 autocast (`bf16`, the GPU's default) and in float32.
Measured on one H200: docs/cluster.md. Random data: the losses mean nothing, the seconds are the point.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import transformers
import yaml
from torch.utils.data import DataLoader

from symfusion.pipeline.data.images import ImageDataset
from symfusion.pipeline.tasks.image import augment, shuffled_batches, vit_config
from symfusion.pipeline.training import adamw, autocast, loader_options

ROOT = Path(__file__).resolve().parents[1]


def loader(kind: str, data: ImageDataset, batch: int, generator: torch.Generator, device: torch.device):
    """The batches of one epoch: `gather` the trainer's, `stack` image by image in this process, `workers` image by
    image in loader_options(device)'s worker processes."""
    if kind == "gather":
        return shuffled_batches(data, batch, generator, device)
    options = loader_options(device) if kind == "workers" else {"pin_memory": device.type == "cuda"}
    return DataLoader(data, batch_size=batch, shuffle=True, generator=generator, drop_last=True, **options)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def epoch(kind: str, bf16: bool, augmented: bool, stepping: bool, data, config, args, steps: int | None = None):
    """(seconds, steps, {load, augment, step}) of one pass over `data`."""
    model = transformers.ViTForImageClassification(config).to(args.device)
    optimizer = adamw(model, 1e-3, 0.05)
    generator = torch.Generator().manual_seed(0)
    if args.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = bf16          # as training.use_autocast: TF32 with bfloat16 only
    parts, done = {"load": 0.0, "augment": 0.0, "step": 0.0}, 0
    sync(args.device)
    start = last = time.perf_counter()
    for batch in loader(kind, data, args.batch, generator, args.device):
        now = time.perf_counter()
        parts["load"], last = parts["load"] + now - last, now
        pixels = augment(batch["pixel_values"], generator) if augmented else batch["pixel_values"]
        now = time.perf_counter()
        parts["augment"], last = parts["augment"] + now - last, now
        if stepping:
            with autocast(args.device, bf16):
                loss = model(pixel_values=pixels.to(args.device, non_blocking=True),
                             labels=batch["labels"].to(args.device, non_blocking=True)).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        sync(args.device)
        now = time.perf_counter()
        parts["step"], last = parts["step"] + now - last, now
        done += 1
        if steps is not None and done >= steps:
            break
    return time.perf_counter() - start, done, parts


def step_alone(bf16: bool, config, args, repeat: int = 200) -> float:
    """Milliseconds per training step on one batch already on the device."""
    model = transformers.ViTForImageClassification(config).to(args.device)
    optimizer = adamw(model, 1e-3, 0.05)
    pixels = torch.randn(args.batch, 3, 32, 32, device=args.device)
    labels = torch.randint(0, 10, (args.batch,), device=args.device)
    if args.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = bf16
    for i in range(repeat // 10 + repeat):
        if i == repeat // 10:                                  # the first tenth warms up
            sync(args.device)
            start = time.perf_counter()
        with autocast(args.device, bf16):
            model(pixel_values=pixels, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync(args.device)
    return 1000 * (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_paper", help="a conf/model/<name>.yaml of the vit family")
    parser.add_argument("--images", type=int, default=43_200, help="images in the epoch (CIFAR-10's train split)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeat", type=int, default=200, help="steps timed for the model step alone")
    args = parser.parse_args()
    args.device = torch.device(args.device)
    torch.manual_seed(0)
    data = ImageDataset(torch.randn(args.images, 3, 32, 32), torch.randint(0, 10, (args.images,)))
    config = vit_config(yaml.safe_load((ROOT / "conf" / "model" / f"{args.model}.yaml").read_text()), (3, 32, 32), 10)
    name = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "CPU"
    epoch("gather", True, True, True, data, config, args, steps=40)          # CUDA's start, kernels, the allocator
    print(f"{args.model}, {args.images} images of 3x32x32, batch {args.batch}, on {name} (torch {torch.__version__})\n")
    print("| loader | precision | augmentation | model step | epoch s | ms per step | load s | augmentation s | step s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind, bf16, augmented, stepping in [("workers", True, True, True), ("workers", False, True, True),
                                            ("stack", True, True, True), ("gather", True, True, True),
                                            ("gather", False, True, True), ("gather", True, False, True),
                                            ("gather", True, True, False), ("workers", True, True, False)]:
        seconds, steps, parts = epoch(kind, bf16, augmented, stepping, data, config, args)
        print(f"| {kind} | {'bf16' if bf16 else 'fp32'} | {'yes' if augmented else 'no'} | "
              f"{'yes' if stepping else 'no'} | {seconds:.2f} | {1000 * seconds / steps:.1f} | {parts['load']:.2f} | "
              f"{parts['augment']:.2f} | {parts['step']:.2f} |", flush=True)
    for bf16 in (True, False):
        ms = step_alone(bf16, config, args, args.repeat)
        print(f"| the model step alone | {'bf16' if bf16 else 'fp32'} | no | yes | "
              f"{ms * (args.images // args.batch) / 1000:.2f} | {ms:.1f} | | | |", flush=True)


if __name__ == "__main__":
    main()
