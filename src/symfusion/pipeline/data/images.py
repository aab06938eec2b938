"""Image classification datasets in memory: fixed seeded splits, per-channel standardisation."""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from symfusion.errors import SymfusionError

VALIDATION_FRACTION = 0.1   # validation = 10% of the official train split, as in the reference
TEST_FRACTION = 0.2         # only for sources without an official test split (digits)


class ImageDataset(Dataset):
    """Items {"pixel_values": (C, H, W) float32, "labels": long}; the whole split lives in memory."""

    def __init__(self, pixels: torch.Tensor, labels: torch.Tensor):
        if pixels.shape[0] != labels.shape[0]:
            raise SymfusionError(f"{pixels.shape[0]} images but {labels.shape[0]} labels")
        self.pixels, self.labels = pixels, labels

    def __len__(self) -> int:
        return self.labels.shape[0]

    def __getitem__(self, index: int) -> dict:
        return {"pixel_values": self.pixels[index], "labels": self.labels[index]}

    @property
    def num_classes(self) -> int:
        return int(self.labels.max()) + 1

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.pixels.shape[1:])


def _seeded_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held_out) index arrays: a seeded shuffle, the last `fraction` held out."""
    order = np.random.default_rng(seed).permutation(n)
    held = int(round(n * fraction))
    return np.sort(order[: n - held]), np.sort(order[n - held:])


def _standardise(splits: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, ImageDataset]:
    """Scale to [0, 1] (uint8 input) and standardise per channel with the train split's statistics."""
    def as_float(images: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(np.require(images, requirements=["C", "W"])).float()   # a read-only cache: copied
        return tensor / 255.0 if images.dtype == np.uint8 else tensor
    train = as_float(splits["train"][0])                                    # (N, C, H, W)
    mean = train.mean(dim=(0, 2, 3), keepdim=True)[0]                       # (C, 1, 1)
    std = train.std(dim=(0, 2, 3), keepdim=True)[0].clamp_min(1e-6)
    return {
        name: ImageDataset((as_float(images) - mean) / std, torch.from_numpy(np.asarray(labels)).long())
        for name, (images, labels) in splits.items()
    }


def split_image_arrays(arrays: dict, seed: int = 0, limit: dict | None = None) -> dict[str, ImageDataset]:
    """train/validation/test datasets from {"train": (x, y)[, "test": (x, y)]} arrays, fixed by `seed`."""
    images, labels = arrays["train"]
    if "test" in arrays:
        test = arrays["test"]
    else:
        keep, held = _seeded_split(len(labels), TEST_FRACTION, seed)
        test = (images[held], labels[held])
        images, labels = images[keep], labels[keep]
    keep, held = _seeded_split(len(labels), VALIDATION_FRACTION, seed + 1)
    splits = {"train": (images[keep], labels[keep]), "validation": (images[held], labels[held]), "test": test}
    for name, cap in (limit or {}).items():
        if name not in splits:
            raise SymfusionError(f"limit names split {name!r}; splits are train, validation, test")
        if cap is None:
            continue
        if isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < 0:
            raise SymfusionError(f"limit for {name!r} must be a non-negative integer, got {cap!r}")
        x, y = splits[name]
        # a seeded subset, not the first items: the official files are sometimes sorted by class
        chosen = np.sort(np.random.default_rng(seed + 2).permutation(len(y))[: int(cap)])
        splits[name] = (x[chosen], y[chosen])
    return _standardise(splits)
