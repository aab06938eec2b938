"""Table 1 aggregation, Table 3 timings and the audit report's anomaly flags, on hand-made result files."""
import json

import pytest

from symfusion.pipeline.report.artefacts import run_report
from symfusion.pipeline.report.audit import paper_anomalies
from symfusion.pipeline.report.registry import experiment
from symfusion.pipeline.report.table1 import table1_rows


def record(kind, score, n=400):
    """A per-example record whose metric is about `score` (labels right for that share of the examples)."""
    right = int(n * score)
    if kind == "token_classification":
        return {"tp": [1] * right + [0] * (n - right), "predicted": [1] * n, "gold": [1] * n}
    reference = [i % 3 for i in range(n)]
    return {"reference": reference, "prediction": reference[:right] + [(r + 1) % 3 for r in reference[right:]]}


def eval_file(root, rel, method, matching, results, task=None):
    path = root / "results" / "mini" / "lang" / "minilm" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    metric = {"text_classification": "macro_f1", "token_classification": "span_f1"}
    data = {"method": method, "matching": matching, "task": task or results[0][0],
            "results": [{"task": t, "kind": k, "metric": metric[k], "metrics": {"score": s},
                         "per_example": record(k, s)} for t, k, s in results]}
    if method != "end_model":
        data["merge_seconds"] = 2.0
    path.write_text(json.dumps(data))
    return str(path)


def test_table1_averages_every_pair_and_task_and_puts_the_paper_beside(tmp_path):
    c = "text_classification"
    paths = [
        eval_file(tmp_path, "eval/b-onto-a/none/simple.json", "simple", "none", [("a", c, 0.40), ("b", c, 0.50)]),
        eval_file(tmp_path, "eval/b-onto-a/attn_only_no_rescale/simple.json", "simple", "attn_only_no_rescale",
                  [("a", c, 0.60), ("b", c, 0.70)]),
        eval_file(tmp_path, "eval/end/a.json", "end_model", "none", [("a", c, 0.90)]),
        eval_file(tmp_path, "eval_group/ner/none/simple.json", "simple", "none",
                  [("ood", "token_classification", 0.20)]),
        eval_file(tmp_path, "eval_group/ner/attn_only_no_rescale/simple.json", "simple", "attn_only_no_rescale",
                  [("ood", "token_classification", 0.20)]),
    ]
    rows = {(r["setting"], r["method"]): r for r in table1_rows(paths, experiment("table1"))}
    emotion = rows[("emotion", "simple")]
    assert emotion["ours_unmatched"] == pytest.approx(45.0) and emotion["ours_matched"] == pytest.approx(65.0)
    assert emotion["merges"] == 2 and emotion["end_models_mean"] == pytest.approx(90.0)
    assert emotion["paper_roberta-base_unmatched"] == pytest.approx(35.87) and emotion["ours_effect"] == "helps"
    assert 0 < emotion["effect_low"] < emotion["effect"] < emotion["effect_high"]
    # agreement is judged against each of the paper's models on its own (the paper's direction: its sign)
    assert emotion["paper_roberta-base_effect"] == "no change" and emotion["agrees_roberta-base"] == "no"
    assert emotion["paper_deberta-v3-large_effect"] == "no change" and emotion["agrees_deberta-v3-large"] == "no"
    ood = rows[("ner-conll", "simple")]
    assert ood["ours_effect"] == "no detectable change" and ood["effect_low"] <= 0 <= ood["effect_high"]
    assert ood["paper_roberta-base_effect"] == "helps" and ood["paper_deberta-v3-large_effect"] == "helps"
    assert ood["agrees_roberta-base"] == "not detectable" == ood["agrees_deberta-v3-large"]


def test_table3_means_seconds_per_stage_and_family(tmp_path):
    model = tmp_path / "results" / "mini" / "lang" / "minilm" / "models" / "a"
    model.mkdir(parents=True)
    (model / "train.json").write_text(json.dumps({"seconds": 30.0}))
    matched = tmp_path / "results" / "mini" / "matched" / "x"
    matched.mkdir(parents=True)
    (matched / "match.json").write_text(json.dumps({"seconds": 0.5}))
    merged = eval_file(tmp_path, "eval/b-onto-a/attn_only_no_rescale/fisher.json", "fisher", "attn_only_no_rescale",
                       [("a", "text_classification", 0.5)])
    rows = {r["stage"]: r for r in run_report("table3", [str(model), str(matched), merged], str(tmp_path / "table3.csv"))}
    assert rows["finetune"]["ours_minilm"] == 30.0 and rows["matching"]["ours_vit"] == 0.5
    assert rows["merge_fisher"]["ours_minilm"] == 2.0 and rows["merge_fisher"]["paper_roberta-base"] == 69.57
    assert (tmp_path / "table3.md").read_text().startswith("# Table 3")


def test_the_papers_identical_simple_and_regmean_rows_are_flagged():
    notes = " ".join(paper_anomalies())
    assert "RegMean equals Simple exactly" in notes and "ner-conll/roberta-base" in notes
    assert "emotion/roberta-base" in notes          # its unmatched Simple and RegMean rows are both 35.87
