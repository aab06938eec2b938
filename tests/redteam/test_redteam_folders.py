"""Red team, model folders: every hostile change of hostile.MUTATIONS (index, shards, config, dtype, non-finite
values, symlinks, pickles) through symfusion.align() and every model-reading command's real entry point
(symfusion-match, -merge, -evaluate, -barrier, -statistics, -multimodel, -layers); each must be refused with
exit 2 (SymfusionError), one line, no traceback, nothing outside the output changed, no output, no lock or temp.
A seeded sample of two-change combinations runs on top (a fuzzing loop that grows with CASES).
"""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import transformers as tf

import symfusion
from symfusion.pipeline import cli
from hostile import (ACCEPTED, MUTATIONS, applicable, assert_refused, leftovers, outcome, snapshot)
from tiny_decoders import tiny_decoder
from tiny_models import randomize, tiny_model

pytestmark = pytest.mark.slow          # every hostile folder through every reader, each a command

ALL = [(kind, m) for kind, ms in MUTATIONS.items() for m in ms]
IDS = [f"{kind}-{m.__name__}" for kind, m in ALL]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Good folders: a sharded llama pair (align), a sharded BERT pair (symfusion-match), a sharded ViT pair (digits)."""
    root = tmp_path_factory.mktemp("models")
    tiny_decoder("llama", seed=0, num_key_value_heads=2).save_pretrained(str(root / "llama_a"), max_shard_size="40KB")
    tiny_decoder("llama", seed=1, num_key_value_heads=2).save_pretrained(str(root / "llama_b"), max_shard_size="40KB")
    tiny_model("bert", seed=1).save_pretrained(str(root / "bert_a"), max_shard_size="20KB")
    tiny_model("bert", seed=2).save_pretrained(str(root / "bert_b"), max_shard_size="20KB")
    vit = tf.ViTConfig(image_size=8, patch_size=4, num_channels=1, num_labels=10, hidden_size=16,
                       num_hidden_layers=1, num_attention_heads=2, intermediate_size=24)
    randomize(tf.ViTForImageClassification(vit), 0).save_pretrained(str(root / "vit_a"), max_shard_size="4KB")
    randomize(tf.ViTForImageClassification(vit), 1).save_pretrained(str(root / "vit_b"), max_shard_size="4KB")
    return root


def entry_points(models: Path, source: Path, out: Path) -> dict:
    """Entry point name -> a call reading `source` (a hostile copy) beside a good model, writing `out`."""
    vit = models / "vit_a"
    return {
        "align": lambda: symfusion.align(str(source), str(models / "llama_a"), output=out),
        "symfusion-match": lambda: cli.match_main([f"source={source}", f"anchor={models / 'bert_a'}", f"output={out}"]),
        "symfusion-merge": lambda: cli.merge_main(["task=digits", "fusion=fisher", "fusion.num_batches=1",
                                                   f"models=[{vit},{source}]", f"output={out}"]),
        "symfusion-evaluate": lambda: cli.evaluate_main(["task=digits", f"model_dir={source}", f"output={out}.json"]),
        "symfusion-barrier": lambda: cli.barrier_main(["task=digits", f"anchor={vit}", f"source={source}", "points=2",
                                                       "examples=8", f"output={out}.json"]),
        "symfusion-statistics": lambda: cli.statistics_main(["task=digits", f"model_dir={source}", "methods=[fisher]",
                                                             f"output={out}.safetensors"]),
        "symfusion-multimodel": lambda: cli.multimodel_main([f"models=[{vit},{source}]", f"output={out}.json",
                                                             f"output_models={out}"]),
        "symfusion-layers": lambda: cli.layers_main([f"anchor={vit}", f"source={source}", "tasks=[digits,digits]",
                                                     "examples=8", f"output={out}.json"]),
    }


SOURCES = {"align": "llama_b", "symfusion-match": "bert_b"}          # the others read the ViT


def refused_everywhere(models: Path, case: Path, mutations: list) -> list[str]:
    """Apply `mutations` to a copy of each entry point's source and check every entry point refuses it."""
    lines = []
    for name in entry_points(models, Path("x"), Path("y")):
        root = case / name.replace("symfusion-", "")
        (root / "outside").mkdir(parents=True)
        source = root / "source"
        shutil.copytree(models / SOURCES.get(name, "vit_b"), source)
        if not all(applicable(m, source) and name in getattr(m, "readers", (name,)) for m in mutations):
            continue
        for mutation in mutations:
            mutation(source, root / "outside")
        out = root / "out"
        before = snapshot(case.parent, out)
        code, text = outcome(entry_points(models, source, out)[name])
        for written in (out, Path(f"{out}.json"), Path(f"{out}.safetensors")):
            assert leftovers(written) == [], (name, leftovers(written))
        lines.append(assert_refused(code, text, case.parent, before, out,
                                    f"{name} after {[m.__name__ for m in mutations]}"))
    return lines


@pytest.mark.parametrize("kind,mutation", ALL, ids=IDS)
def test_every_hostile_folder_is_refused_by_every_reader(models, tmp_path, kind, mutation):
    good = snapshot(models)
    lines = refused_everywhere(models, tmp_path / "case", [mutation])
    assert lines, "no entry point could take this change"
    assert snapshot(models) == good                                # the good models were read as data


CASES = 6


@pytest.mark.parametrize("case", range(CASES))
def test_fuzzed_combinations_are_refused(models, tmp_path, case):
    """Two random changes of different classes at once (seeded, reproducible)."""
    rng = random.Random(1000 + case)
    first, second = rng.sample(sorted(MUTATIONS), 2)
    mutations = [rng.choice(MUTATIONS[first]), rng.choice(MUTATIONS[second])]
    if "pickles" in (first, second):                 # pickles remove the weights every other change needs
        mutations = [m for m in mutations if m.__name__ == "pickle_only"]
    refused_everywhere(models, tmp_path / "case", mutations)


@pytest.mark.parametrize("mutation", ACCEPTED, ids=[m.__name__ for m in ACCEPTED])
def test_harmless_changes_give_a_correct_result_or_one_line(models, tmp_path, mutation):
    """A float64 tensor among float32 ones, a config naming no known architecture: align() matches it (the bare
    model is checked) into a folder that keeps every dtype and the source's function; symfusion-match does
    too, or refuses in one line (its loader wants every tensor to belong to the class config.json names)."""
    (tmp_path / "outside").mkdir()
    for name, good in (("align", "llama_b"), ("symfusion-match", "bert_b")):
        source = tmp_path / f"{name}_source"
        shutil.copytree(models / good, source)
        mutation(source, tmp_path / "outside")
        out = tmp_path / f"{name}_out"
        before = snapshot(tmp_path, out)
        code, text = outcome(entry_points(models, source, out)[name])
        if name != "align" and code in (2, "error"):
            assert_refused(code, text, tmp_path, before, out, name)
            continue
        assert code in ("ok", 0), (name, text[-1500:])
        dtypes = {k: v.dtype for k, v in symfusion.alignment.sharded.ShardedFolder(source).meta_state().items()}
        assert {k: v.dtype for k, v in symfusion.alignment.sharded.ShardedFolder(out).meta_state().items()} == dtypes
        report = json.loads((out / "match.json").read_text())
        assert report.get("relative_output_change", report.get("max_block_relative_output_change")) < 1e-3
