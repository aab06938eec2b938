"""Synthetic inputs for a data-free refinement: images of smooth noise in the models' normalised input space.

`full_symmetry_synthetic` (matching.refine=synthetic) refines the whole symmetry as `full_symmetry_learned`
does (matching/learned.py), distilled only: each step's target is the two end models' own predictions on inputs
made here, so no data is read. An image is N(0, 1) noise blurred twice by a box BLUR x the image side wide
(zero padding; 13 pixels at 28), then standardised per image and channel: mean 0, variance 1, as the tasks'
preprocessing hands their images to the model (pipeline/data/images.py). The width was chosen on the validation
split of the mini's three ViT pairs among 5, 9, 13 and 19 pixels at 28; unblurred noise made the barrier worse
than no refinement (docs/matching.md). Labels are drawn too (the model's own loss needs them) and never read.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from symfusion.errors import SymfusionError
from symfusion.families import family_spec

BLUR = 13 / 28              # the box's width as a fraction of the image side (rounded to an odd number of pixels)
BATCH_SIZE = 64             # images per batch (the mini's statistic batches)


def box_width(side: int) -> int:
    """The blur box's width in pixels for images `side` pixels wide: BLUR x side, the nearest odd number."""
    return max(1, 2 * round((BLUR * side - 1) / 2) + 1)


def smooth_noise(shape: tuple[int, int, int, int], generator: torch.Generator) -> torch.Tensor:
    """Images (batch, channels, height, width) of N(0, 1) noise blurred twice by the box (each direction apart:
    the same box), standardised per image and channel."""
    x = torch.randn(shape, generator=generator)
    channels, k = shape[1], box_width(max(shape[2:]))
    rows = torch.full((channels, 1, k, 1), 1 / k)
    cols = torch.full((channels, 1, 1, k), 1 / k)
    for _ in range(2):
        x = torch.nn.functional.conv2d(x, rows, padding=(k // 2, 0), groups=channels)
        x = torch.nn.functional.conv2d(x, cols, padding=(0, k // 2), groups=channels)
    centred = x - x.mean((2, 3), keepdim=True)
    return centred / centred.pow(2).mean((2, 3), keepdim=True).sqrt().clamp_min(1e-12)


def check_images(config) -> None:
    """Refuse, with one line, a model that reads no images (there is nothing this module can make for it)."""
    if family_spec(config).inputs != "pixels":
        raise SymfusionError(f"matching.refine=synthetic makes images only; {config.model_type} reads tokens: "
                             "give data instead (matching=full_symmetry_learned data_task=NAME)")


class SyntheticBatches(Sequence):
    """`count` batches of smooth-noise images and random labels for a model of `config`; batch i is made when
    read (seeded by `seed` and i: the same on every read, at any size of image, without holding them all)."""

    def __init__(self, config, count: int, seed: int = 0, batch_size: int = BATCH_SIZE):
        check_images(config)
        self.shape = (batch_size, config.num_channels, config.image_size, config.image_size)
        self.labels = max(int(getattr(config, "num_labels", 2)), 1)
        self.count, self.seed = count, seed

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.count))]
        if not -self.count <= index < self.count:
            raise IndexError(index)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index % self.count)
        pixels = smooth_noise(self.shape, generator)
        return {"pixel_values": pixels, "labels": torch.randint(0, self.labels, self.shape[:1], generator=generator)}
