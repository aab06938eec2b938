"""Numbers over several model pairs: the mean, its spread (standard deviation, standard error), the t interval over pairs, and the verdict that holds over pairs.

A result beyond the paper is a property of the recipe only if it holds for other pairs of independently trained
end models, not only for the one pair its paired bootstrap (uncertainty.py) speaks about: that interval covers the
test examples, not the training. With n >= 2 pairs, a cell is reported per pair and as the mean over pairs with
the sample standard deviation sd, the standard error se = sd / sqrt(n) (as Generalized LMC reports its barriers),
and the 95% t interval mean +- t(0.975, n - 1) se. An effect "helps" (or "hurts") over pairs only when that t
interval excludes 0 on its side and every pair's own bootstrap interval does too; otherwise it is "no detectable
change". With one pair the pair's own bootstrap verdict stands, and the report says "1 pair".
"""
from __future__ import annotations

import math
import statistics

from scipy.stats import t as student_t

from symfusion.pipeline.uncertainty import NO_CHANGE

CONFIDENCE = 0.95


def over_pairs(values: dict[str, float]) -> dict:
    """{pairs, mean, sd, se, low, high} of per-pair values (sd, se, low, high are None with one pair)."""
    numbers = [values[p] for p in sorted(values)]
    n = len(numbers)
    mean = statistics.fmean(numbers)
    if n < 2:
        return {"pairs": n, "mean": mean, "sd": None, "se": None, "low": None, "high": None}
    sd = statistics.stdev(numbers)
    se = sd / math.sqrt(n)
    half = student_t.ppf(0.5 + CONFIDENCE / 2, n - 1) * se
    return {"pairs": n, "mean": mean, "sd": sd, "se": se, "low": mean - half, "high": mean + half}


def verdict_over_pairs(spread: dict, per_pair: list[str], lower_is_better: bool = False) -> str:
    """helps / hurts when the t interval over pairs excludes 0 on that side and every pair's own verdict agrees;
    with one pair, that pair's verdict; else no detectable change."""
    if spread["pairs"] < 2:
        return per_pair[0] if per_pair else NO_CHANGE
    below, above = spread["high"] < 0, spread["low"] > 0
    if not (below or above):
        return NO_CHANGE
    found = "helps" if above != lower_is_better else "hurts"
    return found if all(v == found for v in per_pair) else NO_CHANGE


def spread_columns(prefix: str, spread: dict) -> dict:
    """CSV columns of a cell over pairs: <prefix>_pairs, and with several pairs <prefix>_sd, _se, _pairs_low,
    _pairs_high (the t interval over pairs)."""
    columns = {f"{prefix}_pairs": spread["pairs"]}
    if spread["pairs"] > 1:
        columns.update({f"{prefix}_sd": spread["sd"], f"{prefix}_se": spread["se"],
                        f"{prefix}_pairs_low": spread["low"], f"{prefix}_pairs_high": spread["high"]})
    return columns


def describe(spread: dict, digits: int = 2, unit: str = "") -> str:
    """'68.1 +- 0.4 (se, 3 pairs)' or '68.1 (1 pair)'."""
    if spread["pairs"] < 2:
        return f"{spread['mean']:.{digits}f}{unit} (1 pair)"
    return f"{spread['mean']:.{digits}f}{unit} +- {spread['se']:.{digits}f} (se, {spread['pairs']} pairs)"
