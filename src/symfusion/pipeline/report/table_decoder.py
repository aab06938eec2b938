"""Table D1 / D2: held-out loss and perplexity of merged decoders per fusion method and matching, each effect vs no matching with its paired interval; mergekit's merge beside symfusion's; the end models and the unigram baseline.

One row per test set and merge (fusion method x declared matching, in the entry's orders), then the end models
and, where the task's data manifest is given, the unigram baseline (a model that ignores context, in the task
tokenizer's tokens). A merge's loss is the mean over model pairs of its next-token loss (nats per token),
perplexity exp of it; its effect is its loss minus the same method's loss without matching, with the 95% interval
of a paired bootstrap over the test blocks (token-weighted; the same resamples for both), "helps" (lower loss) or
"hurts" only when the interval excludes 0. A merge done by mergekit (client mergekit: its own CLI on the folders
symfusion wrote) follows symfusion's merge of the same method and matching, with its loss difference from it and
the largest weight difference its merge stage measured.
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path

from symfusion.errors import SymfusionError
from symfusion.pipeline.report.effects import effect_columns, effect_counts, effect_over_pairs, pair_of
from symfusion.pipeline.report.spread import over_pairs, spread_columns
from symfusion.pipeline.report.registry import Experiment
from symfusion.pipeline.report.results import (NUMBER, RESULT_FILE, STRING, Built, array, csv_text, inputs_list,
                                               markdown_table, method_label, read_csv_rows, read_json, record,
                                               signed_markdown)
from symfusion.pipeline.uncertainty import RESAMPLES

LM_RESULT = record({"task": STRING, "metrics": record({"loss": NUMBER, "perplexity": NUMBER}),
                    "per_example": record({"loss": array(NUMBER, 1), "tokens": array(NUMBER, 1)})})
END_EVAL = record({"method": {"const": "end_model"}, "model": STRING, "results": array(LM_RESULT, 1)})
MERGED_EVAL = record({"method": STRING, "matching": STRING, "merged_models": array(STRING, 2),
                      "results": array(LM_RESULT, 1)}, client=STRING)
TASK_DATA = record({"task": STRING, "kind": {"const": "causal_lm"},
                    "unigram_baseline": record({"test": record({"loss": NUMBER, "perplexity": NUMBER})})})
SHAPES = {RESULT_FILE: {"if": record({"method": {"const": "end_model"}}), "then": END_EVAL,
                        "else": {"if": {"required": ["unigram_baseline"]}, "then": TASK_DATA, "else": MERGED_EVAL}}}
BASELINE = "none"
CLIENT = "symfusion"          # merges done by symfusion itself; another client's rows follow them
OTHER_METHODS_NOTE = ("OT fusion (`ot_acts`, `ot_acts_emd`, `ot_wts`) and barycentric group matching are not in this "
                      "table: both refuse decoder layouts with a one-line error (they align encoders' residual axes "
                      "only).")


def per_task(data: dict) -> dict[str, dict]:
    """task -> its result (metrics, per-block record) in one evaluation."""
    return {result["task"]: result for result in data["results"]}


def read_inputs(paths: list[str], experiment: Experiment) -> tuple[dict, dict, dict]:
    """(merges: (client, method, matching) -> pair -> eval; end models: name -> eval; unigram: task -> baseline)."""
    merges, ends, unigram = defaultdict(dict), {}, {}
    for path in paths:
        data = read_json(path)
        if "unigram_baseline" in data and "method" not in data:
            unigram[data["task"]] = data["unigram_baseline"]["test"]
        elif data["method"] == "end_model":
            ends[Path(data["model"]).name] = data
        else:
            merges[(data.get("client", CLIENT), data["method"], data["matching"])][pair_of(data)] = data
    experiment.check_shown("merged_evals", [m for (c, _, m) in merges if c == CLIENT])
    others = [m for (c, _, m) in merges if c != CLIENT]
    if others:
        experiment.check_shown("mergekit_evals", others)
    return merges, ends, unigram


def mean_loss(evaluations: dict[str, dict], task: str) -> float:
    return statistics.fmean(per_task(data)[task]["metrics"]["loss"] for data in evaluations.values())


def loss_effect(with_: dict[str, dict], without: dict[str, dict], task: str) -> dict:
    """Mean loss difference over the pairs both have on `task`, with its paired bootstrap interval, per pair and over
    pairs (effects.effect_over_pairs)."""
    return effect_over_pairs("loss", {p: (per_task(d)[task]["per_example"], task) for p, d in with_.items()},
                             {p: (per_task(d)[task]["per_example"], task) for p, d in without.items()})


def merge_name(client: str, method: str) -> str:
    return method if client == CLIENT else f"{method}, by {client}"


def merge_row(task: str, client: str, method: str, matching: str, runs: dict, merges: dict) -> dict:
    losses = {pair: per_task(data)[task]["metrics"]["loss"] for pair, data in runs.items()}
    spread = over_pairs(losses)
    row = {"test_set": task, "model": merge_name(client, method), "method": method, "matching": matching,
           "client": client, "loss": spread["mean"], "perplexity": math.exp(spread["mean"]),
           **spread_columns("loss", spread)}
    if len(losses) > 1:
        row.update({f"loss_{pair}": value for pair, value in sorted(losses.items())})
    baseline = merges.get((CLIENT, method, BASELINE))
    if baseline is not None and (client, matching) != (CLIENT, BASELINE):
        found = loss_effect(runs, baseline, task)
        row.update(effect_columns(found, "effect"), ours_effect=found["verdict"])
    own = merges.get((CLIENT, method, matching))
    if client != CLIENT and own is not None:
        shared = {pair: own[pair] for pair in runs if pair in own}         # another client may merge fewer pairs
        if not shared:
            raise SymfusionError(f"the {method} merge by {client} after {matching} shares no model pair with "
                                 "symfusion's own; pass symfusion's merge of the same pair")
        row["vs_symfusion"] = mean_loss(runs, task) - mean_loss(shared, task)
        row["max_weight_difference"] = max(d.get("mergekit", {}).get("max_abs_difference_vs_symfusion", math.nan)
                                           for d in runs.values())
        row["within_float32_rounding"] = all(d.get("mergekit", {}).get("within_float32_rounding_of_symfusion")
                                             for d in runs.values())
    row["pairs"] = len(runs)
    return row


def decoder_rows(paths: list[str], experiment: Experiment) -> list[dict]:
    """Per test set: every merge (methods in the entry's order, matchings in its declared order, another client's
    merge after symfusion's), then the end models, then the unigram baseline."""
    merges, ends, unigram = read_inputs(paths, experiment)
    order = experiment.matchings("merged_evals") + [m for m in experiment.matchings("mergekit_evals")
                                                    if m not in experiment.matchings("merged_evals")]
    clients = [CLIENT] + sorted({c for c, _, _ in merges} - {CLIENT})
    tasks = list(dict.fromkeys(t for runs in merges.values() for data in runs.values() for t in per_task(data)))
    rows = []
    for task in tasks:
        for method in experiment.ordered_methods(m for _, m, _ in merges):
            for matching in order:
                for client in clients:
                    runs = merges.get((client, method, matching))
                    if runs:
                        rows.append(merge_row(task, client, method, matching, runs, merges))
        for name, data in sorted(ends.items()):
            result = per_task(data).get(task)
            if result is not None:
                rows.append({"test_set": task, "model": f"end model {name}", "loss": result["metrics"]["loss"],
                             "perplexity": result["metrics"]["perplexity"]})
        if task in unigram:
            rows.append({"test_set": task, "model": "unigram baseline", "loss": unigram[task]["loss"],
                         "perplexity": unigram[task]["perplexity"]})
    return rows


def nats(x: float) -> str:
    """A loss difference: 3 decimals, or 2 significant digits when it is smaller than that shows (fine-tunes of one
    checkpoint differ by 1e-6 nats)."""
    return f"{x:+.3f}" if x == 0 or abs(x) >= 5e-4 else f"{x:+.1e}"


def shown(row: dict, experiment: Experiment) -> dict:
    """A row as the Markdown table shows it: labels, 3 decimals, the effect with its interval in one cell."""
    effect = "" if row.get("effect") is None else (f"{nats(row['effect'])} [{nats(row['effect_low'])}, "
                                                    f"{nats(row['effect_high'])}]")
    if effect and row.get("effect_pairs", 1) > 1:
        effect += f" pairs [{nats(row['effect_pairs_low'])}, {nats(row['effect_pairs_high'])}]"
    loss = f"{row['loss']:.3f}" + (f" +- {row['loss_se']:.3f} ({row['loss_pairs']})"
                                   if row.get("loss_pairs", 1) > 1 else "")
    versus = "" if row.get("vs_symfusion") is None else (f"loss {row['vs_symfusion']:+.1e}, weights max "
                                                          f"{row['max_weight_difference']:.1e}")
    method = row.get("method")
    return {"test set": row["test_set"],
            "merge": (f"{method_label(method)}" + (f" (by {row['client']})" if row["client"] != CLIENT else "")
                      if method else row["model"]),
            "matching": experiment.label(row["matching"]) if method else "-",
            "loss": loss, "perplexity": f"{row['perplexity']:.1f}",
            "effect vs w/o match (nats) [95%]": effect, "verdict": row.get("ours_effect", ""),
            "vs symfusion's merge": versus}


def build(paths: list[str], experiment: Experiment) -> Built:
    rows = decoder_rows(paths, experiment)
    heading = experiment.title.split("(", 1)[-1].rstrip(")") if "(" in experiment.title else experiment.title
    text = f"# {heading}\n\n" + markdown_table([shown(r, experiment) for r in rows]) + "\n"
    pairs = max((r.get("pairs", 0) for r in rows), default=0)
    text += (f"Loss: mean next-token cross-entropy on the held-out test blocks (nats per token), mean over the model "
             f"pairs that have the merge (up to {pairs}; over several, +- its standard error, the count in parentheses); "
             "perplexity = exp(mean loss). Effect: the loss with the matching minus the same method's loss without "
             "matching, with the 95% interval of a paired bootstrap over the test blocks (token-weighted, "
             f"{RESAMPLES} seeded resamples) and, over several pairs, the 95% t interval over pairs (`pairs [..]`); it "
             "helps (lower loss) or hurts only when these intervals and every pair's own exclude 0 on that side, else "
             "no detectable change.\n")
    matchings = [m for m in experiment.matchings("merged_evals") if m != BASELINE]
    text += "\nMatchings: " + "; ".join(f"`{m}` ({experiment.label(m)})" for m in matchings) + ".\n"
    mergekit = [r for r in rows if r.get("client") not in (None, CLIENT)]
    if mergekit:
        agree = all(r["within_float32_rounding"] for r in mergekit)
        text += ("\nmergekit: the simple merge done by mergekit's own CLI (`mergekit-yaml`, `linear`, weights 0.5 / 0.5, "
                 "float32, from the folders symfusion wrote: absolute paths, offline) and evaluated as symfusion's "
                 f"merges are. Its weights {'agree' if agree else 'do NOT agree'} with symfusion's simple merge of the "
                 f"same folders to float32 rounding (largest difference "
                 f"{max(r['max_weight_difference'] for r in mergekit):.1e}); its loss differs by at most "
                 f"{max(abs(r['vs_symfusion']) for r in mergekit):.1e} nats.\n")
    if any(r["model"] == "unigram baseline" for r in rows):
        text += "\nUnigram baseline: a model that ignores context (the train blocks' token counts), in the task's tokens.\n"
    per_pair = [{"test set": r["test_set"], "merge": r["model"], "matching": experiment.label(r["matching"]),
                 **{k[len("loss_"):]: f"{v:.3f}" for k, v in r.items() if k.startswith("loss_") and "-onto-" in k},
                 "sd": f"{r['loss_sd']:.3f}", "se": f"{r['loss_se']:.3f}"}
                for r in rows if r.get("loss_pairs", 1) > 1]
    if per_pair:
        text += "\nPer model pair (loss, nats per token; sd and se over the pairs):\n\n" + markdown_table(per_pair)
    text += f"\n{OTHER_METHODS_NOTE}\n\n" + inputs_list(paths)
    return Built(rows, {".csv": csv_text(rows), ".md": signed_markdown(text)})


def summary(csv_path: Path, experiment: Experiment) -> list[str]:
    """Per test set: the end models, the unmatched simple merge, the effects' count, the best merge, mergekit."""
    rows = read_csv_rows(csv_path)
    short = experiment.caption.split(":", 1)[0]
    lines = []
    for task in dict.fromkeys(r["test_set"] for r in rows):
        here = [r for r in rows if r["test_set"] == task]
        merges = [r for r in here if r["method"]]
        ends = ", ".join(f"{r['model'][len('end model '):]} {float(r['perplexity']):.1f}" for r in here
                         if r["model"].startswith("end model "))
        plain = next((r for r in merges if r["method"] == "simple" and r["matching"] == BASELINE
                      and r["client"] == CLIENT), None)
        best = min(merges, key=lambda r: float(r["loss"]))
        line = (f"{short} ({task}): perplexity of the end models {ends}"
                + (f", of their simple average without matching {float(plain['perplexity']):.1f}" if plain else "")
                + f"; effects of matching on the loss: {effect_counts(merges)}"
                + f"; lowest loss: {best['method']} after {best['matching']} (perplexity {float(best['perplexity']):.1f})")
        unigram = next((r for r in here if r["model"] == "unigram baseline"), None)
        if unigram:
            line += f"; unigram baseline {float(unigram['perplexity']):.1f}"
        kit = [r for r in merges if r["client"] != CLIENT]
        if kit:
            line += ("; mergekit's simple merge equals symfusion's to float32 rounding" if all(
                r["within_float32_rounding"] == "True" for r in kit) else "; mergekit's simple merge DIFFERS from "
                "symfusion's beyond float32 rounding") + f" (loss difference {float(kit[0]['vs_symfusion']):+.1e})"
        lines.append(line + ".")
    return lines
