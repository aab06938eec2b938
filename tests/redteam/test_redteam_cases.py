"""Red team, the named cases of issue 28 through the real entry points: a hostile shard index, a NaN functional
check, a rerun over a folder holding a user's file, a matched folder that keeps the source's dtypes, shards and
config, task/model disagreements, Ctrl-C, and paths with spaces and non-ASCII letters."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import transformers as tf

import symfusion
from symfusion.alignment import checks, sharded
from symfusion.pipeline import cli
from symfusion.errors import SymfusionError
from symfusion.alignment.sharded import ShardedFolder
from hostile import assert_refused, leftovers, outcome, snapshot
from tiny_decoders import tiny_decoder
from tiny_models import randomize, tiny_model

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join(sys.path)}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("case_models")
    tiny_decoder("llama", seed=0, num_key_value_heads=2).save_pretrained(str(root / "llama_a"), max_shard_size="40KB")
    tiny_decoder("llama", seed=1, num_key_value_heads=2).save_pretrained(str(root / "llama_b"), max_shard_size="40KB")
    tiny_model("bert", seed=1).save_pretrained(str(root / "bert_a"))
    tiny_model("bert", seed=2).save_pretrained(str(root / "bert_b"))
    return root


def test_case1_a_shard_index_cannot_reach_outside_the_output(models, tmp_path):
    """The issue's case 1: weight_map naming ../victim/model.safetensors (or an absolute path) made align truncate and
    zero-fill that file; now the index is refused before anything is written, and the victim keeps its bytes."""
    victim = tmp_path / "victim" / "model.safetensors"
    victim.parent.mkdir()
    victim.write_bytes(b"the user's own model" * 100)
    for name, target in (("parent", "../victim/model.safetensors"), ("absolute", str(victim))):
        source = tmp_path / f"source_{name}"
        shutil.copytree(models / "llama_b", source)
        index = json.loads((source / "model.safetensors.index.json").read_text())
        first = sorted(set(index["weight_map"].values()))[0]
        index["weight_map"] = {k: (target if v == first else v) for k, v in index["weight_map"].items()}
        (source / "model.safetensors.index.json").write_text(json.dumps(index))
        out = tmp_path / "out"
        before = snapshot(tmp_path, out)
        code, text = outcome(lambda: symfusion.align(str(source), str(models / "llama_a"), output=out))
        assert "not a plain file name" in assert_refused(code, text, tmp_path, before, out, name)
    assert victim.read_bytes() == b"the user's own model" * 100


def test_a_nan_functional_check_fails(models, tmp_path, monkeypatch):
    """A NaN deviation used to compare False against the tolerance and pass: both checks now refuse it."""
    monkeypatch.setattr(checks.BlockCheck, "deviation", lambda self, prefix, s, m: float("nan"))
    with pytest.raises(SymfusionError, match="changes the source block's output by nan"):
        symfusion.align(str(models / "llama_b"), str(models / "llama_a"), output=tmp_path / "o1")
    monkeypatch.undo()
    monkeypatch.setattr(checks, "whole_model_change", lambda source, matched: float("nan"))
    with pytest.raises(SymfusionError, match="changes the source's outputs by nan"):
        symfusion.align(str(models / "llama_b"), str(models / "llama_a"), output=tmp_path / "o2")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_non_finite_weights_are_refused_on_modules_too(models):
    source = tiny_decoder("llama", seed=1, num_key_value_heads=2)
    with torch.no_grad():
        source.model.embed_tokens.weight[0, 0] = float("inf")
    with pytest.raises(SymfusionError, match="non-finite values"):
        symfusion.align(source, tiny_decoder("llama", seed=0, num_key_value_heads=2))


@pytest.mark.parametrize("entry", ["symfusion-match", "align", "symfusion-multimodel"])
def test_case3_a_rerun_never_deletes_a_users_file(models, tmp_path, entry):
    """The issue's case 3: a rerun over an earlier output into which a user put a file (or changed one) is refused,
    naming the file, and keeps it; the same rerun without it replaces the output."""
    out = tmp_path / "out"
    runs = {
        "symfusion-match": lambda: cli.match_main([f"source={models / 'bert_b'}", f"anchor={models / 'bert_a'}",
                                                   f"output={out}"]),
        "align": lambda: symfusion.align(str(models / "llama_b"), str(models / "llama_a"), output=out),
        "symfusion-multimodel": lambda: cli.multimodel_main([f"models=[{models / 'bert_a'},{models / 'bert_b'}]",
                                                             f"output={tmp_path / 'multi.json'}", f"output_models={out}"]),
    }
    assert outcome(runs[entry])[0] in (0, "ok")
    notes = (out / "0" if entry == "symfusion-multimodel" else out) / "notes.txt"
    notes.write_text("my notes")
    code, text = outcome(runs[entry])
    assert code in (2, "error") and len(text.strip().splitlines()) == 1 and "notes.txt" in text, text[-1500:]
    assert notes.read_text() == "my notes" and leftovers(out) == []
    notes.unlink()
    config = (out / "0" if entry == "symfusion-multimodel" else out) / "config.json"
    config.write_text(config.read_text() + " ")                         # a file it wrote, changed by the user
    code, text = outcome(runs[entry])
    assert code in (2, "error") and "config.json" in text and config.read_text().endswith(" "), text[-1500:]
    config.write_text(config.read_text()[:-1])
    assert outcome(runs[entry])[0] in (0, "ok") and leftovers(out) == []


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("family", ["bert", "vit"])
def test_a_matched_folder_keeps_the_sources_dtypes_shards_and_config(tmp_path, dtype, family):
    """symfusion-match used to write float32 save_pretrained folders: now the source's shard files, index, key order,
    dtypes and config.json (bytes), under its own tensor names (ViT's are renamed on load)."""
    anchor, source = (tiny_model(family, seed=s, dtype=dtype) for s in (1, 2))
    anchor.save_pretrained(str(tmp_path / "a"), max_shard_size="20KB")
    source.save_pretrained(str(tmp_path / "s"), max_shard_size="20KB")
    config = json.loads((tmp_path / "s" / "config.json").read_text())
    config["note"] = "kept as written"
    (tmp_path / "s" / "config.json").write_text(json.dumps(config, indent=3))
    out = tmp_path / "out"
    code, text = outcome(lambda: cli.match_main([f"source={tmp_path / 's'}", f"anchor={tmp_path / 'a'}",
                                                 f"output={out}"]))
    assert code == 0, text[-1500:]
    src, matched = ShardedFolder(tmp_path / "s"), ShardedFolder(out)
    assert matched.weight_map == src.weight_map and len(set(src.weight_map.values())) > 1
    assert {k: v.dtype for k, v in matched.meta_state().items()} == {k: v.dtype for k, v in src.meta_state().items()}
    assert all(sharded.data_order(out / s) == sharded.data_order(tmp_path / "s" / s) for s in src.shards())
    assert (out / "config.json").read_bytes() == (tmp_path / "s" / "config.json").read_bytes()
    moved = [k for k in src.weight_map if not torch.equal(src.read([k])[k], matched.read([k])[k])]
    assert moved, "nothing was matched"
    report = json.loads((out / "match.json").read_text())
    assert report["relative_output_change"] <= 4 * torch.finfo(dtype).eps + 1e-3


@pytest.fixture(scope="module")
def vits(tmp_path_factory):
    """ViTs whose config disagrees with the digits task's 1-channel 8x8 images."""
    root = tmp_path_factory.mktemp("vits")
    good = dict(patch_size=4, num_labels=10, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=24)
    for name, shape in (("good", dict(image_size=8, num_channels=1)), ("size", dict(image_size=16, num_channels=1)),
                        ("channels", dict(image_size=8, num_channels=3))):
        for seed in (0, 1):
            model = randomize(tf.ViTForImageClassification(tf.ViTConfig(**good, **shape)), seed)
            model.save_pretrained(str(root / f"{name}{seed}"))
    return root


@pytest.mark.parametrize("wrong", ["size", "channels"])
def test_task_and_model_disagreements_are_one_line(vits, tmp_path, wrong):
    """A ViT for other images on the digits task: transformers' traceback in evaluate and fisher before; now one line
    from the task's check, in every stage that feeds it images."""
    model = vits / f"{wrong}1"
    calls = {
        "evaluate": lambda out: cli.evaluate_main(["task=digits", f"model_dir={model}", f"output={out}"]),
        "merge (fisher)": lambda out: cli.merge_main(["task=digits", "fusion=fisher", "fusion.num_batches=1",
                                                      f"models=[{vits / f'{wrong}0'},{model}]", f"output={out}"]),
        "statistics": lambda out: cli.statistics_main(["task=digits", f"model_dir={model}", "methods=[fisher]",
                                                       f"output={out}.safetensors"]),
        "barrier": lambda out: cli.barrier_main(["task=digits", f"anchor={vits / f'{wrong}0'}", f"source={model}",
                                                 "points=2", "examples=8", f"output={out}"]),
    }
    for name, call in calls.items():
        out = tmp_path / f"{name.split()[0]}.json"
        before = snapshot(vits)
        code, text = outcome(lambda: call(out))
        assert "images" in assert_refused(code, text, tmp_path, {}, out, name)
        assert snapshot(vits) == before


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_leaves_nothing(tmp_path):
    """A real SIGINT while symfusion-match works (after it took its lock): exit 130, one line, no traceback, no
    output, no lock or temp."""
    for seed, name in ((1, "a"), (2, "b")):                # big enough that the work outlasts the signal's delivery
        tiny_model("bert", seed=seed, hidden_size=256, intermediate_size=1024, num_hidden_layers=8,
                   num_attention_heads=8).save_pretrained(str(tmp_path / name))
    out = tmp_path / "out"
    # as from a terminal: SIGINT's default disposition (a test run started in the background, e.g. `bash .ci/run &`,
    # inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler: the match ran to its end)
    process = subprocess.Popen([sys.executable, "-c", "from symfusion.pipeline.cli import match_main as m; m()",
                                f"source={tmp_path / 'b'}", f"anchor={tmp_path / 'a'}", f"output={out}"],
                               stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not (tmp_path / ".out.lock").exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    lines = stderr.strip().splitlines()
    assert process.returncode == cli.INTERRUPTED and len(lines) == 1 and "interrupted" in lines[0], stderr[-1500:]
    assert not out.exists() and leftovers(out) == []


def test_paths_with_spaces_and_non_ascii_letters_are_read_as_written(models, tmp_path):
    """`output=/x/ünï cödé 日本/o'ut` unquoted: written exactly there (it used to blame the KEY=VALUE syntax)."""
    folder = tmp_path / "ünï cödé 日本"
    for name in ("bert_a", "bert_b"):
        shutil.copytree(models / name, folder / f"{name} #1")
    out = folder / "o'ut,1"
    code, text = outcome(lambda: cli.match_main([f"source={folder / 'bert_b #1'}", f"anchor={folder / 'bert_a #1'}",
                                                 f"output={out}"]))
    assert code == 0, text[-1500:]
    assert (out / "match.json").is_file()
    assert sorted(p.name for p in folder.iterdir()) == sorted(["bert_a #1", "bert_b #1", "o'ut,1"])
    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    assert digest != hashlib.sha256((models / "bert_b" / "model.safetensors").read_bytes()).hexdigest()
