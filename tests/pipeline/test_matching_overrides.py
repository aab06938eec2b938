"""One source of truth for matching variants: every command builds its matching from cfg.matching, so a
command-line override such as matching.rescale=false changes match, layers and multimodel alike."""
import json

import pytest
import transformers as tf

from symfusion.pipeline import cli
from symfusion.pipeline.command import compose
from tiny_models import randomize


def run(name: str, command, overrides: list[str]):
    command(compose(name, overrides))


@pytest.fixture(scope="module")
def vits(tmp_path_factory):
    """Two random ViTs for the digits task (8x8 grey images, 10 classes)."""
    root = tmp_path_factory.mktemp("vits")
    config = tf.ViTConfig(image_size=8, patch_size=4, num_channels=1, num_labels=10, hidden_size=16,
                          num_hidden_layers=2, num_attention_heads=2, intermediate_size=24)
    paths = []
    for seed in (0, 1):
        model = randomize(tf.ViTForImageClassification(config), seed)
        model.save_pretrained(str(root / f"m{seed}"))
        paths.append(str(root / f"m{seed}"))
    return paths


VARIANTS = {"override": ["matching=rotation", "matching.rescale=false"],
            "named": ["matching=rotation_no_rescale"],
            "rescaled": ["matching=rotation"]}


def results(vits, tmp_path, variant):
    """(match distance, layer-sweep losses, multimodel distances) of one way of choosing the matching."""
    anchor, source = vits
    out = tmp_path / variant
    overrides = VARIANTS[variant]
    run("match", cli.match_command, [f"source={source}", f"anchor={anchor}", f"output={out / 'matched'}", *overrides])
    run("layers", cli.layers_command, [f"anchor={anchor}", f"source={source}", "tasks=[digits,digits]",
                                       "examples=40", f"output={out / 'layers.json'}", *overrides])
    run("multimodel", cli.multimodel_command, [f"models=[{anchor},{source}]", f"output={out / 'multi.json'}",
                                               *overrides])
    match = json.loads((out / "matched" / "match.json").read_text())
    layers = json.loads((out / "layers.json").read_text())
    multi = json.loads((out / "multi.json").read_text())
    return (match["distance_after"], match["matching_config"]["rescale"],
            [row["loss"] for row in layers["rows"]], layers["matching_config"]["rescale"],
            multi["methods"]["anchor"]["sum_pairwise_distance"], multi["matching_config"]["rescale"])


def test_an_override_changes_every_command_alike(vits, tmp_path):
    override, named, rescaled = (results(vits, tmp_path, v) for v in ("override", "named", "rescaled"))
    assert override == named                       # rotation + rescale=false is rotation_no_rescale everywhere
    assert override[1::2] == (False, False, False) and rescaled[1::2] == (True, True, True)
    assert override[0] != rescaled[0]              # and the override really changed what each command computed
    assert override[2] != rescaled[2]
    assert override[4] != rescaled[4]
