"""An on-disk cache of what the causal_lm task derives from its corpora: its BPE tokenizer and each split's token blocks.

Both are pure functions of their inputs, so a cache file is named by the sha256 of everything it is computed from:
LM_SCHEMA (bump it when lm.py's reading, cleaning or splitting of documents changes), the corpora with their source
files' names and sizes, and the split seed; for the tokenizer its settings, for blocks the block size, the split and
the digest of the tokenizer that cut them (its whole tokenizer.json). Blocks are stored whole (before the task's
limit), as int32 safetensors. A file is written beside its name and renamed into place, so neither a killed job nor
two jobs writing at once leave a partial file; an entry is read or replaced only when it is this user's own plain
file (marks.py), so nothing planted under its name is read. Without a cache_dir nothing is cached. It saves a pipeline job about
3 CPU seconds: reading the Rotten Tomatoes file (about 1 s) and tokenising a split or two.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save_file

from symfusion.io.marks import read_own, write_own
from symfusion.pipeline.data.text.lm import LM_CORPORA

LM_SCHEMA = 1


def corpora_identity(corpora) -> list:
    """(corpus, source file name, size in bytes) of each corpus: what its documents are read from."""
    identity = []
    for name in corpora:
        path = Path(LM_CORPORA[name][1]())
        identity.append([name, path.name, path.stat().st_size])
    return identity


def cache_path(cache_dir: str | Path, kind: str, suffix: str, **parts) -> Path:
    """<cache_dir>/lm-<kind>-<sha256 of the schema, kind and parts>.<suffix>."""
    record = json.dumps({"schema": LM_SCHEMA, "kind": kind, **parts}, sort_keys=True, default=str)
    return Path(cache_dir) / f"lm-{kind}-{hashlib.sha256(record.encode()).hexdigest()[:24]}.{suffix}"


def cached_text(path: Path | None, compute: Callable[[], str], parse: Callable[[str], object] = str):
    """parse(the text in `path`), else parse(compute()) with that text written there (path None: no cache). An entry
    that does not decode or that `parse` refuses (a damaged tokenizer.json) is computed again and replaced."""
    data = read_own(path) if path is not None else None        # only this user's own entry (marks.py)
    if data is not None:
        try:
            return parse(data.decode("utf-8"))
        except Exception:           # noqa: BLE001 - whatever the parser raises on damaged text: computed again
            pass
    text = compute()
    if path is not None:
        write_own(path, lambda name: Path(name).write_text(text, encoding="utf-8"))
    return parse(text)


def _whole_blocks(blocks: torch.Tensor, width: int | None) -> bool:
    """Blocks as token_blocks cuts them: (rows, width) integer token ids >= 0."""
    return blocks.dim() == 2 and not blocks.is_floating_point() and blocks.dtype != torch.bool \
        and (width is None or blocks.shape[1] == width) and (blocks.numel() == 0 or int(blocks.min()) >= 0)


def cached_blocks(path: Path | None, compute: Callable[[], torch.Tensor], width: int | None = None) -> torch.Tensor:
    """The (rows, width) int64 blocks in `path`, else compute() written there as int32 (path None: no cache); an
    entry that is not such blocks (damaged, another shape or dtype, negative ids) is computed again and replaced."""
    data = read_own(path) if path is not None else None
    if data is not None:
        try:
            blocks = load(data)["blocks"]
            if _whole_blocks(blocks, width):
                return blocks.to(torch.int64)
        except (SafetensorError, KeyError, ValueError, RuntimeError):
            pass
    blocks = compute()
    if path is not None:
        if blocks.numel() and int(blocks.max()) >= 2**31:
            return blocks                  # ids beyond int32: not cached
        write_own(path, lambda name: save_file({"blocks": blocks.to(torch.int32).contiguous()}, name))
    return blocks
