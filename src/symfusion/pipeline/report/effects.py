"""Effects of matching, shared by the writers: merged evaluations by (method, matching), accuracy effects with paired intervals, agreement with the paper.

Our effect of matching (a matching minus w/o match) comes with a paired bootstrap interval over the test
examples (uncertainty.py); with one model pair it "helps" or "hurts" only when the interval excludes 0, else it
is "no detectable change". With several model pairs (seeds) the effect is the mean over pairs, its bootstrap
interval that of the mean, and it is reported per pair and with its spread over pairs (spread.py): it helps or
hurts only when that holds over pairs. The paper gives one number per cell and no interval: its direction is
the sign of its difference.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from symfusion.errors import SymfusionError
from symfusion.pipeline.report.results import NUMBER, RESULT_FILE, STRING, array, read_json, record
from symfusion.pipeline.report.spread import over_pairs, spread_columns, verdict_over_pairs
from symfusion.pipeline.uncertainty import LOWER_IS_BETTER, paired_effect, score_interval

# A vision evaluation as the writers of Table 2 and Figure 3 read it: a merged model's, or an end model's.
MERGED_VISION_EVAL = record({
    "method": STRING, "matching": STRING, "merged_models": array(STRING, 2),
    "metrics": record({"accuracy": NUMBER}),
    "results": array(record({"task": STRING, "per_example": record({"correct": array(NUMBER, 1)})}), 1)})
END_VISION_EVAL = record({"method": {"const": "end_model"}, "model": STRING,
                          "metrics": record({"accuracy": NUMBER, "loss": NUMBER})})
VISION_EVALS = {RESULT_FILE: {"if": record({"method": {"const": "end_model"}}),
                              "then": END_VISION_EVAL, "else": MERGED_VISION_EVAL}}


def direction(without: float, with_: float) -> str:
    """The sign of a difference reported without uncertainty (the paper's numbers)."""
    delta = with_ - without
    return "no change" if delta == 0 else "helps" if delta > 0 else "hurts"


def agreement(ours: str, paper: str) -> str:
    """yes / no when our effect is detectable, else 'not detectable' (no change, or too few examples)."""
    if ours not in ("helps", "hurts"):
        return "not detectable"
    return "yes" if ours == paper else "no"


def effect_counts(rows: list[dict], column: str = "ours_effect") -> str:
    """'k of n detectable (h help, t hurt)' over a table's effects (a CSV's rows)."""
    verdicts = [r[column] for r in rows if r.get(column)]
    helps, hurts = verdicts.count("helps"), verdicts.count("hurts")
    return f"{helps + hurts} of {len(verdicts)} effects detectable ({helps} help, {hurts} hurt)"


def paired(metric: str, pairs: list[tuple[dict, dict, str]], scale: float = 1.0) -> dict:
    """uncertainty.paired_effect, with evaluations that scored different examples as one error line."""
    try:
        return paired_effect(metric, pairs, scale=scale)
    except ValueError as error:
        raise SymfusionError(f"cannot pair the evaluations: {error}") from error


def pair_of(data: dict) -> str:
    """The model pair of a merged model's evaluation ('seed1-onto-seed0'), from the folders it merged."""
    anchor, source = (Path(p) for p in (data["merged_models"][0], data["merged_models"][-1]))
    if "-onto-" in source.parent.name:                  # a matched folder: .../matched/<pair>/<matching>
        return source.parent.name
    return f"{source.name}-onto-{anchor.name}"


def pair_of_folder(folder: str) -> str:
    """The model pair of a matched folder (matched/<pair>/<matching>)."""
    path = Path(folder)
    path = path.parent if path.name == "match.json" else path
    return path.parent.name if "-onto-" in path.parent.name else path.name


def merged_evaluations(eval_paths: list[str]) -> dict[tuple[str, str], dict[str, dict]]:
    """(method, matching) -> {pair: eval JSON} of every merged model among the inputs."""
    results = defaultdict(dict)
    for path in eval_paths:
        data = read_json(path)
        if data.get("method") not in (None, "end_model"):
            results[(data["method"], data["matching"])][pair_of(data)] = data
    return results


def evaluations_of(ours: dict, method: str, matching: str, artefact: str) -> dict[str, dict]:
    """The merged evaluations of one (method, matching), or an error naming what the artefact lacks."""
    if (method, matching) not in ours:
        raise SymfusionError(f"{artefact}: no evaluation of a {method} merge under matching {matching!r} among the "
                             "inputs; pass one for every matching its registry entry declares")
    return ours[(method, matching)]


def accuracy_record(data: dict) -> tuple[dict, str]:
    """(per-example record, test set name) of a vision evaluation's first task."""
    result = data["results"][0]
    return result["per_example"], result["task"]


def mean_accuracy(evaluations: dict[str, dict]) -> float:
    return statistics.fmean(100 * data["metrics"]["accuracy"] for data in evaluations.values())


def effect_over_pairs(metric: str, with_: dict[str, tuple[dict, str]], without: dict[str, tuple[dict, str]],
                      scale: float = 1.0) -> dict:
    """metric(with) - metric(without) over the pairs both have, each given as (per-example record, test set name):
    the mean effect with the paired bootstrap interval of the mean (effect, low, high), each pair's own effect,
    interval and verdict (per_pair), the spread of the pairs' effects (spread.over_pairs) and the verdict that holds
    over pairs (verdict)."""
    pairs = sorted(set(with_) & set(without))
    if not pairs:
        raise SymfusionError("no model pair has both evaluations an effect compares; pass both merges of a pair")
    found = paired(metric, [(with_[p][0], without[p][0], with_[p][1]) for p in pairs], scale=scale)
    found["per_pair"] = {p: paired(metric, [(with_[p][0], without[p][0], with_[p][1])], scale=scale) for p in pairs}
    found["spread"] = over_pairs({p: e["effect"] for p, e in found["per_pair"].items()})
    found["verdict"] = verdict_over_pairs(found["spread"], [e["verdict"] for e in found["per_pair"].values()],
                                          lower_is_better=metric in LOWER_IS_BETTER)
    return found


def effect_columns(found: dict, prefix: str) -> dict:
    """CSV columns of an effect: the mean and its bootstrap interval, its spread over pairs, each pair's effect."""
    row = {prefix: found["effect"], f"{prefix}_low": found["low"], f"{prefix}_high": found["high"]}
    row.update(spread_columns(prefix, found["spread"]))
    if len(found["per_pair"]) > 1:
        row.update({f"{prefix}_{pair}": e["effect"] for pair, e in found["per_pair"].items()})
    return row


def accuracy_effect(with_: dict[str, dict], without: dict[str, dict]) -> dict:
    """Mean accuracy difference (points) over the pairs both have, with its paired bootstrap interval, per pair and
    over pairs (effect_over_pairs)."""
    return effect_over_pairs("accuracy", {p: accuracy_record(d) for p, d in with_.items()},
                             {p: accuracy_record(d) for p, d in without.items()}, scale=100.0)


def accuracy_cell(evaluations: dict[str, dict], prefix: str) -> dict:
    """CSV columns of one (method, matching) cell: its mean accuracy (points) over pairs, its spread over pairs
    and each pair's accuracy."""
    values = {p: 100 * d["metrics"]["accuracy"] for p, d in evaluations.items()}
    spread = over_pairs(values)
    row = {prefix: spread["mean"], **spread_columns(prefix, spread)}
    if len(values) > 1:
        row.update({f"{prefix}_{p}": v for p, v in sorted(values.items())})
    return row


def accuracy_interval(evaluations: dict[str, dict]) -> tuple[float, float]:
    """Bootstrap interval of the mean accuracy (points) over pairs: error bars."""
    lows, highs = zip(*(score_interval("accuracy", *accuracy_record(d), scale=100.0) for d in evaluations.values()))
    return statistics.fmean(lows), statistics.fmean(highs)


def end_model_rows(eval_paths: list[str]) -> list[dict]:
    rows = []
    for path in eval_paths:
        data = read_json(path)
        if data.get("method") == "end_model":
            rows.append({"model": Path(data["model"]).name, "accuracy": 100 * data["metrics"]["accuracy"],
                         "loss": data["metrics"]["loss"]})
    return rows
