"""Table 2: merged ViT accuracy per fusion method and declared matching, each matching's effect with its paired interval and over model pairs, ours beside the paper's.

The columns follow the registry entry: one accuracy column per matching its inputs declare (named by the
paper's column where `paper_columns` gives one: none, no_rescale, full), the headline effect (`effect`: of
full matching vs none) judged against the paper's direction, and for every other declared matching its own
effect vs the same baseline with its interval, and (a matching beyond the paper's columns) its effect vs
the paper's full matching too. With several model pairs every cell is the mean over the pairs that have it, with
its spread over pairs and each pair's value (spread.py), and an effect's verdict is the one that holds over pairs.
"""
from __future__ import annotations

from pathlib import Path

from symfusion.pipeline.report.effects import (VISION_EVALS, accuracy_cell, accuracy_effect, agreement, direction,
                                               effect_columns, effect_counts, end_model_rows, evaluations_of,
                                               merged_evaluations)
from symfusion.pipeline.report.registry import Experiment
from symfusion.pipeline.report.results import (Built, csv_text, inputs_list, markdown_table, read_csv_rows,
                                               read_paper_table, signed_markdown)
from symfusion.pipeline.uncertainty import RESAMPLES

SHAPES = VISION_EVALS
INPUT_KIND = "merged_evals"


def columns(experiment: Experiment) -> dict[str, str]:
    """matching -> its column name: the paper's variant where the entry maps it, else the matching's name."""
    return {m: experiment.paper_columns.get(m, m) for m in experiment.matchings(INPUT_KIND)}


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
        row, spreads = {"method": method}, {}
        for matching, column in named.items():
            cell = accuracy_cell(evaluations_of(ours, method, matching, experiment.name), f"ours_{column}")
            row[f"ours_{column}"] = cell.pop(f"ours_{column}")
            spreads.update(cell)                       # each matching's spread over pairs follows the accuracies
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
        row.update(spreads)
        rows.append(row)
    return rows


def cell(row: dict, prefix: str) -> str:
    """One accuracy cell of the Markdown table: the value, or the mean +- its standard error over n pairs."""
    value = row.get(prefix)
    if value is None:
        return ""
    pairs = row.get(f"{prefix}_pairs", 1)
    return f"{value:.2f}" if pairs < 2 else f"{value:.2f} +- {row[f'{prefix}_se']:.2f} ({pairs})"


def effect_cell(row: dict, prefix: str, verdict: str) -> str:
    """An effect: the mean and its bootstrap interval, over several pairs also their t interval; the verdict."""
    if row.get(prefix) is None:
        return ""
    text = f"{row[prefix]:+.2f} [{row[f'{prefix}_low']:+.2f}, {row[f'{prefix}_high']:+.2f}]"
    if row.get(f"{prefix}_pairs", 1) > 1:
        text += f" pairs [{row[f'{prefix}_pairs_low']:+.2f}, {row[f'{prefix}_pairs_high']:+.2f}]"
    return f"{text} {row[verdict]}"


def shown(row: dict, experiment: Experiment, named: dict, beyond: list[str]) -> dict:
    """A row as the Markdown table shows it: each matching's accuracy, the effects with their intervals, the paper's."""
    out = {"method": row["method"]}
    out.update({experiment.label(m): cell(row, f"ours_{c}") for m, c in named.items()})
    out["effect [95%]"] = effect_cell(row, "effect", "ours_effect")
    for m in beyond:
        out[f"{experiment.label(m)}: effect [95%]"] = effect_cell(row, f"effect_{m}", f"ours_effect_{m}")
    out.update({f"paper {c}": row.get(f"paper_{c}") for c in experiment.paper_columns.values()})
    out.update({"paper effect": row["paper_effect"], "agrees": row["effect_agrees"]})
    return out


def per_pair_rows(rows: list[dict], named: dict, experiment: Experiment) -> list[dict]:
    """Every (method, matching) cell over several pairs: each pair's accuracy, the mean, sd and se."""
    found = []
    for row in rows:
        for matching, column in named.items():
            prefix = f"ours_{column}"
            if row.get(f"{prefix}_pairs", 1) > 1:
                pairs = sorted(k[len(prefix) + 1:] for k in row if k.startswith(prefix + "_") and "-onto-" in k)
                found.append({"method": row["method"], "matching": experiment.label(matching),
                              **{p: f"{row[f'{prefix}_{p}']:.2f}" for p in pairs},
                              "mean": f"{row[prefix]:.2f}", "sd": f"{row[f'{prefix}_sd']:.2f}",
                              "se": f"{row[f'{prefix}_se']:.2f}"})
    return found


def build(eval_paths: list[str], experiment: Experiment) -> Built:
    rows = table2_rows(eval_paths, experiment)
    named = columns(experiment)
    of, vs = (named[experiment.effect[k]] for k in ("of", "vs"))
    beyond = [m for m in named if m not in experiment.paper_columns and m != experiment.effect["vs"]]
    text = "# Table 2: merged model test accuracy (%), ours beside the paper's (CIFAR-10 ViTs)\n\n"
    text += markdown_table([shown(r, experiment, named, beyond) for r in rows]) + "\n"
    text += (f"Effect of matching: {'full matching' if of == 'full' else of} minus "
             f"{'w/o match' if vs == 'none' else vs} (points), mean over the model pairs, with the 95% "
             f"interval of a paired bootstrap over the test images ({RESAMPLES} resamples, seeded). A cell over several "
             "model pairs (its count in parentheses) is their mean +- its standard error, and its effect also gives the "
             "95% t interval over pairs (`pairs [..]`): the effect helps or hurts only when both intervals and every "
             "pair's own interval exclude 0 on that side; with one pair, when its interval does. The paper reports "
             "single runs: its direction is the sign of its difference. `agrees` = not detectable when our effect "
             "is not.\n")
    if beyond:
        text += ("\nBeyond the paper: " + ", ".join(f"`{m}` ({experiment.label(m)})" for m in beyond) +
                 f": each one's effect vs {vs} (`effect_<matching>` in the CSV) and vs the paper's {of} matching "
                 f"(`effect_<matching>_vs_{experiment.effect['of']}`), with the same intervals.\n")
    spread = per_pair_rows(rows, named, experiment)
    if spread:
        text += "\nPer model pair (accuracy %; sd and se over the pairs):\n\n" + markdown_table(spread)
    ends = end_model_rows(eval_paths)
    if ends:
        text += "\nEnd models (test accuracy %, loss):\n\n" + markdown_table(ends)
    text += "\n" + inputs_list(eval_paths)
    return Built(rows, {".csv": csv_text(rows), ".md": signed_markdown(text)})


def summary(csv_path: Path, experiment: Experiment) -> list[str]:
    """The paper's headline effect with its agreement, then each matching beyond the paper's columns: every method's
    accuracy and effect vs the baseline over the pairs it has, and the verdict that holds over them."""
    rows = read_csv_rows(csv_path)
    agree = sum(r["effect_agrees"] == "yes" for r in rows)
    disagree = sum(r["effect_agrees"] == "no" for r in rows)
    named = columns(experiment)
    of, vs = (named[experiment.effect[k]] for k in ("of", "vs"))
    pairs = max((int(r["effect_pairs"]) for r in rows if r.get("effect_pairs")), default=1)
    lines = [f"Table 2 (vision): {of} matching vs {vs} over {pairs} model pair{'s' if pairs > 1 else ''}, 95% paired "
             f"bootstrap intervals: {effect_counts(rows)}; of the detectable ones, {agree} agree with the paper's "
             f"direction and {disagree} do not."]
    for matching in [m for m in named if m not in experiment.paper_columns and m != experiment.effect["vs"]]:
        cells = []
        for r in rows:
            count = int(r.get(f"effect_{matching}_pairs") or 1)
            spread = f" +- {float(r[f'ours_{matching}_se']):.2f} se" if count > 1 else ""
            cells.append(f"{r['method']} {float(r[f'ours_{matching}']):.2f}{spread} ({count} pair{'s' * (count > 1)}, "
                         f"{float(r[f'effect_{matching}']):+.2f} {r[f'ours_effect_{matching}']})")
        lines.append(f"Table 2, beyond the paper, `{matching}` vs {vs}: " + "; ".join(cells) + ".")
    return lines
