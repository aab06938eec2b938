"""Red team, class 3 of issue 36: what an untrusted folder's config.json claims (layer counts, sizes, vocabulary,
positions, head counts, token ids) is checked against the tensors' headers before anything is built from it, so a
claim can cost neither unbounded time nor memory; probes never run past a model's positions.

The class test enumerates the claims from the family registry and fails for a family without a case: for every
family of families.FAMILIES, every integer field of its config.json (whatever transformers' config classes hold,
new ones included) is set to a huge value in both folders, and align() of the folders and symfusion-match (which
loads through transformers) must end in a child process limited to a few GiB and two minutes: a one-line refusal
or a correct result, never a traceback, an out-of-memory death or a time-out.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
from pathlib import Path

import pytest
import torch
import transformers as tf
from safetensors.torch import load_file, save_file

import symfusion
from symfusion.pipeline import cli
from symfusion.pipeline.tasks import make_task
from symfusion.families import FAMILIES
from symfusion.io.modelio import load_model
from symfusion.measures import model_outputs, probe_inputs
from hostile import assert_refused, outcome, snapshot
from tiny_decoders import tiny_decoder
from tiny_models import tiny_model

HUGE = 10**9
# family -> a tiny model of it (seeded); a family without one fails test_every_family_has_a_model
MODELS = {
    "bert": lambda seed: tiny_model("bert", seed=seed), "roberta": lambda seed: tiny_model("roberta", seed=seed),
    "deberta-v2": lambda seed: tiny_model("deberta-v2", seed=seed), "vit": lambda seed: tiny_model("vit", seed=seed),
    **{f: (lambda family: lambda seed: tiny_decoder(family, seed=seed))(f)
       for f in ("llama", "qwen2", "qwen3", "stablelm", "gpt2")},
}
MEMORY = 3 * 2**30          # what a command may add to the test process's address space
SECONDS = 120


def test_every_family_has_a_model():
    assert sorted(MODELS) == sorted(FAMILIES)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("claims")
    for family, build in MODELS.items():
        for seed, side in ((0, "anchor"), (1, "source")):
            build(seed).save_pretrained(str(root / family / side))
    return root


def claims(folder: Path) -> list[str]:
    """The integer fields of a config.json (not flags)."""
    config = json.loads((folder / "config.json").read_text())
    return sorted(k for k, v in config.items() if isinstance(v, int) and not isinstance(v, bool))


def bounded(call) -> tuple:
    """outcome(call) in a forked child with MEMORY more address space and SECONDS of time; ('killed', why) if not."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:                                        # the child: bounded, reports its outcome, never returns
        try:
            os.close(read)
            size = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
            resource.setrlimit(resource.RLIMIT_AS, (size + MEMORY, size + MEMORY))
            signal.alarm(SECONDS)
            result = json.dumps(outcome(call)).encode()
            os.write(write, result)
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as handle:
        data = handle.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        return "killed", f"status {status} (signal {os.WTERMSIG(status) if os.WIFSIGNALED(status) else '-'})"
    return tuple(json.loads(data))


def entry_points(anchor: Path, source: Path, out: Path) -> dict:
    return {"align": lambda: symfusion.align(str(source), str(anchor), output=out / "aligned"),
            "symfusion-match": lambda: cli.match_main([f"source={source}", f"anchor={anchor}", f"output={out / 'm'}"])}


def same_function(source: Path, matched: Path) -> None:
    """The matched folder computes the source folder's function (its claim included) on the probe inputs."""
    before, after = load_model(source), load_model(matched)
    inputs = probe_inputs(before.config)
    deviation = (model_outputs(after, inputs) - model_outputs(before, inputs)).abs().max()
    assert deviation <= 1e-3 * model_outputs(before, inputs).abs().max(), f"{matched}: changed by {float(deviation):.3g}"


# claims that must be accepted through both entry points (they change no shape the weights hold; measured on
# transformers 5): a check that refused every claim would pass the refusal half of the test, not this
ACCEPTED = {"deberta-v2": {"max_relative_positions"}, "gpt2": {"bos_token_id", "eos_token_id"}}


@pytest.mark.slow                                  # bounded children, one per claim and entry point
@pytest.mark.parametrize("family", sorted(MODELS))
def test_every_claim_is_checked_before_it_is_spent(pairs, tmp_path, family):
    fields = claims(pairs / family / "source")
    assert fields, family
    problems, accepted = [], set()
    for field in fields:
        case = tmp_path / field
        for side in ("anchor", "source"):
            shutil.copytree(pairs / family / side, case / side)
            config = json.loads((case / side / "config.json").read_text())
            config[field] = HUGE
            (case / side / "config.json").write_text(json.dumps(config))
        for name, call in entry_points(case / "anchor", case / "source", case / "out").items():
            before, output = snapshot(case, case / "out"), case / "out" / ("aligned" if name == "align" else "m")
            code, text = bounded(call)
            what = f"{family} {field}={HUGE} through {name}"
            if code in ("ok", 0):                          # accepted: the matched folder computes the source's function
                accepted.add((field, name))
                checked, why = bounded(lambda: same_function(case / "source", output))
                if checked != "ok":
                    problems.append(f"{what}: accepted, but {why[-400:]}")
                continue
            try:
                assert_refused(code, text, case, before, output, what)
            except AssertionError as error:
                problems.append(str(error)[:400])
    assert problems == []
    assert accepted >= {(field, name) for field in ACCEPTED.get(family, ()) for name in ("align", "symfusion-match")}


def test_a_probe_never_runs_past_the_models_positions(pairs, tmp_path):
    """A probe longer than a model's positions used to be a traceback (a BERT/RoBERTa/GPT-2 with a short position
    table): every probe is cut to the model's length (families.token_limit), for modules and for folders through
    symfusion-match, whose checks are align()'s (each block; the whole model on measures.probe_inputs)."""
    positions = 12                                       # fewer than the probe's 16 tokens (RoBERTa: 10 usable)
    assert probe_inputs(MODELS["bert"](0).config)["input_ids"].shape[1] > positions
    for family in ("bert", "roberta", "gpt2"):           # learned positions; RoBERTa's start after the padding index
        base = MODELS[family](0).config
        short = base.__class__(**{**base.to_dict(), "max_position_embeddings": positions, "n_positions": positions})
        models = []
        for seed in (0, 1):
            torch.manual_seed(seed)
            models.append(tf.AutoModelForCausalLM.from_config(short) if family == "gpt2" else
                          tf.AutoModelForSequenceClassification.from_config(short))
        matched, report = symfusion.align(models[1], models[0])          # the probe fits the positions
        assert report["relative_output_change"] <= report["tolerance"]
        if family == "bert":                                             # and the same pair as folders
            for model, side in zip(models, ("anchor", "source")):
                model.save_pretrained(str(tmp_path / side))
            out = tmp_path / "m"
            code, text = outcome(lambda: cli.match_main([f"source={tmp_path / 'source'}",
                                                         f"anchor={tmp_path / 'anchor'}", f"output={out}"]))
            assert code == 0, text
            report = json.loads((out / "match.json").read_text())
            assert report["relative_output_change"] <= report["tolerance"]


def test_a_text_task_longer_than_the_models_positions_is_one_line():
    task = make_task("rotten_tomatoes")
    model = tf.AutoModelForSequenceClassification.from_config(tf.BertConfig(
        vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=16))
    with pytest.raises(symfusion.errors.SymfusionError, match="max_length=64 tokens, but the model holds 16"):
        task.check_model(model)


@pytest.mark.slow                                  # bounded children
@pytest.mark.parametrize("family", sorted(MODELS))
def test_a_claim_whose_tensor_is_missing_costs_nothing(pairs, tmp_path, family):
    """The largest tensor removed and every size claim huge: transformers used to allocate the claimed tensor
    (12.8 GB for a BERT vocabulary of 10^8) before refusing it; now the headers refuse it first, within bounds."""
    for side in ("anchor", "source"):
        shutil.copytree(pairs / family / side, tmp_path / side)
        state = load_file(str(tmp_path / side / "model.safetensors"))
        del state[max(state, key=lambda k: state[k].numel())]
        save_file(state, str(tmp_path / side / "model.safetensors"), metadata={"format": "pt"})
        config = json.loads((tmp_path / side / "config.json").read_text())
        config.update({k: HUGE for k in ("vocab_size", "image_size", "intermediate_size", "n_inner") if k in config})
        (tmp_path / side / "config.json").write_text(json.dumps(config))
    for name, call in entry_points(tmp_path / "anchor", tmp_path / "source", tmp_path / "out").items():
        before = snapshot(tmp_path, tmp_path / "out")
        code, text = bounded(call)
        assert_refused(code, text, tmp_path, before, tmp_path / "out" / ("aligned" if name == "align" else "m"),
                       f"{family} through {name}")
