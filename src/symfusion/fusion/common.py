"""What fusion methods share: which statistic batches each model's statistics are computed on."""
from __future__ import annotations


def batches_of(batches: list | None, index: int) -> list[dict] | None:
    """Model `index`'s batches: `batches` is one list shared by all models, or one list per model.

    Pairwise and grouped merges of models fine-tuned on different data compute each model's
    Fisher / Gram statistics on that model's own task (as RegMean and Fisher merging intend).
    """
    if batches and isinstance(batches[0], (list, tuple)):
        return list(batches[index])
    return batches
