"""Fusion methods by name: an explicit registry of merge functions over k >= 2 models (anchor first).

Every merge function has the signature
    merge(models: list[nn.Module], batches: list[dict] | None, **options) -> dict[str, Tensor]
and returns a state dict with the anchor's keys, shapes and dtypes. `models[0]` is the anchor;
the others are sources, usually already matched onto it (statistics such as Fisher and Gram
matrices are then computed on the matched models, as they must be). `batches` are inputs of
the task (dicts a model's forward takes, with `labels`), for methods that need data.
"""
from __future__ import annotations

from symfusion.errors import SymfusionError
from symfusion.fusion import fisher, ot, regmean, simple

FUSION_METHODS = {
    "simple": simple.merge,
    "fisher": fisher.merge,
    "regmean": regmean.merge,
    "ot_acts": ot.merge_acts,
    "ot_acts_emd": ot.merge_acts_emd,
    "ot_wts": ot.merge_wts,
}

# Methods that read task data (statistic batches); the others ignore `batches`.
DATA_METHODS = ("fisher", "regmean", "ot_acts", "ot_acts_emd")


def merge_models(method: str, models: list, batches: list[dict] | None = None, **options) -> dict:
    """Fuse `models` (anchor first) with the named method; returns the merged state dict."""
    if method not in FUSION_METHODS:
        raise SymfusionError(f"unknown fusion method {method!r}; choose one of {', '.join(FUSION_METHODS)}")
    if len(models) < 2:
        raise SymfusionError(f"fusion needs at least two models, got {len(models)}")
    if method in DATA_METHODS and not batches:
        raise SymfusionError(f"fusion method {method!r} needs data batches (set fusion.num_batches > 0)")
    return FUSION_METHODS[method](models, batches, **options)
