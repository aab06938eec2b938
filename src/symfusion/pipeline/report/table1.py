"""Table 1: language merges per (model, setting, method), unmatched and matched, with the effect's paired interval, beside the paper's two models.

Settings as in conf/paper/table1.csv: emotion and ner (pairwise in-domain merges) and ner-conll (the
grouped NER merge, evaluated out of domain). Scores x100; the effect of matching comes with the 95%
interval of a paired bootstrap over each task's test examples.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from statistics import mean

from symfusion.pipeline.report.effects import agreement, direction, effect_counts, paired
from symfusion.pipeline.report.registry import Experiment
from symfusion.pipeline.report.results import (NUMBER, PER_EXAMPLE, RESULT_FILE, STRING, Built, array, csv_text,
                                               inputs_list, markdown_table, model_name, read_csv_rows, read_json,
                                               read_paper_table, record, signed_markdown)
from symfusion.pipeline.uncertainty import RESAMPLES

# Table 1 settings, named as in conf/paper/table1.csv.
SETTING_OF_KIND = {"text_classification": "emotion", "token_classification": "ner"}
PAPER_MODELS = ("roberta-base", "deberta-v3-large")
SHAPES = {RESULT_FILE: record({
    "method": STRING, "matching": STRING, "task": STRING,
    "results": array(record({"task": STRING, "kind": {"enum": list(SETTING_OF_KIND)}, "metric": STRING,
                             "metrics": record({"score": NUMBER}), "per_example": PER_EXAMPLE}), 1)})}


def eval_setting(path: str, data: dict) -> str:
    """emotion / ner (pairwise in-domain) or ner-conll (grouped, out-of-domain) for one eval JSON."""
    if "/eval_group/" in path:
        return "ner-conll"
    return SETTING_OF_KIND[data["results"][0]["kind"]]


def merge_id(path: str) -> str:
    """Which merge an eval JSON belongs to: the pair ('b-onto-a') of a pairwise merge, or 'group'."""
    parts = Path(path).parts
    return "group" if "eval_group" in parts else parts[-3]


def table1_rows(eval_paths: list[str], experiment: Experiment) -> list[dict]:
    """Mean score x100 per (model, setting, method), unmatched and matched, over merges and evaluated tasks;
    the effect of matching with its paired bootstrap interval; the paper's two models beside."""
    evals, ends = defaultdict(dict), defaultdict(list)
    for path in eval_paths:
        data = read_json(path)
        if data["method"] == "end_model":
            for result in data["results"]:
                setting = "ner-conll" if result["task"] != data["task"] else SETTING_OF_KIND[result["kind"]]
                ends[(model_name(path), setting)].append(100 * result["metrics"]["score"])
            continue
        key = (model_name(path), eval_setting(path, data), data["method"], data["matching"] != "none")
        for result in data["results"]:
            evals[key][(merge_id(path), result["task"])] = result
    paper = {(r["setting"], r["model"], r["method"], r["matched"] == "true"): float(r["score"])
             for r in read_paper_table(experiment.paper)} if experiment.paper else {}
    rows = []
    for (model, setting, method, matched) in sorted(k for k in evals if not k[3]):
        without, with_ = evals[(model, setting, method, False)], evals.get((model, setting, method, True), {})
        shared = sorted(set(without) & set(with_))
        row = {"model": model, "setting": setting, "method": method,
               "ours_unmatched": mean(100 * r["metrics"]["score"] for r in without.values()),
               "ours_matched": mean(100 * r["metrics"]["score"] for r in with_.values()) if with_ else float("nan")}
        if shared:
            metric = without[shared[0]]["metric"]
            found = paired(metric, [(with_[k]["per_example"], without[k]["per_example"], k[1]) for k in shared],
                           scale=100.0)
            row.update({"effect": found["effect"], "effect_low": found["low"], "effect_high": found["high"],
                        "ours_effect": found["verdict"]})
        else:
            row.update({"effect": None, "effect_low": None, "effect_high": None, "ours_effect": ""})
        row["end_models_mean"] = mean(ends[(model, setting)]) if ends[(model, setting)] else None
        row["merges"] = len(without)
        for paper_model in PAPER_MODELS:
            p0, p1 = paper.get((setting, paper_model, method, False)), paper.get((setting, paper_model, method, True))
            row[f"paper_{paper_model}_unmatched"], row[f"paper_{paper_model}_matched"] = p0, p1
            row[f"paper_{paper_model}_effect"] = direction(p0, p1) if p0 is not None and p1 is not None else ""
            row[f"agrees_{paper_model}"] = agreement(row["ours_effect"], row[f"paper_{paper_model}_effect"])
        rows.append(row)
    return rows


def build(eval_paths: list[str], experiment: Experiment) -> Built:
    rows = table1_rows(eval_paths, experiment)
    text = ("# Table 1: language merges, ours beside the paper's (score x 100: macro-F1 for emotion-like, "
            "span micro-F1 for NER; NER tags are silver in the mini profile)\n\n" + markdown_table(rows) +
            f"\nEffect of matching: matched minus unmatched (points), mean over the merges, with the 95% interval of "
            f"a paired bootstrap over each task's test examples ({RESAMPLES} resamples, seeded); helps or hurts only "
            "when the interval excludes 0. Agreement is judged against each of the paper's models separately "
            "(`agrees_<model>`; not detectable when our interval spans 0). `merges` counts (pair, evaluated task) "
            "scores averaged. Pairwise merges use each evaluated task's own head; grouped (ner-conll) merges fuse "
            "the heads.\n\n" + inputs_list(eval_paths))
    return Built(rows, {".csv": csv_text(rows), ".md": signed_markdown(text)})


def summary(csv_path: Path, experiment: Experiment) -> list[str]:
    rows = read_csv_rows(csv_path)
    per_model = "; ".join(
        f"vs {m}: {sum(r[f'agrees_{m}'] == 'yes' for r in rows)} agree, {sum(r[f'agrees_{m}'] == 'no' for r in rows)} "
        "disagree" for m in PAPER_MODELS)
    return [f"Table 1 (language): matched vs unmatched, 95% paired bootstrap intervals: {effect_counts(rows)}; "
            f"{per_model}."]
