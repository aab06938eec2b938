"""What fusion methods share: which statistic batches each model's statistics are computed on, and how many examples."""
from __future__ import annotations

import torch


def batches_of(batches: list | None, index: int) -> list[dict] | None:
    """Model `index`'s batches: `batches` is one list shared by all models, or one list per model.

    Pairwise and grouped merges of models fine-tuned on different data compute each model's
    Fisher / Gram statistics on that model's own task (as RegMean and Fisher merging intend).
    """
    if batches and isinstance(batches[0], (list, tuple)):
        return list(batches[index])
    return batches


def batch_size(batch: dict) -> int:
    """Examples in a batch: the length of its labels, else of its first tensor."""
    if "labels" in batch:
        return batch["labels"].shape[0]
    return next(v for v in batch.values() if torch.is_tensor(v) and v.dim() >= 1).shape[0]


def first_examples(batches: list[dict], limit: int | None) -> list[dict]:
    """The first `limit` examples of `batches` in order (all of them if they hold fewer, or limit is None).

    A batch is cut by slicing every tensor whose leading dimension is the batch size.
    """
    if limit is None:
        return list(batches)
    kept, left = [], limit
    for batch in batches:
        if left <= 0:
            break
        size = batch_size(batch)
        if size > left:
            batch = {k: v[:left] if torch.is_tensor(v) and v.dim() >= 1 and v.shape[0] == size else v
                     for k, v in batch.items()}
            size = left
        kept.append(batch)
        left -= size
    return kept
