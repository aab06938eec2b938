"""Image data sources: IDX parsing, fixed seeded splits, offline sources and the Hub loader on local Parquet."""
import gzip
import struct

import numpy as np
import pytest
import torch

from symfusion.pipeline.data import load_image_splits
from symfusion.pipeline.data.hub import load_hub_images
from symfusion.pipeline.data.images import split_image_arrays
from symfusion.pipeline.data.offline import FASHION_MNIST_FILES, load_fashion_mnist_arrays, read_idx
from symfusion.errors import SymfusionError


def write_idx(path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


def fake_fashion_dir(tmp_path, n_train=50, n_test=20):
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("test", n_test)):
        images, labels = FASHION_MNIST_FILES[split]
        write_idx(tmp_path / images, rng.integers(0, 256, (n, 28, 28)))
        write_idx(tmp_path / labels, rng.integers(0, 10, n))
    return tmp_path


def test_read_idx_round_trip(tmp_path):
    array = np.arange(2 * 3 * 4).reshape(2, 3, 4).astype(np.uint8)
    write_idx(tmp_path / "x.gz", array)
    assert np.array_equal(read_idx(tmp_path / "x.gz"), array)


def test_truncated_idx_is_refused(tmp_path):
    path = tmp_path / "bad.gz"
    with gzip.open(path, "wb") as handle:
        handle.write(bytes([0, 0, 8, 1]) + struct.pack(">I", 100) + b"\x01\x02")
    with pytest.raises(SymfusionError, match="truncated"):
        read_idx(path)


def test_fashion_mnist_from_a_folder_and_a_clear_error_without_it(tmp_path):
    arrays = load_fashion_mnist_arrays(str(fake_fashion_dir(tmp_path)))
    assert arrays["train"][0].shape == (50, 1, 28, 28) and arrays["test"][0].shape == (20, 1, 28, 28)
    with pytest.raises(SymfusionError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist_arrays(str(tmp_path / "nowhere"))


def test_splits_are_seeded_disjoint_and_validation_is_a_tenth_of_train():
    images = np.arange(200, dtype=np.uint8).reshape(200, 1, 1, 1).repeat(4, axis=2).repeat(4, axis=3)
    labels = np.arange(200) % 10
    arrays = {"train": (images, labels), "test": (images[:30], labels[:30])}
    first, again = split_image_arrays(arrays, seed=3), split_image_arrays(arrays, seed=3)
    other = split_image_arrays(arrays, seed=4)
    assert (len(first["train"]), len(first["validation"]), len(first["test"])) == (180, 20, 30)
    assert torch.equal(first["validation"].pixels, again["validation"].pixels)
    assert not torch.equal(first["validation"].pixels, other["validation"].pixels)
    train_ids = {float(p) for p in first["train"].pixels[:, 0, 0, 0]}     # each image has a unique value
    validation_ids = {float(p) for p in first["validation"].pixels[:, 0, 0, 0]}
    assert not train_ids & validation_ids
    # standardised with the train split's statistics
    assert first["train"].pixels.mean().abs() < 1e-5 and (first["train"].pixels.std() - 1).abs() < 1e-2


def test_limit_caps_a_split_and_unknown_split_names_fail():
    arrays = {"train": (np.zeros((100, 1, 4, 4), np.uint8), np.arange(100) % 10)}
    splits = split_image_arrays(arrays, seed=0, limit={"train": 12})
    assert len(splits["train"]) == 12 and len(splits["test"]) == 20 and len(splits["validation"]) == 8
    with pytest.raises(SymfusionError, match="limit names split"):
        split_image_arrays(arrays, seed=0, limit={"dev": 3})


def test_digits_source_has_all_ten_classes():
    splits = load_image_splits("digits", seed=0)
    assert splits["train"].image_shape == (1, 8, 8) and splits["train"].num_classes == 10
    assert sum(len(s) for s in splits.values()) == 1797


def test_unknown_source_is_refused():
    with pytest.raises(SymfusionError, match="unknown image source"):
        load_image_splits("imagenet")


def test_hub_loader_reads_a_local_parquet_dataset(tmp_path):
    import datasets
    from PIL import Image

    rng = np.random.default_rng(0)
    features = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)})
    (tmp_path / "data").mkdir()
    for split, n in (("train", 12), ("test", 5)):
        images = [Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(n)]
        table = datasets.Dataset.from_dict({"img": images, "label": list(rng.integers(0, 10, n))}, features=features)
        table.to_parquet(str(tmp_path / "data" / f"{split}-00000-of-00001.parquet"))
    arrays = load_hub_images(str(tmp_path))
    assert arrays["train"][0].shape == (12, 3, 32, 32) and arrays["test"][0].shape == (5, 3, 32, 32)
    first_image = np.asarray(datasets.load_dataset(str(tmp_path), split="train")[0]["img"])   # (H, W, C)
    assert np.array_equal(arrays["train"][0][0], first_image.transpose(2, 0, 1))
    with pytest.raises(SymfusionError, match="no column"):
        load_hub_images(str(tmp_path), image_column="image")
    with pytest.raises(SymfusionError, match="cannot load split"):
        load_hub_images(str(tmp_path / "missing"))
