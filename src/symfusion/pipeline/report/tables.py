"""Tables of the report: our numbers beside the paper's, with each effect of matching and its 95% interval.

Our effect of matching (full matching minus w/o match) comes with a paired bootstrap interval over the
test examples (uncertainty.py); it "helps" or "hurts" only when the interval excludes 0, else it is "no
detectable change". With several model pairs (seeds) a profile also reports the spread over pairs. The
paper gives one number per cell and no interval: its direction is the sign of its difference.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from symfusion.pipeline.report.results import (METHOD_LABELS, markdown_table, read_json, read_paper_table, write_csv,
                                      write_text_atomic)
from symfusion.pipeline.uncertainty import RESAMPLES, paired_effect, score_interval


def direction(without: float, with_: float) -> str:
    """The sign of a difference reported without uncertainty (the paper's numbers)."""
    delta = with_ - without
    return "no change" if delta == 0 else "helps" if delta > 0 else "hurts"


def agreement(ours: str, paper: str) -> str:
    """yes / no when our effect is detectable, else 'not detectable'."""
    if ours == "no detectable change":
        return "not detectable"
    return "yes" if ours == paper else "no"


def pair_of(data: dict) -> str:
    """The model pair of a merged model's evaluation ('seed1-onto-seed0'), from the folders it merged."""
    anchor, source = (Path(p) for p in (data["merged_models"][0], data["merged_models"][-1]))
    if "-onto-" in source.parent.name:                  # a matched folder: .../matched/<pair>/<matching>
        return source.parent.name
    return f"{source.name}-onto-{anchor.name}"


def merged_evaluations(eval_paths: list[str]) -> dict[tuple[str, str], dict[str, dict]]:
    """(method, matching) -> {pair: eval JSON} of every merged model among the inputs."""
    results = defaultdict(dict)
    for path in eval_paths:
        data = read_json(path)
        if data.get("method") not in (None, "end_model"):
            results[(data["method"], data["matching"])][pair_of(data)] = data
    return results


def accuracy_record(data: dict) -> tuple[dict, str]:
    """(per-example record, test set name) of a vision evaluation's first task."""
    result = data["results"][0]
    return result["per_example"], result["task"]


def mean_accuracy(evaluations: dict[str, dict]) -> float:
    return statistics.fmean(100 * data["metrics"]["accuracy"] for data in evaluations.values())


def accuracy_effect(with_: dict[str, dict], without: dict[str, dict]) -> dict:
    """Mean accuracy difference (points) over the pairs both have, with its paired bootstrap interval."""
    pairs = sorted(set(with_) & set(without))
    records = [(accuracy_record(with_[p])[0], accuracy_record(without[p])[0], accuracy_record(with_[p])[1])
               for p in pairs]
    found = paired_effect("accuracy", records, scale=100.0)
    if len(pairs) > 1:
        found["spread"] = statistics.stdev(100 * (with_[p]["metrics"]["accuracy"] - without[p]["metrics"]["accuracy"])
                                           for p in pairs)
    return found


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


def table2_rows(eval_paths: list[str]) -> list[dict]:
    """Table 2: six fusion methods x {none, no_rescale, full}, the effect of full matching with its interval,
    ours beside the paper's."""
    ours = merged_evaluations(eval_paths)
    paper = {(r["method"], r["variant"]): float(r["accuracy"]) for r in read_paper_table("table2")}
    variants = {"none": "none", "no_rescale": "rotation_no_rescale", "full": "rotation"}
    rows = []
    for method in METHOD_LABELS:
        if (method, "none") not in ours:
            continue
        row = {"method": method}
        for variant, matching in variants.items():
            row[f"ours_{variant}"] = mean_accuracy(ours[(method, matching)])
        found = accuracy_effect(ours[(method, "rotation")], ours[(method, "none")])
        row.update({"effect": found["effect"], "effect_low": found["low"], "effect_high": found["high"]})
        if "spread" in found:
            row["effect_spread_over_pairs"] = found["spread"]
        row["ours_effect"] = found["verdict"]
        for variant in variants:
            row[f"paper_{variant}"] = paper.get((method, variant))
        row["paper_effect"] = direction(row["paper_none"], row["paper_full"]) if row["paper_none"] is not None else ""
        row["effect_agrees"] = agreement(row["ours_effect"], row["paper_effect"])
        row["pairs"] = len(ours[(method, "none")])
        rows.append(row)
    return rows


def write_table2(eval_paths: list[str], output_csv: str | Path) -> list[dict]:
    rows = table2_rows(eval_paths)
    write_csv(rows, output_csv)
    md = Path(output_csv).with_suffix(".md")
    text = "# Table 2: merged model test accuracy (%), ours beside the paper's (CIFAR-10 ViTs)\n\n"
    text += markdown_table(rows) + "\n"
    text += (f"Effect of matching: full matching minus w/o match (points), mean over the model pairs, with the 95% "
             f"interval of a paired bootstrap over the test images ({RESAMPLES} resamples, seeded); it helps or "
             "hurts only when the interval excludes 0. The paper reports single runs: its direction is the sign of "
             "its difference. `effect_agrees` = not detectable when our interval spans 0.\n")
    ends = end_model_rows(eval_paths)
    if ends:
        text += "\nEnd models (test accuracy %, loss):\n\n" + markdown_table(ends)
    text += "\nInputs:\n" + "".join(f"- {p}\n" for p in eval_paths)
    write_text_atomic(md, text)
    return rows
