"""Tables of the report: our numbers beside the paper's, with the direction of matching's effect."""
from __future__ import annotations

from pathlib import Path

from symfusion.report.results import (METHOD_LABELS, markdown_table, read_json, read_paper_table, write_csv,
                                      write_text_atomic)

# A change of matching's effect smaller than this (in accuracy points) counts as "no change".
EFFECT_TOLERANCE = 0.1


def effect(without: float, with_: float, tolerance: float = EFFECT_TOLERANCE) -> str:
    """helps / hurts / no change: the direction of the effect of matching."""
    delta = with_ - without
    if abs(delta) <= tolerance:
        return "no change"
    return "helps" if delta > 0 else "hurts"


def merged_accuracies(eval_paths: list[str]) -> dict[tuple[str, str], dict]:
    """(method, matching) -> eval JSON of every merged model among the inputs."""
    results = {}
    for path in eval_paths:
        data = read_json(path)
        if data.get("method") not in (None, "end_model"):
            results[(data["method"], data["matching"])] = data
    return results


def end_model_rows(eval_paths: list[str]) -> list[dict]:
    rows = []
    for path in eval_paths:
        data = read_json(path)
        if data.get("method") == "end_model":
            rows.append({"model": Path(data["model"]).name, "accuracy": 100 * data["metrics"]["accuracy"],
                         "loss": data["metrics"]["loss"]})
    return rows


def table2_rows(eval_paths: list[str]) -> list[dict]:
    """Table 2: six fusion methods x {none, no_rescale, full}, ours beside the paper's."""
    ours = merged_accuracies(eval_paths)
    paper = {(r["method"], r["variant"]): float(r["accuracy"]) for r in read_paper_table("table2")}
    variants = {"none": "none", "no_rescale": "rotation_no_rescale", "full": "rotation"}
    rows = []
    for method in METHOD_LABELS:
        if (method, "none") not in ours:
            continue
        row = {"method": method}
        for variant, matching in variants.items():
            row[f"ours_{variant}"] = 100 * ours[(method, matching)]["metrics"]["accuracy"]
            row[f"paper_{variant}"] = paper.get((method, variant))
        row["ours_effect"] = effect(row["ours_none"], row["ours_full"])
        row["paper_effect"] = effect(row["paper_none"], row["paper_full"]) if row["paper_none"] is not None else ""
        row["effect_agrees"] = row["ours_effect"] == row["paper_effect"]
        rows.append(row)
    return rows


def write_table2(eval_paths: list[str], output_csv: str | Path) -> list[dict]:
    rows = table2_rows(eval_paths)
    write_csv(rows, output_csv)
    md = Path(output_csv).with_suffix(".md")
    text = "# Table 2: merged model test accuracy (%), ours beside the paper's (CIFAR-10 ViTs)\n\n"
    text += markdown_table(rows) + "\n"
    text += f"Effect of matching: full matching vs w/o match; |change| <= {EFFECT_TOLERANCE} points = no change.\n"
    ends = end_model_rows(eval_paths)
    if ends:
        text += "\nEnd models (test accuracy %, loss):\n\n" + markdown_table(ends)
    text += "\nInputs:\n" + "".join(f"- {p}\n" for p in eval_paths)
    write_text_atomic(md, text)
    return rows
