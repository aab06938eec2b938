"""symfusion-align-many, the stage command on top of symfusion.align_many() (pipeline/stages/align_many.py): its
folders are the function's, its learned k-way refinement reads its task's batches as symfusion-match reads them
(data_task, data_split, data_batches), and every mistake (bad options, a hostile folder, an unsafe output) is one
`error:` line, exit code 2, nothing written; a previous output is replaced only when it is this command's."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers as tf

import symfusion
from symfusion.matching import matching_config
from symfusion.pipeline import cli
from symfusion.pipeline.command import compose
from symfusion.pipeline.tasks import make_task
from hostile import MUTATIONS, applicable, assert_refused, leftovers, outcome, snapshot
from tiny_models import DIGITS_VIT, digits_vit_folders, randomize

VIT = DIGITS_VIT
LEARNED = ["matching=full_symmetry_learned", "data_task=digits", "data_batches=2", "matching.refine_steps=3"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> list[Path]:
    """Three tiny ViT folders: the first sharded (an index and several shards), the others single files."""
    return digits_vit_folders(tmp_path_factory.mktemp("vits"))


def models(paths) -> str:
    return "models=[" + ",".join(str(p) for p in paths) + "]"


def command(*args: str):
    return lambda: cli.align_many_main(list(args))


def weights(folder: Path) -> dict:
    return tf.ViTForImageClassification.from_pretrained(str(folder)).state_dict()


def test_the_command_writes_the_folders_align_many_writes(folders, tmp_path, capsys):
    out = tmp_path / "cli"
    code, text = outcome(command(models(folders[:2]), f"output={out}", "max_rounds=1"))
    assert code == 0, text
    assert capsys.readouterr().out.startswith(f"wrote 2 aligned folders to {out} (full_symmetry; J ")
    _, report = symfusion.align_many([str(p) for p in folders[:2]], output=tmp_path / "api", max_rounds=1)
    saved = json.loads((out / "many.json").read_text())
    assert saved["objective"] == report["objective"]
    assert saved["matching"] == "full_symmetry" and saved["data"] is None
    assert saved["provenance"]["config"]["max_rounds"] == 1                 # the command's whole configuration
    for i in range(2):
        ours, theirs = weights(out / f"model_{i}"), weights(tmp_path / "api" / f"model_{i}")
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_the_learned_k_way_reads_its_tasks_batches(folders, tmp_path, capsys):
    """matching=full_symmetry_learned data_task=digits: the same k folders as align_many() on the task's train batches
    (as the profile sizes them), with the refine overrides reaching the refinement and many.json saying the data."""
    out = tmp_path / "learned"
    code, text = outcome(command(models(folders), f"output={out}", "max_rounds=1", *LEARNED))
    assert code == 0, text
    assert "; refined on data: centroid loss " in capsys.readouterr().out
    saved = json.loads((out / "many.json").read_text())
    assert saved["matching"] == "full_symmetry_learned"
    assert saved["data"] == {"task": "digits", "split": "train", "batches": 2}
    assert saved["matching_config"]["refine_steps"] == 3 and saved["refine"]["steps"] == 3
    profile = compose("align-many", []).get("profile")
    data = make_task("digits", profile).statistic_batches(2, folders[0], "train")
    config = dataclasses.replace(matching_config("full_symmetry_learned"), refine_steps=3)
    _, report = symfusion.align_many([str(p) for p in folders], matching=config, data=data,
                                     output=tmp_path / "api", max_rounds=1)
    assert saved["refine"] == report["refine"]
    for i in range(3):
        ours, theirs = weights(out / f"model_{i}"), weights(tmp_path / "api" / f"model_{i}")
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    # the validation split when data_split says so
    code, text = outcome(command(models(folders[:2]), f"output={tmp_path / 'v'}", "max_rounds=0", *LEARNED,
                                 "data_split=validation"))
    assert code == 0, text
    assert json.loads((tmp_path / "v" / "many.json").read_text())["data"]["split"] == "validation"


def make_world(tmp_path: Path) -> Path:
    """A folder with a BERT (another family) and a wider ViT (other shapes)."""
    world = tmp_path / "world"
    world.mkdir()
    tf.BertForSequenceClassification(tf.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1,
                                                   num_attention_heads=2, intermediate_size=24)).save_pretrained(
        str(world / "bert"))
    randomize(tf.ViTForImageClassification(tf.ViTConfig(**{**VIT, "intermediate_size": 32})), 5).save_pretrained(
        str(world / "wide"))
    return world


def bad_command_lines(folders: list[Path], world: Path, out: Path) -> dict[str, tuple[list[str], str]]:
    """Name -> (a command line that must be refused, a word its one line holds)."""
    a, b = folders[:2]
    both, output = models([a, b]), f"output={out}"
    return {
        "one model": ([models([a]), output], "models"),
        "no output": ([both], "output"),
        "a flag": ([both, "--output", str(out)], "unknown flag"),
        "rounds": ([both, output, "max_rounds=many"], "max_rounds"),
        "negative rounds": ([both, output, "max_rounds=-1"], "max_rounds"),
        "tolerance": ([both, output, "max_relative_output_change=0"], "max_relative_output_change"),
        "matching": ([both, output, "matching=no_such"], "matching"),
        "no such folder": ([models([a, world / "missing"]), output], "no such directory"),
        "the same folder twice": ([models([a, a]), output], "twice"),
        "another family": ([models([a, world / "bert"]), output], "model_type"),
        "other shapes": ([models([a, world / "wide"]), output], "differ"),
        "learned, no data": ([both, output, "matching=full_symmetry_learned"], "data_task"),
        "data for a data-free matching": ([both, output, "data_task=digits"], "reads the weights only"),
        "test data": ([both, output, *LEARNED, "data_split=test"], "data_split"),
        "no batches": ([both, output, *LEARNED, "data_batches=0"], "data_batches"),
        "synthetic": ([both, output, "matching=full_symmetry_synthetic", "data_task=digits"], "inputs it makes"),
        "untie without an lm_head": ([both, output, "matching=full_symmetry_untie"], "no lm_head"),
        "a task the models cannot solve": ([models([world / "bert", world / "bert"]), output, *LEARNED], "pixels"),
        "a refine override": ([both, output, *LEARNED, "matching.refine_lr=inf"], "refine_lr"),
    }


def test_bad_command_lines_are_one_line_and_write_nothing(folders, tmp_path):
    world = make_world(tmp_path)
    out = world / "out"
    for name, (args, word) in bad_command_lines(folders, world, out).items():
        before = snapshot(world, out)
        code, text = outcome(command(*args))
        line = assert_refused(code, text, world, before, out, name)
        assert word in line, f"{name}: {line}"


def test_a_previous_output_is_replaced_only_when_it_is_this_commands(folders, tmp_path):
    out = tmp_path / "out"
    assert outcome(command(models(folders), f"output={out}", "max_rounds=0"))[0] == 0
    inputs = [snapshot(p) for p in folders]
    code, text = outcome(command(models(folders[:2]), f"output={out}", "max_rounds=0"))
    assert code == 0, text
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["model_0", "model_1"]
    assert [snapshot(p) for p in folders] == inputs and leftovers(out) == []
    world = tmp_path / "world"
    copies = [shutil.copytree(p, world / p.name) for p in folders[:2]]
    (world / "plain").mkdir()
    (world / "plain" / "notes.txt").write_text("mine")
    for unsafe in (copies[0], world / "plain", copies[1] / "sub"):
        before = snapshot(world)
        code, text = outcome(command(models(copies), f"output={unsafe}"))
        lines = text.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), text
        assert snapshot(world) == before


FIRST_OF_EACH_CLASS = [(kind, next(m for m in ms if m.__name__ != "config_heads")) for kind, ms in MUTATIONS.items()]


@pytest.mark.parametrize("kind,mutation", FIRST_OF_EACH_CLASS, ids=[k for k, _ in FIRST_OF_EACH_CLASS])
def test_a_hostile_folder_is_refused(folders, tmp_path, kind, mutation):
    """One hostile change of each red-team class (tests/hostile.py) to the second folder: one line, exit 2, nothing
    outside the output changed, no output, no lock or temp."""
    world = tmp_path / "world"
    (world / "outside").mkdir(parents=True)
    good = shutil.copytree(folders[1], world / "good")
    source = shutil.copytree(folders[0], world / "source")               # sharded: every class applies
    assert applicable(mutation, source)
    mutation(source, world / "outside")
    out = world / "out"
    before = snapshot(world, out)
    code, text = outcome(command(models([good, source]), f"output={out}"))
    assert_refused(code, text, world, before, out, f"cli after {mutation.__name__}")
