"""Red team, issue 55 class 7: files the project wrote itself, damaged (a disk error, a killed copy, an edit): the
caches (the causal_lm task's tokenizer and token blocks, the silver NER tags), a statistics file's metadata, the
summary CSVs report.md reads, and the dataset archives a task reads: detected, then rebuilt (a cache) or refused in
one line (a result or an installed dataset), never a traceback or a KeyError.

The class test enumerates the readers of caches (every function of src/ that calls marks.read_own, but marks.py's
own readers of its marks: tests/redteam/test_redteam_bookkeeping.py) and every registry entry's summary, and fails
for one without a case here.
"""
from __future__ import annotations

import ast
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers

from symfusion.errors import SymfusionError
from symfusion.pipeline.data.offline import load_fashion_mnist_arrays
from symfusion.pipeline.data.text import lm_cache, silver_ner
from symfusion.pipeline.data.text.bpe import tokenizer_from_json
from symfusion.pipeline.report.artefacts import summary_lines
from symfusion.pipeline.report.registry import experiments
from symfusion.pipeline.stages.evaluate import MERGE_FIELDS, model_origin
from symfusion.pipeline.stages.statistics import FORMAT, StatisticFiles
from hostile import outcome

SRC = Path(__file__).resolve().parents[2] / "src" / "symfusion"

# the cache readers of src/ (module:function calling read_own) -> the test that damages their entries
CACHE_READERS = {
    "pipeline/data/text/lm_cache.py:cached_text": "test_a_damaged_tokenizer_cache_is_rebuilt",
    "pipeline/data/text/lm_cache.py:cached_blocks": "test_damaged_blocks_are_rebuilt",
    "pipeline/data/text/silver_ner.py:_read_cache": "test_a_damaged_silver_ner_cache_is_tagged_again",
}


def read_own_callers() -> set[str]:
    found = set()
    for path in SRC.rglob("*.py"):
        if path.name == "marks.py":
            continue
        for function in ast.walk(ast.parse(path.read_text())):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == "read_own"
                    for n in ast.walk(function)):
                found.add(f"{path.relative_to(SRC)}:{function.name}")
    return found


def test_every_cache_reader_has_a_damage_case():
    assert read_own_callers() == set(CACHE_READERS)
    assert all(name in globals() for name in CACHE_READERS.values())


# ---------------------------------------------------------------- caches: rebuilt

def good_tokenizer_json() -> str:
    tokenizer = Tokenizer(models.BPE(vocab={"<|endoftext|>": 0, "a": 1, "b": 2, "ab": 3}, merges=[("a", "b")]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
    return tokenizer.to_str()


def damaged_texts(good: str) -> dict[str, bytes]:
    return {"truncated": good.encode()[: len(good) // 2], "empty": b"", "binary": bytes(range(256)),
            "another json": b'{"version": "1.0", "model": 7}', "not utf-8": b"\xff\xfe" + good.encode()}


def test_a_damaged_tokenizer_cache_is_rebuilt(tmp_path):
    good = good_tokenizer_json()
    for name, damage in damaged_texts(good).items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(damage)
        computed = []
        tokenizer = lm_cache.cached_text(path, lambda: computed.append(1) or good, parse=tokenizer_from_json)
        assert computed == [1], name                              # computed again
        assert tokenizer.backend_tokenizer.to_str() == tokenizer_from_json(good).backend_tokenizer.to_str(), name
        assert path.read_text() == good, name                     # and the entry replaced
    again = lm_cache.cached_text(path, lambda: pytest.fail("a whole entry is read, not recomputed"),
                                 parse=tokenizer_from_json)
    assert again.backend_tokenizer.to_str() == tokenizer_from_json(good).backend_tokenizer.to_str()


BLOCKS = torch.arange(12).reshape(3, 4)


def damaged_blocks(path: Path) -> dict:
    """name -> a function writing a damaged blocks entry at `path`."""
    def tensor(t):
        return lambda: save_file({"blocks": t}, str(path))
    good = path.with_suffix(".good")
    save_file({"blocks": BLOCKS.to(torch.int32)}, str(good))
    return {"truncated": lambda: path.write_bytes(good.read_bytes()[:60]), "empty": lambda: path.write_bytes(b""),
            "no blocks": lambda: save_file({"other": BLOCKS}, str(path)), "floats": tensor(BLOCKS.float()),
            "one row": tensor(BLOCKS.reshape(-1)), "another width": tensor(BLOCKS.reshape(4, 3)),
            "negative ids": tensor(BLOCKS - 5), "booleans": tensor(BLOCKS > 3)}


def test_damaged_blocks_are_rebuilt(tmp_path):
    path = tmp_path / "blocks.safetensors"
    for name, damage in damaged_blocks(path).items():
        damage()
        computed = []
        blocks = lm_cache.cached_blocks(path, lambda: computed.append(1) or BLOCKS, width=4)
        assert computed == [1] and torch.equal(blocks, BLOCKS), name
        assert torch.equal(lm_cache.cached_blocks(path, lambda: pytest.fail(name), width=4), BLOCKS), name


def test_a_damaged_silver_ner_cache_is_tagged_again(tmp_path):
    path = tmp_path / "silver.jsonl"
    records = [{"tokens": ["Ann", "ran"], "tags": ["B-PER", "O"], "group": "d1"}]
    header = {"schema": silver_ner.SILVER_CACHE_SCHEMA, "count": 1}
    silver_ner._write_cache(path, header, records)
    assert silver_ner._read_cache(path) == (header, records)
    damaged = {"no tokens": {"tags": ["O"], "group": "d"}, "unknown tag": {**records[0], "tags": ["B-PER", "B-XYZ"]},
               "lengths differ": {**records[0], "tags": ["O"]}, "not an object": ["Ann", "ran"],
               "no group": {"tokens": ["a"], "tags": ["O"]}, "tokens not text": {**records[0], "tokens": [1, 2]}}
    for name, record in damaged.items():
        silver_ner._write_cache(path, header, [record])
        assert silver_ner._read_cache(path) is None, name          # None: load_silver_ner tags again and replaces
    path.write_bytes(path.read_bytes()[:-10])
    assert silver_ner._read_cache(path) is None


# ---------------------------------------------------------------- results and datasets: refused in one line

def statistics_file(path: Path, metadata: dict) -> Path:
    save_file({"fisher/w": torch.ones(2)}, str(path), metadata={"format": FORMAT, **metadata})
    return path


DAMAGED_METADATA = {
    "no seconds": {"statistics": json.dumps({"fisher": "id"})},
    "no statistics": {"seconds": json.dumps({"fisher": 1.0})},
    "statistics not json": {"statistics": "{fisher", "seconds": json.dumps({"fisher": 1.0})},
    "statistics a list": {"statistics": json.dumps(["fisher"]), "seconds": json.dumps({"fisher": 1.0})},
    "seconds of another method": {"statistics": json.dumps({"fisher": "id"}), "seconds": json.dumps({"regmean": 1})},
    "seconds not a number": {"statistics": json.dumps({"fisher": "id"}), "seconds": json.dumps({"fisher": "slow"})},
    "a method without tensors": {"statistics": json.dumps({"fisher": "id", "regmean": "id2"}),
                                 "seconds": json.dumps({"fisher": 1.0, "regmean": 1.0})},
    "identity not text": {"statistics": json.dumps({"fisher": 7}), "seconds": json.dumps({"fisher": 1.0})},
    "nothing recorded": {"statistics": json.dumps({}), "seconds": json.dumps({})},
}


@pytest.mark.parametrize("damage", DAMAGED_METADATA)
def test_a_statistics_file_with_damaged_metadata_is_refused_in_one_line(damage, tmp_path):
    path = statistics_file(tmp_path / "s.safetensors", DAMAGED_METADATA[damage])
    with pytest.raises(SymfusionError, match="its metadata is damaged") as refused:
        StatisticFiles([str(path)])
    assert "\n" not in str(refused.value)


def test_whole_statistics_metadata_is_read(tmp_path):
    path = statistics_file(tmp_path / "s.safetensors", {"statistics": json.dumps({"fisher": "id"}),
                                                        "seconds": json.dumps({"fisher": 1.5})})
    found = StatisticFiles([str(path)]).lookup("id")
    assert found is not None and found[1] == 1.5 and torch.equal(found[0]["w"], torch.ones(2))


DAMAGED_CSV = {"empty": b"", "binary": bytes(range(256)), "a NUL": b"a,b\n1,\x002\n", "header only": b"x,y\n",
               "short rows": b"method,effect,effect_agrees\nsimple\n", "another table": b"foo,bar\n1,2\n",
               "text for numbers": None}


@pytest.mark.parametrize("entry", list(experiments().values()), ids=lambda e: e.name)
def test_every_summary_reads_a_damaged_csv_in_one_line_or_not_at_all(entry, tmp_path):
    """report.md's summary lines of each artefact from a damaged CSV: lines or one SymfusionError, no traceback."""
    results, figures = tmp_path / "results", tmp_path / "figures"
    folder = results if entry.kind == "table" else figures
    folder.mkdir(parents=True)
    for name, data in DAMAGED_CSV.items():
        if data is None:               # every column the writers read, each holding a word where a number goes
            data = (",".join(COLUMNS) + "\n" + ",".join("many" for _ in COLUMNS) + "\n").encode()
        (folder / f"{entry.name}.csv").write_bytes(data)
        code, text = outcome(lambda: summary_lines(results, figures))
        assert code in ("ok", "error"), f"{entry.name} {name}: {text[-1200:]}"
        assert code == "ok" or len(text.strip().splitlines()) == 1, f"{entry.name} {name}: {text}"


# the columns the summaries read (a CSV that has them all, with words in them)
COLUMNS = ["method", "matching", "variant", "setting", "model", "pair", "alpha", "loss", "accuracy", "barrier",
           "barrier_change", "change_low", "change_high", "change_verdict", "barrier_change_pairs", "effect",
           "effect_low", "effect_high", "effect_pairs", "ours_effect", "effect_agrees", "verdict", "seconds", "task",
           "score", "merges", "family", "stage", "layers", "examples", "k", "models", "distance"]


def idx_bytes(shape: tuple[int, ...]) -> bytes:
    header = bytes([0, 0, 8, len(shape)]) + b"".join(d.to_bytes(4, "big") for d in shape)
    return header + bytes(int(np.prod(shape)))


def fashion_folder(root: Path, images: bytes, labels: bytes) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", 4), ("t10k", 2)):
        whole_images, whole_labels = idx_bytes((count, 28, 28)), idx_bytes((count,))
        (root / f"{split}-images-idx3-ubyte.gz").write_bytes(gzip.compress(whole_images if split == "t10k" else images))
        (root / f"{split}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(whole_labels if split == "t10k" else labels))
    return root


DAMAGED_ARCHIVES = {
    "truncated gzip": lambda root: (root / "train-images-idx3-ubyte.gz").write_bytes(
        (root / "train-images-idx3-ubyte.gz").read_bytes()[:40]),
    "not gzip": lambda root: (root / "train-labels-idx1-ubyte.gz").write_bytes(b"plain bytes, no archive"),
    "truncated data": lambda root: (root / "train-images-idx3-ubyte.gz").write_bytes(
        gzip.compress(idx_bytes((4, 28, 28))[:-100])),
    "fewer labels": lambda root: (root / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes((3,)))),
    "images of one dimension": lambda root: (root / "train-images-idx3-ubyte.gz").write_bytes(
        gzip.compress(idx_bytes((4,)))),
}


@pytest.mark.parametrize("damage", DAMAGED_ARCHIVES)
def test_a_damaged_dataset_archive_is_refused_in_one_line(damage, tmp_path):
    root = fashion_folder(tmp_path / "fashion", idx_bytes((4, 28, 28)), idx_bytes((4,)))
    assert load_fashion_mnist_arrays(str(root))["train"][0].shape == (4, 1, 28, 28)      # whole: read
    DAMAGED_ARCHIVES[damage](root)
    code, text = outcome(lambda: load_fashion_mnist_arrays(str(root)))
    assert code == "error" and len(text.strip().splitlines()) == 1 and "reinstall" in text, text[-1200:]


@pytest.mark.parametrize("damage", [{}, {"method": "simple"}, {"method": "simple", "matching": "none", "seconds": 1}])
def test_a_damaged_merge_report_is_one_line(tmp_path, damage):
    """A merged folder's merge.json without the fields an evaluation reads: one line naming them, not a KeyError."""
    (tmp_path / "merge.json").write_text(json.dumps(damage))
    with pytest.raises(SymfusionError) as error:
        model_origin(tmp_path)
    message = str(error.value)
    assert "\n" not in message and all(k in message for k in MERGE_FIELDS if k not in damage), message
