"""Uncertainty of effects: paired bootstrap intervals over test examples (seeded loop), and the verdict on an effect.

An effect is the difference of one metric between two models scored on the same test examples (matched vs
unmatched merge). Its interval comes from a paired bootstrap: the test examples are resampled with
replacement RESAMPLES times (the same resample for both models), the metric recomputed on each resample
for both, and the 2.5% and 97.5% quantiles of the differences taken. An effect "helps" or "hurts" only when
its interval excludes 0; otherwise it is "no detectable change". Over fewer than MIN_EXAMPLES test examples it is
"too few examples", whatever its interval: a bootstrap of one example resamples that example only (an interval of
width 0), and even n examples that all move one way are, by an exact sign test, a chance of 2^(1-n) with no effect,
which is below 5% only from n = 6.

Per-example records (what an evaluation saves beside its metrics, `per_example`) and the metrics they give:
    accuracy         {"correct": [0|1, ...]}                                 mean
    loss             {"loss": [float, ...]}                                  mean (lower is better); with
                     {"tokens": [int, ...]} beside it (token classification)   sum(loss) / sum(tokens)
    macro_f1, mcc    {"prediction": [int, ...], "reference": [int, ...]}     as text_metrics computes them
                     (class ids: integers >= 0, checked before any table is built)
    pearson_spearman {"prediction": [float, ...], "reference": [float, ...]} mean of Pearson and Spearman
    span_f1          {"tp": [int, ...], "predicted": [...], "gold": [...]}   micro F1 over entity spans
The resamples are seeded by `seed` and the test set's size and name, so two evaluations on one test set
use the same resamples (effects averaged over several test sets stay paired per set).
"""
from __future__ import annotations

import hashlib

import numpy as np
from scipy.stats import rankdata

RESAMPLES = 1000
CONFIDENCE = 0.95
SEED = 0
METRICS = ("accuracy", "loss", "macro_f1", "mcc", "pearson_spearman", "span_f1")     # what scores() computes
LOWER_IS_BETTER = ("loss",)
NO_CHANGE = "no detectable change"
TOO_FEW = "too few examples"
MIN_EXAMPLES = 6                                 # the fewest test examples an effect is judged on (see above)
VERDICTS = ("helps", "hurts", NO_CHANGE, TOO_FEW)         # what verdict() says
# class ids up to this are the confusion matrix's own rows; larger ones are renumbered first (a prediction of
# 10^9 would otherwise ask for a 10^18-cell matrix), which moves only the summation order of unseen classes' zeros
DENSE_CLASSES = 64


def resamples(n: int, test_set: str = "", count: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """(count, n) indices of bootstrap resamples of n examples, fixed by seed and the test set's name."""
    key = int.from_bytes(hashlib.sha256(f"{seed}:{test_set}:{n}".encode()).digest()[:8], "little")
    return np.random.default_rng(key).integers(0, n, size=(count, n))


def _confusion(prediction: np.ndarray, reference: np.ndarray, index: np.ndarray, classes: int) -> np.ndarray:
    """(resamples, classes, classes) confusion counts [reference, prediction] of each resample."""
    count = index.shape[0]
    cells = reference[index] * classes + prediction[index]                          # (B, n)
    flat = (np.arange(count)[:, None] * classes * classes + cells).ravel()
    return np.bincount(flat, minlength=count * classes * classes).reshape(count, classes, classes)


def _macro_f1(confusion: np.ndarray) -> np.ndarray:
    """Unweighted mean F1 over the classes seen in references or predictions (scikit-learn's macro F1)."""
    tp = np.diagonal(confusion, axis1=1, axis2=2).astype(float)
    gold, predicted = confusion.sum(axis=2), confusion.sum(axis=1)
    seen = (gold + predicted) > 0
    f1 = np.where(seen, 2 * tp / np.maximum(gold + predicted, 1), 0.0)
    return f1.sum(axis=1) / np.maximum(seen.sum(axis=1), 1)


def _mcc(confusion: np.ndarray) -> np.ndarray:
    """Matthews correlation (multiclass, as scikit-learn's matthews_corrcoef); 0 where undefined."""
    c = confusion.astype(float)
    total = c.sum(axis=(1, 2))
    correct = np.trace(c, axis1=1, axis2=2)
    gold, predicted = c.sum(axis=2), c.sum(axis=1)
    numerator = correct * total - (gold * predicted).sum(axis=1)
    denominator = np.sqrt((total ** 2 - (predicted ** 2).sum(axis=1)) * (total ** 2 - (gold ** 2).sum(axis=1)))
    return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1), 0.0)


def _pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson's r of each row pair of (B, n) arrays; NaN where a side is constant."""
    x, y = x - x.mean(axis=1, keepdims=True), y - y.mean(axis=1, keepdims=True)
    denominator = np.sqrt((x * x).sum(axis=1) * (y * y).sum(axis=1))
    return np.where(denominator > 0, (x * y).sum(axis=1) / np.where(denominator > 0, denominator, 1), np.nan)


def _pearson_spearman(prediction: np.ndarray, reference: np.ndarray, index: np.ndarray) -> np.ndarray:
    """The mean of Pearson's and Spearman's correlation on each resample (text_metrics.pearson_spearman)."""
    x, y = prediction[index], reference[index]                                      # (B, n)
    spearman = _pearson(rankdata(x, axis=1), rankdata(y, axis=1))                   # ties get average ranks
    return (_pearson(x, y) + spearman) / 2


def class_ids(record: dict, key: str) -> np.ndarray:
    """record[key] as int64 class ids; ValueError unless every one is an integer >= 0 (no bool, float or NaN)."""
    values = np.asarray(record[key], dtype=object).ravel()
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0 for v in values):
        wrong = next(v for v in values if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0))
        raise ValueError(f"per_example.{key} holds {wrong!r}; class ids are integers >= 0")
    return values.astype(np.int64)


def scores(metric: str, record: dict, index: np.ndarray) -> np.ndarray:
    """The metric on each resample (rows of `index`) of one evaluation's per-example record, (B,)."""
    if metric == "loss" and "tokens" in record:            # a token-weighted mean: each sentence's summed loss
        losses, tokens = np.asarray(record["loss"], dtype=float), np.asarray(record["tokens"], dtype=float)
        total = tokens[index].sum(axis=1)
        return np.where(total > 0, losses[index].sum(axis=1) / np.where(total > 0, total, 1), np.nan)
    if metric in ("accuracy", "loss"):
        values = np.asarray(record["correct" if metric == "accuracy" else "loss"], dtype=float)
        return values[index].mean(axis=1)
    if metric in ("macro_f1", "mcc"):
        prediction, reference = class_ids(record, "prediction"), class_ids(record, "reference")
        classes = int(max(prediction.max(initial=0), reference.max(initial=0))) + 1
        if classes > DENSE_CLASSES:  # large ids: the classes seen, numbered in order (both metrics ignore the others)
            seen, codes = np.unique(np.concatenate([prediction, reference]), return_inverse=True)
            prediction, reference, classes = codes[:len(prediction)], codes[len(prediction):], len(seen)
        confusion = _confusion(prediction, reference, index, classes)
        return _macro_f1(confusion) if metric == "macro_f1" else _mcc(confusion)
    if metric == "pearson_spearman":
        return _pearson_spearman(np.asarray(record["prediction"], float), np.asarray(record["reference"], float),
                                 index)
    if metric == "span_f1":
        tp, predicted, gold = (np.asarray(record[k], dtype=float)[index].sum(axis=1) for k in ("tp", "predicted", "gold"))
        total = predicted + gold
        return np.where(total > 0, 2 * tp / np.where(total > 0, total, 1), 0.0)
    raise ValueError(f"no bootstrap for metric {metric!r}; the metrics are {', '.join(METRICS)}")


def interval(differences: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The central `confidence` quantile interval of bootstrap differences."""
    tail = (1 - confidence) / 2
    finite = differences[np.isfinite(differences)]
    if finite.size == 0:
        return float("nan"), float("nan")
    return float(np.quantile(finite, tail)), float(np.quantile(finite, 1 - tail))


def verdict(low: float, high: float, lower_is_better: bool = False, examples: int | None = None) -> str:
    """helps / hurts / no detectable change: by the sign of an interval that excludes 0; too few examples over
    fewer than MIN_EXAMPLES test examples (`examples`, where the interval is a bootstrap over them)."""
    if examples is not None and examples < MIN_EXAMPLES:
        return TOO_FEW
    if not (np.isfinite(low) and np.isfinite(high)) or low <= 0 <= high:
        return NO_CHANGE
    better = high < 0 if lower_is_better else low > 0
    return "helps" if better else "hurts"


def paired_effect(metric: str, pairs: list[tuple[dict, dict, str]], scale: float = 1.0,
                  count: int = RESAMPLES, seed: int = SEED) -> dict:
    """The mean over `pairs` of metric(with) - metric(without), each pair (with, without, test set name) scored
    on the same examples, with its paired bootstrap interval and verdict; `scale` (e.g. 100) multiplies all."""
    differences = np.zeros(count)
    point, fewest = 0.0, None
    for with_, without, test_set in pairs:
        n = len(next(iter(with_.values())))
        fewest = n if fewest is None else min(fewest, n)
        if len(next(iter(without.values()))) != n:
            raise ValueError(f"{test_set}: the two evaluations scored {n} and "
                             f"{len(next(iter(without.values())))} examples; a paired effect needs the same ones")
        index = resamples(n, test_set, count, seed)
        everything = np.arange(n)[None, :]
        point += float(scores(metric, with_, everything)[0] - scores(metric, without, everything)[0])
        differences += scores(metric, with_, index) - scores(metric, without, index)
    point, differences = scale * point / len(pairs), scale * differences / len(pairs)
    low, high = interval(differences)
    return {"effect": point, "low": low, "high": high, "resamples": count,
            "verdict": verdict(low, high, metric in LOWER_IS_BETTER, examples=fewest)}


def score_interval(metric: str, record: dict, test_set: str, scale: float = 1.0, count: int = RESAMPLES,
                   seed: int = SEED) -> tuple[float, float]:
    """The bootstrap interval of one evaluation's metric (error bars)."""
    n = len(next(iter(record.values())))
    return interval(scale * scores(metric, record, resamples(n, test_set, count, seed)))
