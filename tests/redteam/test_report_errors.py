"""symfusion-report, red team: inputs of the wrong shape, outputs that are not its own, failures over earlier outputs.
Each is one `error:` line and exit code 2, with nothing written and no earlier output swapped out."""
import json
import subprocess
import sys

import pytest

from symfusion.pipeline import cli
from symfusion.pipeline.report.registry import experiment
from symfusion.pipeline.report.results import signed_markdown
from test_report_figures import barrier_result
from test_vision_stages import merged_evaluation_files

# one accuracy per matching Table 2's registry entry declares (the paper's three, then those beyond it)
ACCURACIES = {m: 0.5 + 0.02 * i for i, m in enumerate(experiment("table2").matchings("merged_evals"))}


def snapshot(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def report(capsys, *args: str) -> tuple[int, list[str]]:
    """(exit code, stderr lines) of symfusion-report ARGS, in this process."""
    try:
        code = cli.command_line("report", cli.report_command, list(args))
    except SystemExit as stop:
        code = stop.code
    return code, capsys.readouterr().err.strip().splitlines()


def fails(capsys, folder, expected: str, *args: str) -> None:
    before = snapshot(folder)
    code, lines = report(capsys, *args)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], lines
    assert snapshot(folder) == before


def inputs(paths) -> str:
    return "inputs=[" + ",".join(str(p) for p in paths) + "]"


def rewrite(path, change) -> str:
    data = json.loads(open(path).read())
    change(data)
    open(path, "w").write(json.dumps(data))
    return str(path)


@pytest.fixture
def evals(tmp_path):
    folder = tmp_path / "evals"
    folder.mkdir()
    return merged_evaluation_files(folder, ACCURACIES)


SHAPE_MISTAKES = [
    (lambda d: d["metrics"].pop("accuracy"), "'accuracy' is a required property at metrics"),
    (lambda d: d.__setitem__("results", []), "at results"),
    (lambda d: d["results"][0]["per_example"].__setitem__("correct", "yes"), "at results[0].per_example.correct"),
    (lambda d: d.__setitem__("merged_models", ["models/seed0"]), "at merged_models"),
    (lambda d: d.pop("matching"), "'matching' is a required property"),
]


@pytest.mark.parametrize("change,expected", SHAPE_MISTAKES, ids=[m[1] for m in SHAPE_MISTAKES])
def test_an_input_of_the_wrong_shape_is_one_line_naming_file_and_place(capsys, tmp_path, evals, change, expected):
    broken = rewrite(evals[1], change)
    out = tmp_path / "out"
    fails(capsys, tmp_path, expected, "artefact=table2", inputs(evals), f"output={out / 'table2.csv'}")
    code, lines = report(capsys, "artefact=table2", inputs(evals), f"output={out / 'table2.csv'}")
    assert broken in lines[0] and not out.exists()


def test_every_writer_checks_its_inputs_shape_before_writing(capsys, tmp_path):
    """One malformed input for every writer: the JSON that writer reads, with a key it needs missing."""
    match = tmp_path / "lang" / "minilm" / "matched" / "b-onto-a" / "rotation"
    match.mkdir(parents=True)
    (match / "match.json").write_text(json.dumps({"matching": "rotation", "distance_after_by_module": {}}))
    model = tmp_path / "lang" / "minilm" / "models" / "a"
    model.mkdir(parents=True)
    (model / "train.json").write_text(json.dumps({"epochs": 3}))
    sweep = tmp_path / "lang" / "minilm" / "layers.json"
    sweep.write_text(json.dumps({"rows": [{"task": "t", "setting": "half", "k": 0, "loss": 0.5}]}))
    text_eval = tmp_path / "lang" / "minilm" / "eval" / "b-onto-a" / "none" / "simple.json"
    text_eval.parent.mkdir(parents=True)
    text_eval.write_text(json.dumps({"method": "simple", "matching": "none", "task": "a", "results": [
        {"task": "a", "kind": "regression", "metric": "mcc", "metrics": {"score": 0.5}, "per_example": {"x": [1]}}]}))
    group = tmp_path / "lang" / "minilm" / "multimodel.json"
    group.write_text(json.dumps({"family": "bert", "k": 3, "matching": "rotation", "sum_pairwise_distance_before": 1.0,
                                 "methods": {"anchor": {"sum_pairwise_distance": 1.0, "iterations": 1, "seconds": 0.1}},
                                 "joint_vs_sequential": []}))
    path, _ = barrier_result(tmp_path, "none", tmp_path / "models" / "seed1", bump=1.0, seed=0)
    barrier = rewrite(path, lambda d: d["path"][1].pop("per_example"))
    lm_eval = tmp_path / "decoder" / "lm_english" / "eval" / "b-onto-a" / "none" / "simple.json"
    lm_eval.parent.mkdir(parents=True)
    lm_eval.write_text(json.dumps({"method": "simple", "matching": "none", "merged_models": ["a", "b"], "results": [
        {"task": "lm_english", "metrics": {"loss": 5.0, "perplexity": 148.4}, "per_example": {"loss": [5.0]}}]}))
    out = tmp_path / "out"
    for artefact, given, expected in (("fig4_distance", match, "'distance_after' is a required property"),
                                      ("table3", model, "'seconds' is a required property"),
                                      ("fig6_layers", sweep, "'half' is not one of"),
                                      ("table1", text_eval, "'regression' is not one of"),
                                      ("multimodel", group, "'barycenter' is a required property at methods"),
                                      ("fig5_barrier", barrier, "'per_example' is a required property at path[1]"),
                                      ("figD_decoder_barrier", barrier, "'per_example' is a required property at path[1]"),
                                      ("table_decoder", lm_eval, "'tokens' is a required property")):
        suffix = ".png" if artefact.startswith("fig") else ".csv"
        fails(capsys, tmp_path, expected, f"artefact={artefact}", inputs([given]), f"output={out / artefact}{suffix}")
    assert not out.exists()


def test_inputs_an_artefact_cannot_use_are_refused(capsys, tmp_path, evals):
    match = tmp_path / "matched"
    match.mkdir()
    (match / "match.json").write_text(json.dumps({"matching": "rotation"}))
    out = tmp_path / "out" / "table2.csv"
    fails(capsys, tmp_path, "table2 reads a JSON result, not", "artefact=table2", inputs([*evals, match]), f"output={out}")
    fails(capsys, tmp_path, "under matching 'rotation_no_rescale'", "artefact=table2",
          inputs([p for p in evals if "no_rescale" not in p]), f"output={out}")
    fails(capsys, tmp_path, "fig3_ablation: no evaluation of a simple merge under matching 'ffn_only'",
          "artefact=fig3_ablation", inputs(evals), f"output={out.with_name('fig3.png')}")
    sweep = tmp_path / "lang" / "minilm" / "layers.json"
    sweep.parent.mkdir(parents=True)
    sweep.write_text(json.dumps({"rows": [{"task": "t", "setting": "single", "k": 0, "loss": 0.5}]}))
    fails(capsys, tmp_path, "no unmatched (setting none) row", "artefact=fig6_layers", inputs([sweep]),
          f"output={out.with_name('fig6.png')}")


def test_a_failure_leaves_the_earlier_outputs_as_they_were(capsys, tmp_path, evals):
    out = tmp_path / "out"
    assert report(capsys, "artefact=table2", inputs(evals), f"output={out / 'table2.csv'}")[0] == 0
    paths = [barrier_result(tmp_path, m, tmp_path / "matched" / "seed1-onto-seed0" / m, bump=b, seed=s)[0]
             for m, b, s in (("none", 1.0, 0), ("rotation", 0.2, 1))]
    assert report(capsys, "artefact=fig5_barrier", inputs(paths), f"output={out / 'fig5.png'}")[0] == 0
    assert sorted(p.name for p in out.iterdir()) == ["fig5.csv", "fig5.pdf", "fig5.png", "table2.csv", "table2.md"]
    rewrite(evals[0], lambda d: d["metrics"].pop("accuracy"))
    fails(capsys, tmp_path, "accuracy", "artefact=table2", inputs(evals), f"output={out / 'table2.csv'}")
    rewrite(paths[1], lambda d: d.__setitem__("path", d["path"][:1]))
    fails(capsys, tmp_path, "at path", "artefact=fig5_barrier", inputs(paths), f"output={out / 'fig5.png'}")


def test_its_own_markdown_is_recognised_by_its_signature_and_nothing_else(capsys, tmp_path, evals):
    out = tmp_path / "out"
    out.mkdir()
    mine = out / "mine.md"
    mine.write_text("# Table 2: my notes\n\nlooks like a report table\n\nInputs:\n- results/x.json\n")
    fails(capsys, tmp_path, "did not write", "artefact=table2", inputs(evals), f"output={out / 'mine.csv'}")
    (out / "notes.md").write_text("# symfusion reproduction report: my own copy\n")
    fails(capsys, tmp_path, "did not write", "artefact=report", f"inputs=[{mine}]", f"output={out / 'notes.md'}")
    assert report(capsys, "artefact=table2", inputs(evals), f"output={out / 'table2.csv'}")[0] == 0
    assert report(capsys, "artefact=table2", inputs(evals), f"output={out / 'table2.csv'}")[0] == 0   # its own: replaced
    text = (out / "table2.md").read_text()
    assert text == signed_markdown(text.rsplit("\n<!-- ", 1)[0])
    (out / "table2.md").write_text(text.replace("Effect of matching", "My effect of matching"))   # a user edited it
    fails(capsys, tmp_path, "did not write", "artefact=table2", inputs(evals), f"output={out / 'table2.csv'}")


@pytest.mark.slow
def test_the_command_itself_exits_2_with_one_line(tmp_path, evals):
    rewrite(evals[2], lambda d: d["results"][0].pop("task"))
    result = subprocess.run([sys.executable, "-c", "from symfusion.pipeline.cli import report_main; report_main()",
                             "artefact=table2", inputs(evals), f"output={tmp_path / 'out' / 'table2.csv'}"],
                            capture_output=True, text=True, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and "'task'" in lines[0]
    assert not (tmp_path / "out").exists()
