"""Adding a matching variant is one preset file: written into a copy of the presets folder (never into the
checkout), it is seen by the library (matching_config, align()), by symfusion-match and by the workflow's question
(presets/catalog.py, loaded by its path as workflow/rules/tracks.smk loads it), with nothing else edited."""
import dataclasses
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers as tf

from symfusion import align
from symfusion.errors import SymfusionError
from symfusion.matching import matching_config
from symfusion.pipeline.cli import run_command
from symfusion.presets import catalog, preset_names

from tiny_models import randomize

CATALOG = Path(catalog.__file__)
NAME = "full_symmetry_activations"
# The one file: full_symmetry whose first residual estimate comes from the models' activations (it reads data).
PRESET = f"""# A variant added by a test: full_symmetry, its residual map first estimated from the activations.
name: {NAME}
label: "full symmetry, activations"
defaults:
  - full_symmetry
residual_solve: activations
"""


@pytest.fixture
def presets(tmp_path, monkeypatch) -> Path:
    """A copy of the shipped presets with the new variant's file added; the library reads it in their place."""
    folder = tmp_path / "presets"
    shutil.copytree(catalog.PRESETS_DIR, folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    (folder / "matching" / f"{NAME}.yaml").write_text(PRESET)
    monkeypatch.setattr(catalog, "PRESETS_DIR", folder)
    return folder


def vit_pair(root: Path) -> tuple[Path, Path]:
    """Two tiny ViTs for the 8x8 digits (the `digits` task of conf/task), saved as folders."""
    config = tf.ViTConfig(image_size=8, patch_size=4, num_channels=1, num_labels=10, hidden_size=16,
                          num_hidden_layers=2, num_attention_heads=2, intermediate_size=24)
    folders = []
    for seed, name in ((0, "anchor"), (1, "source")):
        randomize(tf.ViTForImageClassification(config), seed).save_pretrained(str(root / name))
        folders.append(root / name)
    return folders[0], folders[1]


def test_the_files_in_the_copy_are_the_shipped_ones_plus_one(presets):
    shipped = sorted(p.relative_to(CATALOG.parent) for p in CATALOG.parent.rglob("*.yaml"))
    copied = sorted(p.relative_to(presets) for p in presets.rglob("*.yaml"))
    assert set(copied) - set(shipped) == {Path("matching", f"{NAME}.yaml")} and set(shipped) <= set(copied)
    assert not (CATALOG.parent / "matching" / f"{NAME}.yaml").exists()      # the checkout is left as it was


def test_the_library_sees_the_new_variant(presets):
    assert NAME in preset_names("matching")
    config = matching_config(NAME)
    assert config == dataclasses.replace(matching_config("full_symmetry"), residual_solve="activations")
    assert config.needs_data and catalog.matching_reads_data(NAME)


def test_align_runs_the_new_variant_by_its_name(presets, tmp_path):
    anchor, source = vit_pair(tmp_path)
    with pytest.raises(SymfusionError, match="reads the models' activations or loss"):
        align(str(source), str(anchor), NAME, output=str(tmp_path / "refused"))
    assert not (tmp_path / "refused").exists()
    gen = torch.Generator().manual_seed(3)
    data = [{"pixel_values": torch.randn(4, 1, 8, 8, generator=gen), "labels": torch.randint(0, 10, (4,), generator=gen)}
            for _ in range(2)]
    _, report = align(str(source), str(anchor), NAME, output=str(tmp_path / "matched"), data=data)
    assert report["matching"] == NAME and report["matching_config"]["residual_solve"] == "activations"
    assert report["data"] == {"batches": 2} and report["distance_after"] < report["distance_before"]


def test_symfusion_match_runs_the_new_variant(presets, tmp_path, capsys):
    anchor, source = vit_pair(tmp_path)
    pair = [f"source={source}", f"anchor={anchor}", f"matching={NAME}"]
    assert run_command("match", [*pair, f"output={tmp_path / 'refused'}"]) == 2     # it reads data: data_task needed
    assert capsys.readouterr().err.strip() == (f"error: matching={NAME} reads the models' activations or loss: give "
                                               "data_task=NAME (a conf/task the models solve)")
    assert not (tmp_path / "refused").exists()
    out = tmp_path / "matched"
    assert run_command("match", [*pair, f"output={out}", "data_task=digits", "data_batches=2"]) == 0
    report = json.loads((out / "match.json").read_text())
    assert report["matching"] == NAME and report["matching_config"] == matching_config(NAME).as_report()


def test_the_workflows_question_sees_the_new_variant(presets):
    """The workflow loads the catalogue by its path (config.smk's plain_module): that module, pointed at the copy."""
    spec = importlib.util.spec_from_file_location("catalog_as_the_workflow_loads_it", CATALOG)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    assert loaded.PRESETS_DIR == CATALOG.parent                 # as shipped, until pointed at the copy
    loaded.PRESETS_DIR = presets
    assert loaded.matching_reads_data(NAME) and not loaded.matching_reads_data("full_symmetry")
    assert loaded.preset("matching", NAME)["residual"] == "auto"          # full_symmetry's, through defaults:
