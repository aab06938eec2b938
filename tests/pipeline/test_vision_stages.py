"""The vision stages through their Hydra commands: train -> match -> merge -> evaluate -> barrier -> report."""
import csv
import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.utils.data import DataLoader

from symfusion.io.modelio import load_model
from symfusion.pipeline import cli
from symfusion.pipeline.command import compose
from symfusion.pipeline.stages.evaluate import run_evaluate
from symfusion.pipeline.report.artefacts import run_report
from symfusion.pipeline.report.registry import experiment
from symfusion.pipeline.report.table2 import table2_rows
from symfusion.pipeline.tasks import make_task

TINY_TRAIN = ["task=digits", "task.train.epochs=3", "model=vit_smoke",
              "model.hidden_size=16", "model.intermediate_size=24", "threads=1"]


def config(name: str, overrides: list[str]):
    return compose(name, overrides)


def run(name: str, command, overrides: list[str]):
    command(config(name, overrides))


def fails_with_one_line(capsys, name, command, overrides, expected: str):
    with pytest.raises(SystemExit) as exit_info:
        run(name, command, overrides)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and expected in err, err


@pytest.fixture(scope="module")
def end_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("vision")
    for seed in (0, 1):
        run("train", cli.train_command, TINY_TRAIN + [f"seed={seed}", f"output={root / f'seed{seed}'}"])
    return root


def test_pipeline_stages_write_their_files(end_models, tmp_path):
    root = end_models
    run("match", cli.match_command, [f"source={root / 'seed1'}", f"anchor={root / 'seed0'}",
                                     f"output={tmp_path / 'matched'}", "matching=rotation"])
    evals = []
    for method in ("simple", "regmean"):
        merged = tmp_path / "merged" / method
        run("merge", cli.merge_command, ["task=digits", f"fusion={method}", f"output={merged}",
                                         f"models=[{root / 'seed0'},{tmp_path / 'matched'}]"])
        assert json.loads((merged / "merge.json").read_text())["matching"] == "rotation"
        evals.append(tmp_path / f"{method}.json")
        run("evaluate", cli.evaluate_command, ["task=digits", f"model_dir={merged}", f"output={evals[-1]}"])
        report = json.loads(evals[-1].read_text())
        assert report["method"] == method
        # the accuracy is the merged model's, recomputed here from its saved folder on the task's test split
        correct = predictions_correct(merged)
        assert report["results"][0]["per_example"]["correct"] == correct
        assert report["metrics"]["accuracy"] == sum(correct) / len(correct)
    run("barrier", cli.barrier_command, ["task=digits", "task.limit={train: 1000}", f"anchor={root / 'seed0'}",
                                         f"source={tmp_path / 'matched'}", "points=3", "examples=100",
                                         f"output={tmp_path / 'barrier.json'}"])
    barrier = json.loads((tmp_path / "barrier.json").read_text())
    assert [p["alpha"] for p in barrier["path"]] == [0.0, 0.5, 1.0] and barrier["matching"] == "rotation"
    assert {p["n"] for p in barrier["path"]} == {100}
    losses = [p["loss"] for p in barrier["path"]]
    for point in barrier["path"]:          # each point's loss and accuracy are its saved examples' means
        assert point["loss"] == pytest.approx(math.fsum(point["per_example"]["loss"]) / 100, rel=1e-12)
        assert point["accuracy"] == sum(point["per_example"]["correct"]) / 100
    assert barrier["barrier"] == max(losses) - min(losses)                    # the paper's range along the path
    assert barrier["barrier_linear"] == pytest.approx(max(y - (a * losses[-1] + (1 - a) * losses[0])
                                                          for a, y in zip((0.0, 0.5, 1.0), losses)), abs=1e-12)


def predictions_correct(model_dir) -> list[int]:
    """1/0 per example of the digits test split: the model's argmax is the label (the model run here, directly)."""
    cfg = config("evaluate", ["task=digits"])
    task = make_task(cfg.task, cfg.get("profile"))
    model = load_model(model_dir)
    correct = []
    with torch.no_grad():
        for batch in DataLoader(task.split("test"), batch_size=64, shuffle=False):
            correct += (model(pixel_values=batch["pixel_values"]).logits.argmax(-1) == batch["labels"]).int().tolist()
    return correct


def test_merging_several_methods_in_one_process_equals_merge_then_evaluate(end_models, tmp_path):
    """methods=[..] eval_dir=DIR: the same metrics as a merged folder evaluated by symfusion-evaluate."""
    root = end_models
    models = f"models=[{root / 'seed0'},{root / 'seed1'}]"
    run("merge", cli.merge_command, ["task=digits", "methods=[simple,fisher,ot_wts]", models,
                                     "method_options={fisher: {num_batches: 2}}", f"eval_dir={tmp_path / 'eval'}"])
    for method in ("simple", "fisher", "ot_wts"):
        fused = json.loads((tmp_path / "eval" / f"{method}.json").read_text())
        options = ["fusion.num_batches=2"] if method == "fisher" else []
        run("merge", cli.merge_command, ["task=digits", f"fusion={method}", models, f"output={tmp_path / method}"] + options)
        run("evaluate", cli.evaluate_command, ["task=digits", f"model_dir={tmp_path / method}",
                                               f"output={tmp_path / f'{method}.json'}"])
        separate = json.loads((tmp_path / f"{method}.json").read_text())
        assert fused["method"] == method and fused["matching"] == "none" and fused["merge_seconds"] > 0
        assert fused["metrics"]["accuracy"] == separate["metrics"]["accuracy"]
        assert fused["metrics"]["loss"] == pytest.approx(separate["metrics"]["loss"], rel=1e-6)
    assert json.loads((tmp_path / "eval" / "fisher.json").read_text())["fusion"]["num_batches"] == 2
    assert not list(tmp_path.glob("eval/.*"))         # no temp file left


def test_bad_method_lists_get_one_line_errors_and_no_output(end_models, tmp_path, capsys):
    models = f"models=[{end_models / 'seed0'},{end_models / 'seed1'}]"
    out = f"eval_dir={tmp_path / 'eval'}"
    fails_with_one_line(capsys, "merge", cli.merge_command, ["task=digits", "methods=[simple,average]", models, out],
                        "unknown fusion method 'average'")
    fails_with_one_line(capsys, "merge", cli.merge_command,
                        ["task=digits", "methods=[simple]", models, out, "method_options={simple: {alpha: 0.5}}"],
                        "has no option alpha")
    fails_with_one_line(capsys, "merge", cli.merge_command, ["task=digits", "methods=[simple,simple]", models, out],
                        "distinct")
    fails_with_one_line(capsys, "merge", cli.merge_command, ["task=digits", "methods=[simple]", models],
                        "eval_dir=DIR is required")
    fails_with_one_line(capsys, "merge", cli.merge_command,
                        ["task=digits", "methods=[simple]", models, out, f"output={tmp_path / 'm'}"], "not both")
    assert not (tmp_path / "eval").exists() and not (tmp_path / "m").exists()


def test_merging_a_model_with_itself_changes_nothing(end_models, tmp_path):
    model = end_models / "seed0"
    for method in ("simple", "fisher", "regmean"):
        merged = tmp_path / method
        run("merge", cli.merge_command, ["task=digits", f"fusion={method}", f"output={merged}",
                                         f"models=[{model},{model}]"])
        original, fused = load_file(str(model / "model.safetensors")), load_file(str(merged / "model.safetensors"))
        assert all(torch.allclose(original[k], fused[k], atol=1e-5) for k in original), method


def test_evaluate_reports_end_models_as_such(end_models, tmp_path):
    task = make_task(config("evaluate", ["task=digits"]).task)
    report = run_evaluate(str(end_models / "seed0"), [task], str(tmp_path / "e.json"))
    assert report["method"] == "end_model" and report["metrics"]["n"] == round(1797 * 0.2)
    assert report["metrics"]["accuracy"] > 0.3        # three short epochs on digits: well above chance (0.1)


def test_bad_inputs_get_one_line_errors_and_no_output(end_models, tmp_path, capsys):
    good = end_models / "seed0"
    out = tmp_path / "out"
    fails_with_one_line(capsys, "merge", cli.merge_command,
                        ["task=digits", "fusion=simple", f"output={out}", f"models=[{good},{tmp_path / 'nope'}]"],
                        "does not exist")
    fails_with_one_line(capsys, "merge", cli.merge_command,
                        ["task=digits", "fusion=simple", f"output={out}", f"models=[{good}]"], "must be a list of 2+ items")
    # a model with NaN weights
    nan_dir = tmp_path / "nan"
    nan_dir.mkdir()
    (nan_dir / "config.json").write_text((good / "config.json").read_text())
    weights = load_file(str(good / "model.safetensors"))
    first = next(iter(weights))
    weights[first] = torch.full_like(weights[first], float("nan"))
    save_file(weights, str(nan_dir / "model.safetensors"))
    fails_with_one_line(capsys, "merge", cli.merge_command,
                        ["task=digits", "fusion=simple", f"output={out}", f"models=[{good},{nan_dir}]"], "NaN")
    # a model of another architecture
    other = tmp_path / "other"
    run("train", cli.train_command, TINY_TRAIN + ["model.hidden_size=8", "seed=0", f"output={other}"])
    capsys.readouterr()                              # drop the training log
    fails_with_one_line(capsys, "merge", cli.merge_command,
                        ["task=digits", "fusion=simple", f"output={out}", f"models=[{good},{other}]"], "hidden_size")
    # same body, another label count: heads cannot be averaged
    import transformers
    config = transformers.AutoConfig.from_pretrained(str(good))
    config.num_labels = 3
    transformers.ViTForImageClassification(config).save_pretrained(str(tmp_path / "three"))
    fails_with_one_line(capsys, "merge", cli.merge_command,
                        ["task=digits", "fusion=simple", f"output={out}", f"models=[{good},{tmp_path / 'three'}]"],
                        "different task heads")
    fails_with_one_line(capsys, "evaluate", cli.evaluate_command,
                        ["task=digits", f"model_dir={tmp_path / 'nope'}", f"output={tmp_path / 'e.json'}"], "no such model")
    fails_with_one_line(capsys, "report", cli.report_command,
                        ["artefact=table9", f"inputs=[{tmp_path / 'e.json'}]", f"output={tmp_path / 't.csv'}"],
                        "unknown artefact")
    assert not out.exists() and not (tmp_path / "e.json").exists() and not (tmp_path / "t.csv").exists()


def test_unknown_fusion_method_is_refused(capsys, tmp_path):
    with pytest.raises(Exception) as error:      # Hydra refuses an unknown config group option
        config("merge", ["fusion=average"])
    assert "average" in str(error.value)


def merged_evaluation_files(folder, accuracies: dict[str, float]) -> list[str]:
    """Evaluation JSONs of 'simple' merges of one pair, one per matching, with the given accuracies."""
    paths = []
    for matching, accuracy in accuracies.items():
        correct = [1] * int(1000 * accuracy) + [0] * (1000 - int(1000 * accuracy))
        source = "models/seed1" if matching == "none" else f"matched/seed1-onto-seed0/{matching}"
        path = folder / f"{matching}.json"
        path.write_text(json.dumps({
            "method": "simple", "matching": matching, "metrics": {"accuracy": accuracy},
            "merged_models": ["models/seed0", source],
            "results": [{"task": "digits", "per_example": {"correct": correct, "loss": [0.0] * 1000}}]}))
        paths.append(str(path))
    return paths


def test_table2_puts_the_papers_numbers_beside_ours(tmp_path):
    accuracies = {"none": 0.5, "rotation_no_rescale": 0.6, "rotation": 0.62, "full_symmetry": 0.7,
                  "full_symmetry_learned": 0.75}
    (row,) = table2_rows(merged_evaluation_files(tmp_path, accuracies), experiment("table2"))
    assert row["ours_none"] == pytest.approx(50.0) and row["ours_full"] == pytest.approx(62.0)
    assert row["paper_none"] == pytest.approx(7.60) and row["paper_full"] == pytest.approx(10.19)
    assert row["effect"] == pytest.approx(12.0) and row["effect_low"] < 12.0 < row["effect_high"]
    assert row["effect_low"] > 0 and row["pairs"] == 1
    assert row["ours_effect"] == "helps" and row["paper_effect"] == "helps" and row["effect_agrees"] == "yes"
    assert row["ours_full_symmetry"] == pytest.approx(70.0) and row["effect_full_symmetry"] == pytest.approx(20.0)
    assert row["effect_full_symmetry_vs_rotation"] == pytest.approx(8.0)
    assert row["ours_effect_full_symmetry_vs_rotation"] == "helps"


def test_fig3_data_gives_each_matchings_effect_and_leaves_it_empty_for_the_unmatched_bar(tmp_path):
    accuracies = {"none": 0.5, "ffn_only": 0.5, "attn_only": 0.55, "rotation_no_rescale": 0.6, "rotation": 0.62,
                  "full_symmetry": 0.7, "full_symmetry_learned": 0.75}
    rows = run_report("fig3_ablation", merged_evaluation_files(tmp_path, accuracies), str(tmp_path / "fig3.png"))
    with open(tmp_path / "fig3.csv") as handle:
        written = list(csv.DictReader(handle))
    assert [r["variant"] for r in written] == list(accuracies) and len(rows) == len(accuracies)
    assert written[0]["effect"] == "" and written[0]["verdict"] == ""
    by_variant = {r["variant"]: r for r in written}
    assert float(by_variant["rotation"]["effect"]) == pytest.approx(12.0)
    assert by_variant["rotation"]["verdict"] == "helps"
    assert by_variant["ffn_only"]["verdict"] == "no detectable change"
    assert float(by_variant["ffn_only"]["effect_low"]) <= 0 <= float(by_variant["ffn_only"]["effect_high"])
