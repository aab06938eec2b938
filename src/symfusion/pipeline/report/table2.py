"""Table 2: merged ViT accuracy per fusion method and declared matching, each matching's effect with its paired interval, ours beside the paper's.

The columns follow the registry entry: one accuracy column per matching its inputs declare (named by the
paper's column where `paper_columns` gives one: none, no_rescale, full), the headline effect (`effect`: of
full matching vs none) judged against the paper's direction, and for every other declared matching its own
effect vs the same baseline with its interval, and (a matching beyond the paper's columns) its effect vs
the paper's full matching too.
"""
from __future__ import annotations

from pathlib import Path

from symfusion.pipeline.report.effects import (VISION_EVALS, accuracy_effect, agreement, direction, effect_counts,
                                               end_model_rows, evaluations_of, mean_accuracy, merged_evaluations)
from symfusion.pipeline.report.registry import Experiment
from symfusion.pipeline.report.results import (Built, csv_text, inputs_list, markdown_table, read_csv_rows,
                                               read_paper_table, signed_markdown)
from symfusion.pipeline.uncertainty import RESAMPLES

SHAPES = VISION_EVALS
INPUT_KIND = "merged_evals"


def columns(experiment: Experiment) -> dict[str, str]:
    """matching -> its column name: the paper's variant where the entry maps it, else the matching's name."""
    return {m: experiment.paper_columns.get(m, m) for m in experiment.matchings(INPUT_KIND)}


def effect_columns(found: dict, prefix: str) -> dict:
    row = {prefix: found["effect"], f"{prefix}_low": found["low"], f"{prefix}_high": found["high"]}
    if "spread" in found:
        row[f"{prefix}_spread_over_pairs"] = found["spread"]
    return row


def table2_rows(eval_paths: list[str], experiment: Experiment) -> list[dict]:
    """One row per fusion method (the entry's order): its accuracy under each declared matching, the headline
    effect with its interval, every other matching's effect vs the baseline, the paper's numbers beside."""
    ours = merged_evaluations(eval_paths)
    experiment.check_shown("merged_evals", [matching for _, matching in ours])
    paper = {(r["method"], r["variant"]): float(r["accuracy"]) for r in read_paper_table(experiment.paper)} \
        if experiment.paper else {}
    named = columns(experiment)
    of, vs = experiment.effect["of"], experiment.effect["vs"]
    others = [m for m in named if m not in experiment.paper_columns and m != vs]
    rows = []
    for method in experiment.ordered_methods(m for m, matching in ours if matching == vs):
        row = {"method": method}
        for matching, column in named.items():
            row[f"ours_{column}"] = mean_accuracy(evaluations_of(ours, method, matching, experiment.name))
        baseline = ours[(method, vs)]
        found = accuracy_effect(ours[(method, of)], baseline)
        row.update(effect_columns(found, "effect"))
        row["ours_effect"] = found["verdict"]
        for matching in others:
            extra = accuracy_effect(ours[(method, matching)], baseline)
            row.update(effect_columns(extra, f"effect_{matching}"))
            row[f"ours_effect_{matching}"] = extra["verdict"]
            if matching != of:                                 # beyond the paper: also vs the paper's matching
                beyond = accuracy_effect(ours[(method, matching)], ours[(method, of)])
                row.update(effect_columns(beyond, f"effect_{matching}_vs_{of}"))
                row[f"ours_effect_{matching}_vs_{of}"] = beyond["verdict"]
        for column in experiment.paper_columns.values():
            row[f"paper_{column}"] = paper.get((method, column))
        p0, p1 = row.get(f"paper_{named[vs]}"), row.get(f"paper_{named[of]}")
        row["paper_effect"] = direction(p0, p1) if p0 is not None and p1 is not None else ""
        row["effect_agrees"] = agreement(row["ours_effect"], row["paper_effect"])
        row["pairs"] = len(baseline)
        rows.append(row)
    return rows


def build(eval_paths: list[str], experiment: Experiment) -> Built:
    rows = table2_rows(eval_paths, experiment)
    named = columns(experiment)
    of, vs = (named[experiment.effect[k]] for k in ("of", "vs"))
    text = "# Table 2: merged model test accuracy (%), ours beside the paper's (CIFAR-10 ViTs)\n\n"
    text += markdown_table(rows) + "\n"
    text += (f"Effect of matching: {'full matching' if of == 'full' else of} minus "
             f"{'w/o match' if vs == 'none' else vs} (points), mean over the model pairs, with the 95% "
             f"interval of a paired bootstrap over the test images ({RESAMPLES} resamples, seeded); it helps or "
             "hurts only when the interval excludes 0. The paper reports single runs: its direction is the sign of "
             "its difference. `effect_agrees` = not detectable when our interval spans 0.\n")
    beyond = [m for m in named if m not in experiment.paper_columns and m != experiment.effect["vs"]]
    if beyond:
        text += ("\nBeyond the paper: " + ", ".join(f"`{m}` ({experiment.label(m)})" for m in beyond) +
                 f": each one's effect vs {vs} (`effect_<matching>`) and vs the paper's {of} matching "
                 f"(`effect_<matching>_vs_{experiment.effect['of']}`), with the same intervals.\n")
    ends = end_model_rows(eval_paths)
    if ends:
        text += "\nEnd models (test accuracy %, loss):\n\n" + markdown_table(ends)
    text += "\n" + inputs_list(eval_paths)
    return Built(rows, {".csv": csv_text(rows), ".md": signed_markdown(text)})


def summary(csv_path: Path, experiment: Experiment) -> list[str]:
    rows = read_csv_rows(csv_path)
    agree = sum(r["effect_agrees"] == "yes" for r in rows)
    disagree = sum(r["effect_agrees"] == "no" for r in rows)
    named = columns(experiment)
    of, vs = (named[experiment.effect[k]] for k in ("of", "vs"))
    return [f"Table 2 (vision): {of} matching vs {vs}, 95% paired bootstrap intervals: "
            f"{effect_counts(rows)}; of the detectable ones, {agree} agree with the paper's direction and "
            f"{disagree} do not."]

