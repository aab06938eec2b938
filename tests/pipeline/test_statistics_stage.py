"""symfusion-statistics: a model's Fisher / Gram statistics computed once, read by merges bit for bit the same."""
import json

import pytest
import torch
from safetensors import safe_open

from symfusion.pipeline import cli
from symfusion.io.modelio import load_model
from test_vision_stages import end_models, fails_with_one_line, run  # noqa: F401 - end_models is a fixture

OPTIONS = "method_options={fisher: {num_batches: 2}, regmean: {num_batches: 2}}"


def statistics_file(folder, output, options=OPTIONS, methods="[fisher,regmean]"):
    run("statistics", cli.statistics_command, ["task=digits", f"model_dir={folder}", f"methods={methods}",
                                               options, f"output={output}"])
    return output


@pytest.mark.slow
def test_merges_with_precomputed_statistics_equal_merges_without(end_models, tmp_path):  # noqa: F811
    anchor, source = end_models / "seed0", end_models / "seed1"
    files = [statistics_file(anchor, tmp_path / "anchor.safetensors"),
             statistics_file(source, tmp_path / "source.safetensors")]
    with safe_open(str(files[0]), framework="pt") as handle:
        names = list(handle.keys())
        metadata = handle.metadata()
    assert any(n.startswith("fisher/") for n in names) and any(n.startswith("regmean/") for n in names)
    assert set(json.loads(metadata["seconds"])) == {"fisher", "regmean"}

    models = f"models=[{anchor},{source}]"
    for name, given in (("none", []), ("anchor", files[:1]), ("both", files)):
        statistics = [f"statistics=[{','.join(map(str, given))}]"] if given else []
        run("merge", cli.merge_command, ["task=digits", "methods=[fisher,regmean]", models, OPTIONS,
                                         f"eval_dir={tmp_path / name}"] + statistics)
        for method in ("fisher", "regmean"):
            run("merge", cli.merge_command, ["task=digits", f"fusion={method}", models, "fusion.num_batches=2",
                                             f"output={tmp_path / name / method}"] + statistics)
    for method in ("fisher", "regmean"):
        reference = load_model(tmp_path / "none" / method).state_dict()
        evaluated = json.loads((tmp_path / "none" / f"{method}.json").read_text())["metrics"]
        for name, count in (("anchor", 1), ("both", 2)):
            merged = load_model(tmp_path / name / method).state_dict()
            assert all(torch.equal(merged[k], reference[k]) for k in reference), (name, method)
            report = json.loads((tmp_path / name / method / "merge.json").read_text())
            assert report["precomputed_statistics"] == [str(anchor), str(source)][:count]
            assert json.loads((tmp_path / name / f"{method}.json").read_text())["metrics"] == evaluated
    assert json.loads((tmp_path / "none" / "fisher" / "merge.json").read_text())["precomputed_statistics"] == []


def test_a_statistics_file_that_fits_no_model_is_refused(end_models, tmp_path, capsys):  # noqa: F811
    anchor, source = end_models / "seed0", end_models / "seed1"
    other_data = statistics_file(anchor, tmp_path / "three.safetensors",
                                 "method_options={fisher: {num_batches: 3}, regmean: {num_batches: 3}}")
    models = f"models=[{anchor},{source}]"
    out = tmp_path / "eval"
    fails_with_one_line(capsys, "merge", cli.merge_command,
                        ["task=digits", "methods=[fisher]", models, "method_options={fisher: {num_batches: 2}}",
                         f"eval_dir={out}", f"statistics=[{other_data}]"], "fits none of the models")
    fails_with_one_line(capsys, "merge", cli.merge_command,
                        ["task=digits", "methods=[fisher]", models, f"eval_dir={out}",
                         f"statistics=[{anchor / 'config.json'}]"], "is not a statistics file")
    fails_with_one_line(capsys, "merge", cli.merge_command,
                        ["task=digits", "methods=[fisher]", models, f"eval_dir={out}",
                         f"statistics=[{tmp_path / 'missing.safetensors'}]"], "does not exist")
    assert not out.exists()


def test_statistics_command_errors_write_nothing(end_models, tmp_path, capsys):  # noqa: F811
    model = end_models / "seed0"
    out = tmp_path / "s.safetensors"
    fails_with_one_line(capsys, "statistics", cli.statistics_command,
                        ["task=digits", f"model_dir={model}", "methods=[simple,ot_wts]", f"output={out}"],
                        "none of methods=['simple', 'ot_wts'] has a per-model statistic")
    fails_with_one_line(capsys, "statistics", cli.statistics_command,
                        ["task=digits", f"model_dir={model}", f"output={tmp_path / 's.bin'}"], "ending in .safetensors")
    fails_with_one_line(capsys, "statistics", cli.statistics_command,
                        ["task=digits", f"model_dir={tmp_path / 'nope'}", f"output={out}"], "no such directory")
    assert not list(tmp_path.iterdir())
    foreign = tmp_path / "foreign.safetensors"
    foreign.write_bytes(b"not written by symfusion")
    fails_with_one_line(capsys, "statistics", cli.statistics_command,
                        ["task=digits", f"model_dir={model}", OPTIONS, f"output={foreign}"], "did not write")
    assert foreign.read_bytes() == b"not written by symfusion"
    statistics_file(model, out, methods="[simple,fisher]")   # simple has no statistic: skipped
    with safe_open(str(out), framework="pt") as handle:
        assert set(json.loads(handle.metadata()["statistics"])) == {"fisher"}
    statistics_file(model, out)                        # its own previous output is replaced
    with safe_open(str(out), framework="pt") as handle:
        assert set(json.loads(handle.metadata()["statistics"])) == {"fisher", "regmean"}
