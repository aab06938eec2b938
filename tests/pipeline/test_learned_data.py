"""The learned refinement's data in the pipeline: a task's statistic batches come from its validation or train
split, never from the test split that scores the merges; symfusion-match reads them as data_split says and its
matching.refine_* overrides reach the refinement (symfusion-match's declaration, presets/matching/full_symmetry.yaml)."""
import json

import pytest
import torch
import transformers as tf

from symfusion.errors import SymfusionError
from symfusion.pipeline import cli
from symfusion.pipeline.tasks import make_task
from tiny_models import randomize


def test_the_refinement_data_come_from_validation_or_train_never_from_test():
    task = make_task("digits")
    train = task.statistic_batches(2, None, split="train")
    assert len(train) == 2 and train[0]["pixel_values"].shape[0] == int(task.cfg.fusion_batch_size)
    pool = {tuple(row.flatten().tolist()) for row in task.split("train").pixels}
    assert all(tuple(row.flatten().tolist()) in pool for b in train for row in b["pixel_values"])
    assert torch.equal(task.statistic_batches(2, None, split="train")[1]["pixel_values"], train[1]["pixel_values"])
    validation = task.statistic_batches(1, None)[0]["pixel_values"]
    assert torch.equal(validation, task.split("validation").pixels[: validation.shape[0]])
    with pytest.raises(SymfusionError, match="test split scores"):
        task.statistic_batches(1, None, split="test")


@pytest.fixture(scope="module")
def vits(tmp_path_factory):
    """Two random ViTs for the digits task (8x8 grey images, 10 classes)."""
    root = tmp_path_factory.mktemp("vits")
    config = tf.ViTConfig(image_size=8, patch_size=4, num_channels=1, num_labels=10, hidden_size=16,
                          num_hidden_layers=2, num_attention_heads=2, intermediate_size=24)
    for seed in (0, 1):
        randomize(tf.ViTForImageClassification(config), seed).save_pretrained(str(root / f"m{seed}"))
    return root


def match(vits, out, extra, capsys) -> tuple[int, list[str]]:
    args = [f"source={vits / 'm1'}", f"anchor={vits / 'm0'}", f"output={out}", "matching=full_symmetry_learned",
            "data_task=digits", "data_batches=2", "matching.refine_steps=3", *extra]
    with pytest.raises(SystemExit) as exit_info:
        cli.match_main(args)
    return exit_info.value.code, capsys.readouterr().err.strip().splitlines()


def test_symfusion_match_reads_its_data_split_and_the_refine_overrides(vits, tmp_path, capsys):
    code, err = match(vits, tmp_path / "m", ["data_split=train", "matching.refine_group=general",
                                             "matching.refine_alphas=[0.2,0.8]", "matching.refine_lr=0.03"], capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "m" / "match.json").read_text())
    assert report["data"] == {"task": "digits", "split": "train", "batches": 2}
    config = report["matching_config"]
    assert (config["refine_group"], config["refine_alphas"], config["refine_lr"], config["refine_steps"]) == \
        ("general", [0.2, 0.8], 0.03, 3)
    assert report["residual"]["refine"]["steps"] == 3


@pytest.mark.parametrize("extra,message", [
    (["data_split=test"], "data_split"), (["matching.refine_group=affine"], "refine_group"),
    (["matching.refine_alphas=[0.8,0.2]"], "refine_alphas"), (["matching.refine_lr=inf"], "refine_lr"),
    (["matching.refine_gains_lr=nan"], "refine_gains_lr"), (["matching.refine_gains_lr=0"], "refine_gains_lr")])
def test_symfusion_match_refuses_test_data_and_wrong_refine_settings_with_one_line(vits, tmp_path, capsys, extra,
                                                                                  message):
    code, err = match(vits, tmp_path / "m", extra, capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("matching,message", [("full_symmetry", "reads the weights only"), ("rotation", "weights only"),
                                              ("full_symmetry_synthetic", "runs the models on inputs it makes")])
def test_symfusion_match_refuses_data_a_data_free_matching_would_ignore_with_one_line(vits, tmp_path, capsys,
                                                                                     matching, message):
    args = [f"source={vits / 'm1'}", f"anchor={vits / 'm0'}", f"output={tmp_path / 'm'}", f"matching={matching}",
            "data_task=digits"]
    with pytest.raises(SystemExit) as exit_info:
        cli.match_main(args)
    code, err = exit_info.value.code, capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert "data_task=digits" in err[0] and not (tmp_path / "m").exists()


@pytest.mark.parametrize("option", ["data_batches=3", "data_split=validation"])
def test_symfusion_match_refuses_every_data_option_a_data_free_matching_would_ignore(vits, tmp_path, capsys, option):
    args = [f"source={vits / 'm1'}", f"anchor={vits / 'm0'}", f"output={tmp_path / 'm'}", "matching=full_symmetry",
            option]
    with pytest.raises(SystemExit) as exit_info:
        cli.match_main(args)
    code, err = exit_info.value.code, capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"leave {option} out" in err[0], err
    assert not (tmp_path / "m").exists()


def test_symfusion_match_takes_data_task_null_with_a_data_free_matching_as_the_workflow_writes_it(vits, tmp_path, capsys):
    args = [f"source={vits / 'm1'}", f"anchor={vits / 'm0'}", f"output={tmp_path / 'm'}", "matching=rotation",
            "data_task=null"]
    with pytest.raises(SystemExit) as exit_info:
        cli.match_main(args)
    assert exit_info.value.code == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "m" / "match.json").read_text())["data"] is None
