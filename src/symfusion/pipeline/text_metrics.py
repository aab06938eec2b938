"""Task metrics of the language track (scikit-learn, seqeval, scipy; never `evaluate.load`), each with a "score"."""
from __future__ import annotations

import math
import warnings

import numpy as np

from symfusion.errors import SymfusionError


def _check_lengths(references, predictions) -> None:
    if len(references) != len(predictions):
        raise SymfusionError(f"{len(references)} references but {len(predictions)} predictions; pass one per example")
    if len(references) == 0:
        raise SymfusionError("no examples to score; check the split and its limit settings")


def macro_f1(references, predictions) -> dict:
    """Unweighted mean of per-class F1 over the classes seen in references or predictions, plus accuracy.

    As scikit-learn's f1_score(average="macro"), which Hugging Face's "f1" metric wraps; a class
    with no true and no predicted example is left out, a class with no prediction scores F1 = 0.
    """
    from sklearn.metrics import accuracy_score, f1_score
    _check_lengths(references, predictions)
    f1 = float(f1_score(references, predictions, average="macro", zero_division=0))
    return {"macro_f1": f1, "accuracy": float(accuracy_score(references, predictions)), "score": f1}


def span_f1(references: list[list[str]], predictions: list[list[str]], mode: str = "default") -> dict:
    """Micro-averaged precision / recall / F1 over entity spans (seqeval), one tag list per sentence.

    mode="default" is conlleval's lenient chunking (an I-X after O opens a span, as in CoNLL scoring
    and Hugging Face's seqeval metric); mode="strict" parses spans by the IOB2 scheme, so a span
    must start with B-X to count.
    """
    from seqeval.metrics import f1_score, precision_score, recall_score
    from seqeval.scheme import IOB2
    _check_lengths(references, predictions)
    if any(len(r) != len(p) for r, p in zip(references, predictions)):
        raise SymfusionError("a sentence has a different number of reference and predicted tags")
    if mode not in ("default", "strict"):
        raise SymfusionError(f"span_f1 mode={mode!r}; choose 'default' or 'strict'")
    options = {"mode": "strict", "scheme": IOB2} if mode == "strict" else {}
    kwargs = dict(average="micro", zero_division=0, **options)
    scores = {"precision": precision_score(references, predictions, **kwargs),
              "recall": recall_score(references, predictions, **kwargs),
              "f1": f1_score(references, predictions, **kwargs)}
    scores = {k: float(v) for k, v in scores.items()}
    return {**scores, "score": scores["f1"]}


def mcc(references, predictions) -> dict:
    """Matthews correlation coefficient (scikit-learn; 0 when a row or column of the confusion matrix is empty)."""
    from sklearn.metrics import matthews_corrcoef
    _check_lengths(references, predictions)
    value = float(matthews_corrcoef(references, predictions))
    return {"mcc": value, "score": value}


def pearson_spearman(references, predictions) -> dict:
    """Pearson and Spearman correlation (scipy) and their mean as "score"; NaN when either side is constant."""
    from scipy.stats import pearsonr, spearmanr
    _check_lengths(references, predictions)
    x = np.asarray(references, dtype=np.float64)
    y = np.asarray(predictions, dtype=np.float64).reshape(x.shape)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return {"pearson": math.nan, "spearman": math.nan, "score": math.nan}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pearson, spearman = float(pearsonr(x, y)[0]), float(spearmanr(x, y)[0])
    return {"pearson": pearson, "spearman": spearman, "score": (pearson + spearman) / 2}


METRICS = {"macro_f1": macro_f1, "span_f1": span_f1, "mcc": mcc, "pearson_spearman": pearson_spearman}

# What each metric scores: the task kind whose predictions it takes.
METRIC_KINDS = {"macro_f1": "text_classification", "mcc": "text_classification",
                "span_f1": "token_classification", "pearson_spearman": "regression"}


def get_metric(name: str, kind: str | None = None):
    """The metric function called `name`, checked against the task kind when one is given."""
    if name not in METRICS:
        raise SymfusionError(f"unknown metric {name!r}; choose one of {', '.join(METRICS)}")
    if kind is not None and METRIC_KINDS[name] != kind:
        raise SymfusionError(f"metric {name!r} scores {METRIC_KINDS[name]} tasks, not {kind!r}")
    return METRICS[name]
