"""Offline image sources: scikit-learn's digits (smoke) and Debian's Fashion-MNIST IDX files (mini)."""
from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from symfusion.errors import SymfusionError

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def load_digits_arrays() -> dict:
    """scikit-learn's 1,797 8x8 digits as uint8-range images (N, 1, 8, 8); no official test split."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images * (255.0 / 16.0)).round().astype(np.uint8)[:, None]   # (N, 1, 8, 8)
    return {"train": (images, digits.target.astype(np.int64))}


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (optionally gzipped): magic, dims as big-endian uint32, then uint8 data."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            data = handle.read()
    except (EOFError, zlib.error, gzip.BadGzipFile) as error:          # a truncated or damaged archive
        raise SymfusionError(f"{path} is damaged ({str(error)[:80]}); reinstall dataset-fashion-mnist") from error
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise SymfusionError(f"{path} is not an unsigned-byte IDX file; reinstall dataset-fashion-mnist")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if array.size != int(np.prod(shape)):
        raise SymfusionError(f"{path} is truncated ({array.size} values for shape {shape}); reinstall it")
    return array.reshape(shape)


def load_fashion_mnist_arrays(directory: str = FASHION_MNIST_DIR) -> dict:
    """Fashion-MNIST train (60,000) and test (10,000), images (N, 1, 28, 28) uint8, labels (N,)."""
    root = Path(directory)
    arrays = {}
    for split, (image_file, label_file) in FASHION_MNIST_FILES.items():
        image_path, label_path = root / image_file, root / label_file
        if not image_path.is_file() or not label_path.is_file():
            raise SymfusionError(
                f"Fashion-MNIST not found at {root} (missing {image_path.name if not image_path.is_file() else label_path.name}); "
                "install it with `apt-get install dataset-fashion-mnist` or set task.options.directory"
            )
        images, labels = read_idx(image_path), read_idx(label_path)
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise SymfusionError(f"{image_path} and {label_path} hold {images.shape} images and {labels.shape} labels, "
                                 "not one label per 2-d image; reinstall dataset-fashion-mnist")
        arrays[split] = (images[:, None], labels.astype(np.int64))
    return arrays
