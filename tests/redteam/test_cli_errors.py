"""Every command, driven through its real entry point with careless and hostile input: exit code 2, exactly
one `error: ...` line on stderr, and nothing written or changed on disk."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers as tf
from safetensors.torch import load_file, save_file

from forked import run_forked
from tiny_models import randomize, tiny_model

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def save(model, path):
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def corrupt(good: Path, target: Path, how: str) -> Path:
    """A copy of a model folder, broken in one way."""
    shutil.copytree(good, target)
    weights = target / "model.safetensors"
    if how == "empty":
        weights.write_bytes(b"")
    elif how == "truncated":
        weights.write_bytes(weights.read_bytes()[:200])
    elif how == "config":
        (target / "config.json").write_text("{not json")
    elif how == "shape":
        state = load_file(str(weights))
        key = next(k for k in state if k.endswith("attention.self.query.weight"))
        state[key] = torch.zeros(5, 5)
        save_file(state, str(weights), metadata={"format": "pt"})
    elif how == "missing":
        state = load_file(str(weights))
        del state[next(k for k in state if k.endswith("intermediate.dense.weight"))]
        save_file(state, str(weights), metadata={"format": "pt"})
    elif how == "pickle":
        state = load_file(str(weights))
        weights.unlink()
        torch.save(state, target / "pytorch_model.bin")
    elif how == "vocab":
        config = json.loads((target / "config.json").read_text())
        config["vocab_size"] += 3
        (target / "config.json").write_text(json.dumps(config))
        state = load_file(str(weights))
        key = next(k for k in state if k.endswith("word_embeddings.weight"))
        state[key] = torch.cat([state[key], torch.zeros(3, state[key].shape[1])])
        save_file(state, str(weights), metadata={"format": "pt"})
    return target


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Model folders (BERT pair, ViT pair for digits, broken copies), a report input and a user's folder."""
    root = tmp_path_factory.mktemp("world")
    models = root / "models"
    save(tiny_model("bert", seed=1), models / "anchor")
    source = save(tiny_model("bert", seed=2), models / "source")
    vit_config = tf.ViTConfig(image_size=8, patch_size=4, num_channels=1, num_labels=10, hidden_size=16,
                              num_hidden_layers=1, num_attention_heads=2, intermediate_size=24)
    save(randomize(tf.ViTForImageClassification(vit_config), 0), models / "vit_a")
    save(randomize(tf.ViTForImageClassification(vit_config), 1), models / "vit_b")
    for how in ("empty", "truncated", "config", "shape", "missing", "pickle", "vocab"):
        corrupt(source, models / f"broken_{how}", how)
    labels5 = tiny_model("bert", seed=3)
    labels5.config.num_labels = 5
    save(tf.AutoModelForSequenceClassification.from_config(labels5.config), models / "labels5")
    (root / "mine").mkdir()
    (root / "mine" / "notes.txt").write_text("a user's file, not an output of any stage")
    (root / "not_json.json").write_text("this is not JSON")
    (root / "a_file").write_text("x")
    readonly = root / "readonly"
    readonly.mkdir()
    return root


def bert_cases(root: Path):
    fresh = iter(range(1000))
    m = root / "models"
    a, s = m / "anchor", m / "source"
    pair = [f"source={s}", f"anchor={a}"]
    return [
        ("match", [*pair, f"output={root / f'o{next(fresh)}'}", "matching=foo"], "no such matching option"),
        ("match", [*pair, f"output={root / f'o{next(fresh)}'}", "layers=[a]"], "layers="),
        ("match", [*pair, f"output={root / f'o{next(fresh)}'}", "matching.rescale=maybe"], "matching.rescale"),
        ("match", [*pair, f"output={root / f'o{next(fresh)}'}", "max_relative_output_change=nan"], "finite"),
        ("match", [*pair, f"output={root / f'o{next(fresh)}'}", "matching=full_symmetry", "matching.refine_gains_lr=inf"],
         "matching.refine_gains_lr=inf must be a finite number"),
        ("match", [*pair, f"output={root / f'o{next(fresh)}'}", "matching=full_symmetry", "matching.refine_minimax=[0.3,2]"],
         "matching.refine_minimax=[0.3, 2] must be points 0 <= alpha <= 1"),
        ("match", [*pair, f"output={root / f'o{next(fresh)}'}", "probe.batch_size=0"], "probe.batch_size"),
        ("match", [*pair, f"output={root / f'o{next(fresh)}'}", "matching=full_symmetry", "data_task=digits"],
         "reads the weights only, no data: leave data_task=digits out"),
        ("match", [*pair, f"output={root / f'o{next(fresh)}'}", "matching=full_symmetry_synthetic", "data_task=digits"],
         "runs the models on inputs it makes, no data"),
        ("match", [*pair, f"output={root / f'o{next(fresh)}'}", "matching=full_symmetry", "data_batches=50"],
         "reads the weights only, no data: leave data_batches=50 out"),
        ("match", [*pair, f"output={root / f'o{next(fresh)}'}", "data_split=validation"],      # the default: rotation
         "matching=rotation reads the weights only, no data: leave data_split=validation out"),
        ("match", [*pair, f"output={root / f'o{next(fresh)}'}", "foo=1"], "not an option of symfusion-match"),
        ("match", [*pair, f"output={root / f'o{next(fresh)}'}", "+foo=1"], "not an option of symfusion-match"),
        ("match", [*pair, f"output={root / f'o{next(fresh)}'}", "layers=[0"], "cannot read the command line"),
        ("match", [*pair, f"output={root / f'o{next(fresh)}'}", "--multirun"], "unknown flag"),
        ("match", [*pair, f"output={a}"], "is the input"),
        ("match", [*pair, f"output={s}"], "is the input"),
        ("match", [*pair, f"output={m}"], "contains the input"),
        ("match", [*pair, f"output={a / 'sub'}"], "lies inside the input"),
        ("match", [*pair, f"output={root / 'mine'}"], "did not write"),
        ("match", [*pair, f"output={root / 'a_file' / 'out'}"], "is a file"),
        ("match", [*pair, f"output={Path('/proc/symfusion-out')}"], "choose a writable location"),
        ("match", [f"source={m / 'broken_empty'}", f"anchor={a}", f"output={root / f'o{next(fresh)}'}"], "safetensors"),
        ("match", [f"source={m / 'broken_truncated'}", f"anchor={a}", f"output={root / f'o{next(fresh)}'}"], "safetensors"),
        ("match", [f"source={m / 'broken_config'}", f"anchor={a}", f"output={root / f'o{next(fresh)}'}"], "config"),
        ("match", [f"source={m / 'broken_shape'}", f"anchor={a}", f"output={root / f'o{next(fresh)}'}"], "shape"),
        ("match", [f"source={m / 'broken_missing'}", f"anchor={a}", f"output={root / f'o{next(fresh)}'}"], "lacks"),   # the streamed reader names the tensor
        ("match", [f"source={m / 'broken_pickle'}", f"anchor={a}", f"output={root / f'o{next(fresh)}'}"], "pickled weights"),
        ("match", [f"source={m / 'broken_vocab'}", f"anchor={a}", f"output={root / f'o{next(fresh)}'}"], "vocab_size"),
        ("match", [f"source={m / 'vit_a'}", f"anchor={a}", f"output={root / f'o{next(fresh)}'}"], "different model_type"),
        ("merge", ["fusion=foo", f"models=[{a},{s}]", f"output={root / f'o{next(fresh)}'}"], "no such fusion option"),
        ("merge", ["task=nope", f"models=[{a},{s}]", f"output={root / f'o{next(fresh)}'}"], "no such task option"),
        ("merge", ["task=digits", "fusion=simple", f"models=[{a},{s}]", f"output={root / f'o{next(fresh)}'}"], "reads tokens"),
        ("merge", ["task=digits", "fusion=simple", f"models=[{a},{m / 'labels5'}]", f"output={root / f'o{next(fresh)}'}"],
         "differ in"),
        ("merge", ["task=digits", "fusion=simple", f"models=[{m / 'vit_a'},{m / 'vit_b'}]", f"output={m}"],
         "contains the input"),
        ("evaluate", ["task=digits", f"model_dir={a}", f"output={root / f'e{next(fresh)}.json'}"], "reads tokens"),
        ("evaluate", ["task=digits", f"model_dir={m / 'vit_a'}", f"output={m / 'vit_a' / 'config.json'}"],
         "lies inside the input"),
        ("evaluate", ["task=digits", f"model_dir={m / 'vit_a'}", f"output={root / 'not_json.json'}"],
         "did not write"),
        ("evaluate", ["task=digits", f"model_dir={m / 'vit_a'}", f"output={root / f'e{next(fresh)}.json'}", "split=dev"],
         "split="),
        ("evaluate", ["task=digits", f"model_dir={m / 'vit_a'}", f"output={root / f'e{next(fresh)}.json'}",
                      "task.eval_batch_size=-4"], "task.eval_batch_size"),
        ("barrier", ["task=digits", f"anchor={m / 'vit_a'}", f"source={m / 'vit_b'}", "points=0",
                     f"output={root / f'b{next(fresh)}.json'}"], "points=0"),
        ("barrier", ["task=digits", f"anchor={m / 'vit_a'}", f"source={m / 'vit_b'}", "points=abc",
                     f"output={root / f'b{next(fresh)}.json'}"], "points="),
        ("layers", [f"anchor={m / 'vit_a'}", f"source={m / 'vit_b'}", "tasks=[digits]", f"output={root / 'l.json'}"],
         "tasks="),
        ("multimodel", [f"models=[{a},{s}]", f"output={root / 'r.json'}", f"output_models={root / 'mine'}"],
         "did not write"),
        ("multimodel", [f"models=[{a},{s}]", f"output={root / 'mine'}"], "did not write"),
        ("train", ["task=digits", "model=foo", f"output={root / 't'}"], "no such model option"),
        ("train", ["task=digits", "model=vit_smoke", "seed=-1", f"output={root / 't'}"], "seed=-1"),
        ("train", ["task=digits", "model=minilm", f"output={root / 't'}"], "text encoder"),
        ("train", ["task=digits", "model=vit_smoke", "task.train.lr=0", f"output={root / 't'}"], "task.train.lr"),
        ("data", ["task=digits", f"output={root / 'a_file'}"], "did not write"),
        ("report", ["artefact=table2", f"inputs=[{root / 'not_json.json'}]", f"output={root / 't2.csv'}"],
         "not a JSON result"),
        ("report", ["artefact=table9", f"inputs=[{root / 'not_json.json'}]", f"output={root / 't9.csv'}"],
         "unknown artefact"),
        ("report", ["artefact=table2", f"inputs=[{root / 'not_json.json'}]", f"output={root / 't2.txt'}"],
         "give output="),
    ]


def snapshot(root: Path) -> list:
    return sorted((str(p.relative_to(root)), p.is_dir() or p.read_bytes()) for p in root.rglob("*"))


def run_all(cases: list[tuple[str, list[str]]], out: Path) -> list[subprocess.CompletedProcess]:
    """Each (command, args) run as its own process forked from one that imported what symfusion-worker imports
    (tests/forked.py: 55 fresh interpreters paid the imports 55 times)."""
    return run_forked([(f"symfusion.pipeline.cli:{command}_main", args) for command, args in cases], out, ENV)


@pytest.mark.slow
def test_every_bad_input_is_one_line_exit_2_and_nothing_written(world, tmp_path):
    before = snapshot(world)
    cases = bert_cases(world)
    results = run_all([(command, args) for command, args, _ in cases], tmp_path)
    failures = []
    for (command, args, expected), result in zip(cases, results):
        lines = result.stderr.strip().splitlines()
        if result.returncode != 2 or len(lines) != 1 or not lines[0].startswith("error:") or expected not in lines[0]:
            failures.append(f"symfusion-{command} {' '.join(args[-2:])}: rc {result.returncode}, "
                            f"stderr {result.stderr.strip()[-400:]!r}, expected {expected!r}")
    assert failures == []
    assert snapshot(world) == before


def test_compare_reads_a_hostile_provenance_as_no_record(tmp_path):
    """symfusion-compare reads the run's provenance.json to choose reference/<profile>_vendors (portable=vendors): a
    FIFO (never opened: it would block), a link to a device, a folder, binary bytes, a record of another shape, or a
    COMPATIBLE record with no vendors reference: each a run of the default kind, compared with reference/<profile>,
    in one process that ends, nothing written."""
    row = "method,ours_full\nsimple,52.0\n"
    for folder, text in (("run/p", row), ("reference/p", row), ("reference/p_vendors", "method,ours_full\nsimple,99.0\n")):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "table2.csv").write_text(text)
    (tmp_path / "figs").mkdir()
    provenance = tmp_path / "run" / "p" / "provenance.json"
    hostile = {"fifo": lambda: os.mkfifo(provenance), "device": lambda: provenance.symlink_to("/dev/zero"),
               "folder": lambda: provenance.mkdir(), "binary": lambda: provenance.write_bytes(b"\xff\xfe\x00{"),
               "shape": lambda: provenance.write_text(json.dumps({"machine": ["COMPATIBLE"]}))}
    for name, make in hostile.items():
        make()
        before = sorted(str(p) for p in tmp_path.rglob("*"))
        result = subprocess.run([sys.executable, "-m", "symfusion.pipeline.report.compare", str(tmp_path / "run" / "p"),
                                 "--figures", str(tmp_path / "figs"), "--exact"], capture_output=True, text=True,
                                timeout=120, env=ENV, cwd=tmp_path)
        assert result.returncode == 0 and "reference:" not in result.stdout, (name, result.stdout, result.stderr)
        assert sorted(str(p) for p in tmp_path.rglob("*")) == before, name
        provenance.rmdir() if provenance.is_dir() and not provenance.is_symlink() else provenance.unlink()
    shutil.rmtree(tmp_path / "reference" / "p_vendors")
    provenance.write_text(json.dumps({"machine": {"mkl_cbwr": "COMPATIBLE"}}))
    result = subprocess.run([sys.executable, "-m", "symfusion.pipeline.report.compare", str(tmp_path / "run" / "p"),
                             "--figures", str(tmp_path / "figs"), "--exact"], capture_output=True, text=True,
                            timeout=120, env=ENV, cwd=tmp_path)
    assert result.returncode == 0 and "reference:" not in result.stdout, result.stdout + result.stderr


def test_compare_refuses_bad_usage_in_one_line(world, tmp_path):
    for args, expected in (([str(world / "nope")], "not a directory"),
                           ([str(world / "mine"), "--tolerance", "nan", "--figures", str(world)], "--tolerance"),
                           ([str(world / "mine"), "--reference", str(world / "nope"), "--figures", str(world)],
                            "reference")):
        result = subprocess.run([sys.executable, "-m", "symfusion.pipeline.report.compare", *args], capture_output=True,
                                text=True, timeout=120, env=ENV)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0]
