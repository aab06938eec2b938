"""Language-track artefacts: Table 1 (merges, ours beside the paper's), Table 3 (seconds) and Figure 6 (layers)."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from statistics import mean

from symfusion.pipeline.report.figures import plt
from symfusion.pipeline.report.results import (markdown_table, percent, read_json, read_paper_table, save_figure,
                                      write_csv, write_text_atomic)
from symfusion.pipeline.report.tables import agreement, direction
from symfusion.pipeline.uncertainty import RESAMPLES, paired_effect

# Table 1 settings, named as in conf/paper/table1.csv.
SETTING_OF_KIND = {"text_classification": "emotion", "token_classification": "ner"}
PAPER_MODELS = ("roberta-base", "deberta-v3-large")


def eval_setting(path: str, data: dict) -> str:
    """emotion / ner (pairwise in-domain) or ner-conll (grouped, out-of-domain) for one eval JSON."""
    if "/eval_group/" in path:
        return "ner-conll"
    return SETTING_OF_KIND[data["results"][0]["kind"]]


def model_name(path: str) -> str:
    """The language model's name: the folder after lang/ in results/<profile>/lang/<model>/..."""
    parts = Path(path).parts
    return parts[parts.index("lang") + 1]


def merge_id(path: str) -> str:
    """Which merge an eval JSON belongs to: the pair ('b-onto-a') of a pairwise merge, or 'group'."""
    parts = Path(path).parts
    return "group" if "eval_group" in parts else parts[-3]


def table1_rows(eval_paths: list[str]) -> list[dict]:
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
             for r in read_paper_table("table1")}
    rows = []
    for (model, setting, method, matched) in sorted(k for k in evals if not k[3]):
        without, with_ = evals[(model, setting, method, False)], evals.get((model, setting, method, True), {})
        shared = sorted(set(without) & set(with_))
        row = {"model": model, "setting": setting, "method": method,
               "ours_unmatched": mean(100 * r["metrics"]["score"] for r in without.values()),
               "ours_matched": mean(100 * r["metrics"]["score"] for r in with_.values()) if with_ else float("nan")}
        if shared:
            metric = without[shared[0]]["metric"]
            found = paired_effect(metric, [(with_[k]["per_example"], without[k]["per_example"], k[1]) for k in shared],
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


def write_table1(eval_paths: list[str], output_csv: str | Path) -> list[dict]:
    rows = table1_rows(eval_paths)
    write_csv(rows, output_csv)
    text = ("# Table 1: language merges, ours beside the paper's (score x 100: macro-F1 for emotion-like, "
            "span micro-F1 for NER; NER tags are silver in the mini profile)\n\n" + markdown_table(rows) +
            f"\nEffect of matching: matched minus unmatched (points), mean over the merges, with the 95% interval of "
            f"a paired bootstrap over each task's test examples ({RESAMPLES} resamples, seeded); helps or hurts only "
            "when the interval excludes 0. Agreement is judged against each of the paper's models separately "
            "(`agrees_<model>`; not detectable when our interval spans 0). `merges` counts (pair, evaluated task) "
            "scores averaged. Pairwise merges use each evaluated task's own head; grouped (ner-conll) merges fuse "
            "the heads.\n\nInputs:\n" + "".join(f"- {p}\n" for p in eval_paths))
    write_text_atomic(Path(output_csv).with_suffix(".md"), text)
    return rows


# ---------------------------------------------------------------- Table 3

def family_of_folder(folder: Path) -> str:
    """minilm / vit / roberta_base ...: the language model's name, or 'vit' for vision results."""
    return model_name(str(folder)) if "lang" in folder.parts else "vit"


def timing_rows(paths: list[str]) -> dict[tuple[str, str], list[float]]:
    """(stage, family) -> seconds, from train.json, match.json and merged models' eval JSON."""
    seconds = defaultdict(list)
    for path in map(Path, paths):
        if (path / "train.json").is_file():
            seconds[("finetune", family_of_folder(path))].append(json.loads((path / "train.json").read_text())["seconds"])
        elif (path / "match.json").is_file():
            seconds[("matching", family_of_folder(path))].append(json.loads((path / "match.json").read_text())["seconds"])
        elif path.suffix == ".json":
            data = json.loads(path.read_text())
            if data.get("merge_seconds") is not None and data.get("matching") != "none":
                seconds[(f"merge_{data['method']}", family_of_folder(path))].append(data["merge_seconds"])
    return seconds


def write_table3(paths: list[str], output_csv: str | Path) -> list[dict]:
    """Mean seconds per stage and family (fine-tuning per dataset, matching and merging per pair)."""
    seconds = timing_rows(paths)
    families = sorted({f for _, f in seconds})
    paper = {r["stage"]: r for r in read_paper_table("table3")}
    rows = []
    for stage in ("finetune", "matching", "merge_simple", "merge_fisher", "merge_regmean"):
        row = {"stage": stage}
        row.update({f"ours_{f}": mean(seconds[(stage, f)]) if seconds[(stage, f)] else None for f in families})
        row.update({f"ours_{f}_n": len(seconds[(stage, f)]) for f in families})
        row.update({f"paper_{k}": (float(v) if v else None) for k, v in paper.get(stage, {}).items() if k != "stage"})
        rows.append(row)
    write_csv(rows, output_csv)
    text = ("# Table 3: mean seconds per stage (ours on this machine, 2 CPU cores; the paper on an A100 80GB)\n\n"
            + markdown_table(rows) + "\nOurs: fine-tuning per dataset (vit: training from scratch, which the paper "
            "does not report), matching and merging per model pair (matched pairs). `_n` = runs averaged.\n\nInputs:\n"
            + "".join(f"- {p}\n" for p in paths))
    write_text_atomic(Path(output_csv).with_suffix(".md"), text)
    return rows


# ---------------------------------------------------------------- Figure 6

def fig6_layers(sweep_paths: list[str], png: str | Path) -> list[dict]:
    """(a) eval-loss change vs the single attention layer matched, (b) vs the number of trailing layers matched.

    Plotted as the change from the unmatched loss (below zero: matching helps), each with the 95% interval
    of a paired bootstrap over the test examples; the CSV has the absolute losses, the changes with their
    intervals and verdicts, and the task's score in points (x100, as Table 1).
    """
    rows = []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=False)
    for path in sweep_paths:
        data = read_json(path)
        model = model_name(path)
        for task in dict.fromkeys(r["task"] for r in data["rows"]):
            task_rows = [r for r in data["rows"] if r["task"] == task]
            base = next(r for r in task_rows if r["setting"] == "none")
            task_csv = [{"model": model, "task": task, "setting": r["setting"], "k": r["k"], "loss": r["loss"],
                         "score": percent(r.get("score")), **loss_change(r, base, task)} for r in task_rows]
            for ax, setting, label in ((axes[0], "single", "index of the single attention layer matched"),
                                       (axes[1], "tail", "number of trailing attention layers matched")):
                chosen = [r for r in task_csv if r["setting"] == setting]
                changes = [r["loss"] - base["loss"] for r in chosen]
                errors = None
                if all("change_low" in r for r in chosen):
                    errors = [[c - r["change_low"] for c, r in zip(changes, chosen)],
                              [r["change_high"] - c for c, r in zip(changes, chosen)]]
                ax.errorbar([r["k"] for r in chosen], changes, yerr=errors, marker="o", capsize=2,
                            label=f"{task} ({model}; unmatched loss {base['loss']:.4f})")
                ax.set_xlabel(label)
            rows += task_csv
    axes[0].set_title("(a) single-layer matching")
    axes[1].set_title("(b) tail-layers matching")
    for ax in axes:
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_ylabel("eval loss change vs no matching (95% CI)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, title="task (model; loss without matching)", title_fontsize=8)
    fig.suptitle("Figure 6: evaluation loss when matching a subset of attention layers (simple averaging)")
    save_figure(fig, png)
    write_csv(rows, Path(png).with_suffix(".csv"))
    return rows


def loss_change(row: dict, base: dict, task: str) -> dict:
    """A sweep row's loss change vs the unmatched merge with its paired bootstrap interval (none for the
    unmatched row itself, or for a sweep written without per-example losses)."""
    if row is base or "loss" not in row.get("per_example", {}) or "loss" not in base.get("per_example", {}):
        return {}
    found = paired_effect("loss", [(row["per_example"], base["per_example"], task)])
    return {"loss_change": row["loss"] - base["loss"], "change_low": found["low"], "change_high": found["high"],
            "change_verdict": found["verdict"]}


# ---------------------------------------------------------------- beyond the paper: multi-model and joint matching

def multimodel_model(path: str, data: dict) -> str:
    """The row label of a multi-model input: the language model's name, or the family ("vit") of the end models."""
    return model_name(path) if "lang" in Path(path).parts else data["family"]


def multimodel_rows(paths: list[str]) -> list[dict]:
    """Rows per model: anchor vs barycenter (distances; for language groups the OOD score of the simple
    merge), and joint vs sequential gains per pair."""
    rows = []
    by_model = defaultdict(dict)
    for path in paths:
        data = read_json(path)
        role = ("report" if "methods" in data else "barycenter" if "/eval_barycenter/" in path else "anchor")
        by_model[multimodel_model(path, data)][role] = data
    for model, parts in sorted(by_model.items()):
        report = parts["report"]
        for method in ("anchor", "barycenter"):
            summary, merged = report["methods"][method], parts.get(method)
            rows.append({"model": model, "comparison": "group matching", "variant": method, "k": report["k"],
                         "matching": report["matching"], "sum_pairwise_distance": summary["sum_pairwise_distance"],
                         "distance_before": report["sum_pairwise_distance_before"],
                         "iterations": summary["iterations"], "seconds": summary["seconds"],
                         "merged_ood_score": 100 * merged["metrics"]["score"] if merged else None})
        for pair in report["joint_vs_sequential"]:
            rows.append({"model": model, "comparison": "joint vs sequential",
                         "variant": f"pair {pair['source']}->{pair['anchor']}", "k": 2, "matching": "rotation(_joint)",
                         "sum_pairwise_distance": pair["distance_rotation_joint"],
                         "distance_before": pair["distance_rotation"], "iterations": None, "seconds": None,
                         "merged_ood_score": None, "relative_gain": pair["relative_gain"]})
    return rows


def write_multimodel(paths: list[str], output_csv: str | Path) -> list[dict]:
    rows = multimodel_rows(paths)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    write_csv([{c: row.get(c) for c in columns} for row in rows], output_csv)
    text = ("# Beyond the paper: multi-model and joint matching\n\n" + markdown_table(rows, columns) +
            "\n`group matching`: the models (vit: the two end ViTs, trained independently; a language model: "
            "its NER models, fine-tuned from one checkpoint) matched onto the first (anchor) or jointly to their "
            "barycentre (generalized Procrustes), sum of pairwise Euclidean distances after matching "
            "(`distance_before`: unmatched), and the out-of-domain score (x100) of the NER models' simple "
            "average. `joint vs sequential`: "
            "distance of one pair after the paper's sequential rotation-then-rescaling (`distance_before`) and "
            "after alternating both to convergence (`sum_pairwise_distance`).\n\nInputs:\n"
            + "".join(f"- {p}\n" for p in paths))
    write_text_atomic(Path(output_csv).with_suffix(".md"), text)
    return rows
