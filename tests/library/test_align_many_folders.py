"""symfusion.align_many() on model folders: k folders read as align() reads them, written as k standard folders
(loadable by transformers, each computing its source's function, in its source's layout) and many.json; hostile
folders (every class of tests/hostile.py), bad arguments and unsafe outputs are one line, nothing written
(symfusion-align-many, the command on top: tests/pipeline/test_align_many_command.py)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers as tf

import symfusion
from symfusion.errors import SymfusionError
from hostile import INDEX, MUTATIONS, applicable, assert_refused, leftovers, outcome, snapshot
from tiny_models import DIGITS_VIT, digits_vit_folders, randomize

VIT = DIGITS_VIT


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> list[Path]:
    """Three tiny ViT folders: the first sharded (an index and several shards), the others single files."""
    return digits_vit_folders(tmp_path_factory.mktemp("vits"))


def logits(folder: Path, pixels: torch.Tensor) -> torch.Tensor:
    model = tf.ViTForImageClassification.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        return model(pixel_values=pixels).logits


def test_folders_in_and_k_standard_folders_out(folders, tmp_path):
    out = tmp_path / "aligned"
    written, report = symfusion.align_many([str(p) for p in folders], output=out, max_rounds=1)
    assert written == [out / f"model_{i}" for i in range(3)]
    pixels = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    for source, folder in zip(folders, written):                 # transformers reads each; each keeps its function
        before, after = logits(source, pixels), logits(folder, pixels)
        assert (after - before).abs().max() <= 1e-4 * before.abs().max()
        assert (folder / "transform.safetensors").is_file()
    assert (written[0] / INDEX).is_file() and not (written[1] / INDEX).exists()     # each in its source's layout
    # the same alignment as on the loaded modules
    modules = [tf.ViTForImageClassification.from_pretrained(str(p)).eval() for p in folders]
    aligned, again = symfusion.align_many(modules, max_rounds=1)
    assert again["objective"] == report["objective"]
    for module, folder in zip(aligned, written):
        stored = tf.ViTForImageClassification.from_pretrained(str(folder)).state_dict()
        assert all(torch.equal(stored[k], v) for k, v in module.state_dict().items())
    saved = json.loads((out / "many.json").read_text())
    assert saved["sources"] == [str(p) for p in folders] and saved["objective"] == report["objective"]
    assert all(c["as_written"]["relative_output_change"] <= c["as_written"]["tolerance"] for c in saved["checks"])
    # a previous output of align_many is replaced; the inputs are untouched
    inputs = [snapshot(p) for p in folders]
    symfusion.align_many([str(p) for p in folders[:2]], output=out, max_rounds=0)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["model_0", "model_1"]
    assert [snapshot(p) for p in folders] == inputs and leftovers(out) == []


def bad_calls(folders: list[Path], world: Path, out: Path) -> dict:
    """Name -> a call that must be refused (one line, nothing written)."""
    a, b = (str(p) for p in folders[:2])
    plain = world / "plain"
    plain.mkdir(exist_ok=True)
    (plain / "notes.txt").write_text("mine")
    module = tf.ViTForImageClassification(tf.ViTConfig(**VIT))
    return {
        "no output": lambda: symfusion.align_many([a, b]),
        "one model": lambda: symfusion.align_many([a], output=out),
        "a folder and a module": lambda: symfusion.align_many([a, module], output=out),
        "no such folder": lambda: symfusion.align_many([a, str(world / "missing")], output=out),
        "the same folder twice": lambda: symfusion.align_many([a, a], output=out),
        "another family": lambda: symfusion.align_many([a, str(world / "bert")], output=out),
        "other shapes": lambda: symfusion.align_many([a, str(world / "wide")], output=out),
        "a data matching": lambda: symfusion.align_many([a, b], output=out, matching="full_symmetry_learned"),
        "a bad record": lambda: symfusion.align_many([a, b], output=out, record=["provenance"]),
    }


def make_world(tmp_path: Path) -> Path:
    """A folder with a BERT (another family) and a wider ViT (other shapes) beside the tiny ViTs."""
    world = tmp_path / "world"
    world.mkdir()
    tf.BertForSequenceClassification(tf.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1,
                                                   num_attention_heads=2, intermediate_size=24)).save_pretrained(
        str(world / "bert"))
    randomize(tf.ViTForImageClassification(tf.ViTConfig(**{**VIT, "intermediate_size": 32})), 5).save_pretrained(
        str(world / "wide"))
    return world


def test_bad_arguments_are_one_line_and_write_nothing(folders, tmp_path):
    world = make_world(tmp_path)
    out = world / "out"
    for name, call in bad_calls(folders, world, out).items():
        before = snapshot(world, out)
        code, text = outcome(call)
        assert_refused(code, text, world, before, out, name)


@pytest.mark.parametrize("output", ["input", "plain", "inside"])
def test_an_unsafe_output_is_refused(folders, tmp_path, output):
    """An input folder, a folder that is not an output of align_many, a folder inside an input: refused."""
    world = tmp_path / "world"
    copies = [shutil.copytree(p, world / p.name) for p in folders[:2]]
    (world / "plain").mkdir()
    (world / "plain" / "notes.txt").write_text("mine")
    out = {"input": copies[0], "plain": world / "plain", "inside": copies[1] / "sub"}[output]
    before = snapshot(world)
    with pytest.raises(SymfusionError) as error:
        symfusion.align_many([str(p) for p in copies], output=out)
    assert "\n" not in str(error.value)
    assert snapshot(world) == before


FIRST_OF_EACH_CLASS = [(kind, next(m for m in ms if m.__name__ != "config_heads")) for kind, ms in MUTATIONS.items()]


@pytest.mark.parametrize("kind,mutation", FIRST_OF_EACH_CLASS, ids=[k for k, _ in FIRST_OF_EACH_CLASS])
def test_a_hostile_folder_is_refused(folders, tmp_path, kind, mutation):
    """One hostile change of each red-team class (tests/hostile.py) to the second folder, through align_many(): one
    line, nothing outside the output changed, no output, no lock or temp."""
    world = tmp_path / "world"
    (world / "outside").mkdir(parents=True)
    good = shutil.copytree(folders[1], world / "good")
    source = shutil.copytree(folders[0], world / "source")               # sharded: every class applies
    assert applicable(mutation, source)
    mutation(source, world / "outside")
    out = world / "out"
    before = snapshot(world, out)
    code, text = outcome(lambda: symfusion.align_many([str(good), str(source)], output=out))
    assert_refused(code, text, world, before, out, f"api after {mutation.__name__}")
