"""Beyond the paper: anchor vs barycentric matching of a group of models, and joint vs sequential rotation+rescaling, per model.

Rows per model (vit: the end ViTs; a language model: its NER models): the sum of pairwise distances after
each group matching (and, for a language group, the out-of-domain score of the simple merge of the
anchor- and the barycentre-matched models), then joint vs sequential distances of every pair.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from symfusion.errors import SymfusionError
from symfusion.pipeline.report.registry import Experiment
from symfusion.pipeline.report.results import (INTEGER, NUMBER, RESULT_FILE, STRING, Built, array, csv_text,
                                               inputs_list, markdown_table, model_name, read_csv_rows, read_json,
                                               record, signed_markdown)

GROUP = record({"sum_pairwise_distance": NUMBER, "iterations": INTEGER, "seconds": NUMBER})
REPORT = record({
    "family": STRING, "k": INTEGER, "matching": STRING, "sum_pairwise_distance_before": NUMBER,
    "methods": record({"anchor": GROUP, "barycenter": GROUP}),
    "joint_vs_sequential": array(record({"source": {}, "anchor": {}, "distance_rotation": NUMBER,
                                         "distance_rotation_joint": NUMBER, "relative_gain": NUMBER}))})
MERGED = record({"metrics": record({"score": NUMBER})})
SHAPES = {RESULT_FILE: {"if": {"required": ["methods"]}, "then": REPORT, "else": MERGED}}


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
        by_model[multimodel_model(path, data) if role == "report" else model_name(path)][role] = data
    for model, parts in sorted(by_model.items()):
        if "report" not in parts:
            raise SymfusionError(f"multimodel: the merges of {model} come without its group matching report "
                                 "(multimodel.json); pass it too")
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


def build(paths: list[str], experiment: Experiment) -> Built:
    rows = multimodel_rows(paths)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    text = ("# Beyond the paper: multi-model and joint matching\n\n" + markdown_table(rows, columns) +
            "\n`group matching`: the models (vit: the two end ViTs, trained independently; a language model: "
            "its NER models, fine-tuned from one checkpoint) matched onto the first (anchor) or jointly to their "
            "barycentre (generalized Procrustes), sum of pairwise Euclidean distances after matching "
            "(`distance_before`: unmatched), and the out-of-domain score (x100) of the NER models' simple "
            "average. `joint vs sequential`: "
            "distance of one pair after the paper's sequential rotation-then-rescaling (`distance_before`) and "
            "after alternating both to convergence (`sum_pairwise_distance`).\n\n" + inputs_list(paths))
    return Built(rows, {".csv": csv_text([{c: row.get(c) for c in columns} for row in rows]),
                        ".md": signed_markdown(text)})


def summary(csv_path: Path, experiment: Experiment) -> list[str]:
    return multimodel_summary(read_csv_rows(csv_path))


def multimodel_summary(rows: list[dict]) -> list[str]:
    """One line per model of multimodel.csv: barycentric vs anchor matching, and the joint-matching gain."""
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        cells = {r["variant"]: r for r in mine if r["comparison"] == "group matching"}
        if not {"anchor", "barycenter"} <= set(cells):
            continue
        a, b = cells["anchor"], cells["barycenter"]
        line = (f"Beyond the paper ({model}, k={a['k']}): barycentric matching gives a sum of pairwise distances "
                f"{float(b['sum_pairwise_distance']):.4f} vs {float(a['sum_pairwise_distance']):.4f} with anchor "
                f"matching (unmatched {float(a['distance_before']):.4f})")
        if a.get("merged_ood_score") not in (None, ""):
            line += f"; OOD score of the simple merge {b['merged_ood_score']} vs {a['merged_ood_score']}"
        gains = [float(r["relative_gain"]) for r in mine if r["comparison"] == "joint vs sequential"]
        if gains:
            line += f"; joint rotation+rescaling is closer than sequential by at most {max(gains):.2e} (relative)"
        lines.append(line + ".")
    return lines
