"""Image datasets from the Hugging Face Hub (paper profile: CIFAR-10) through the `datasets` library.

`dataset` is a Hub id read at `revision` (a pinned commit: conf/task/cifar10.yaml) or a local folder of
Parquet files laid out as on the Hub (the rehearsal profile's stand-in), read by the same call.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from symfusion.errors import SymfusionError
from symfusion.pipeline.revisions import pin_revision


def _to_array(images) -> np.ndarray:
    """PIL images (or arrays) -> uint8 (N, C, H, W)."""
    stacked = np.stack([np.asarray(image.convert("RGB") if hasattr(image, "convert") else image) for image in images])
    if stacked.ndim == 3:                                   # grey (N, H, W)
        stacked = stacked[..., None]
    return np.ascontiguousarray(stacked.transpose(0, 3, 1, 2)).astype(np.uint8)   # (N, H, W, C) -> (N, C, H, W)


def load_hub_images(dataset: str, image_column: str = "img", label_column: str = "label",
                    splits: tuple = ("train", "test"), revision: str | None = None) -> dict:
    """{"train": (x, y), "test": (x, y)} from a Hub dataset id (at `revision`) or a local folder of Parquet files."""
    try:
        import datasets
    except ImportError as error:
        raise SymfusionError("the paper profile needs the `datasets` package: pip install datasets") from error
    if not Path(dataset).is_dir():
        revision = pin_revision(dataset, revision, "dataset", "options.revision in conf/task/<name>.yaml")
    arrays = {}
    for split in splits:
        try:
            data = datasets.load_dataset(dataset, split=split, revision=revision)
        except Exception as error:  # the library raises many types (offline, missing split, bad id)
            raise SymfusionError(
                f"cannot load split {split!r} of dataset {dataset!r} ({type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}); check the id and your Hub access "
                "(HF_HUB_OFFLINE must be unset for the paper profile)"
            ) from error
        missing = [c for c in (image_column, label_column) if c not in data.column_names]
        if missing:
            raise SymfusionError(f"dataset {dataset!r} has no column(s) {missing}; columns are {data.column_names}")
        arrays[split] = (_to_array(data[image_column]), np.asarray(data[label_column], dtype=np.int64))
    return arrays
