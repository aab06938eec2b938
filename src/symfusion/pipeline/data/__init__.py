"""Data sources by name: offline image sets (digits, Fashion-MNIST) and the Hub (CIFAR-10)."""
from __future__ import annotations

from symfusion.pipeline.data.images import ImageDataset, split_image_arrays
from symfusion.pipeline.data.hub import load_hub_images
from symfusion.pipeline.data.offline import load_digits_arrays, load_fashion_mnist_arrays
from symfusion.errors import SymfusionError

# source name -> function(**source options) returning {"train": (images, labels), "test": (...)}
# (images uint8 or float (N, C, H, W), labels int (N,)); digits has no official test split.
IMAGE_SOURCES = {
    "digits": load_digits_arrays,
    "fashion_mnist": load_fashion_mnist_arrays,
    "hub": load_hub_images,
}


def load_image_splits(source: str, seed: int = 0, limit: dict | None = None, **options) -> dict[str, ImageDataset]:
    """Fixed, seeded train / validation / test datasets of an image source (validation = 10% of train)."""
    if source not in IMAGE_SOURCES:
        raise SymfusionError(f"unknown image source {source!r}; choose one of {', '.join(IMAGE_SOURCES)}")
    arrays = IMAGE_SOURCES[source](**options)
    return split_image_arrays(arrays, seed=seed, limit=limit)


__all__ = ["IMAGE_SOURCES", "ImageDataset", "load_image_splits"]
