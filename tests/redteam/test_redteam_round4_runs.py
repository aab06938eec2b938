"""Red team, round four (issue 55), class 3: a training checkpoint is resumed only by the run that made it.

Every trainer that calls training.fit (found by an AST scan: TRAINERS) is run with a spy in place of
load_checkpoint that records the fingerprint a resume would be checked against and stops the run before any
training. For each trainer, every change that decides training (the data's content, the split, the base
weights, the shapes, the seed) gives another fingerprint, and the same run gives the same one (so the test
can fail both ways). A new trainer fails here until it has its cases.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
import transformers as tf

from symfusion.pipeline import training
from symfusion.pipeline.data.images import ImageDataset
from symfusion.pipeline.tasks.image import train_image_classifier
from symfusion.pipeline.tasks.lm_models import train_causal_lm
from symfusion.pipeline.tasks.text import finetune_text_model
from test_train_text import tokenizer as bert_tokenizer, toy_splits
from tiny_decoders import tiny_decoder
from tiny_models import tiny_model

SRC = Path(__file__).resolve().parents[2] / "src" / "symfusion"


class Stopped(Exception):
    """Raised by the spy: the fingerprint is known, the run need not train."""


@pytest.fixture
def fingerprint_of(monkeypatch):
    """fingerprint_of(call) -> the fingerprint fit checks a checkpoint against, for call()."""
    seen = []

    def spy(path, model, optimizer, fingerprint, generator):
        seen.append(fingerprint)
        raise Stopped

    monkeypatch.setattr(training, "load_checkpoint", spy)

    def run(call):
        with pytest.raises(Stopped):
            call()
        return seen[-1]
    return run


# ---------------------------------------------------------------- one call per trainer, with one thing changed

def _images(seed: int, n: int, size: int = 8, classes: int = 3):
    generator = torch.Generator().manual_seed(seed)
    return ImageDataset(torch.randn(n, 1, size, size, generator=generator),
                        torch.arange(n) % classes)


VIT = {"patch_size": 4, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 24}


def vit_run(tmp: Path, change: str):
    train, validation = _images(0, 32), _images(1, 16)
    model_cfg = dict(VIT)
    seed = 0
    if change == "data":
        train.pixels[0, 0, 0, 0] += 1.0
    elif change == "split":
        validation = _images(2, 16)
    elif change == "labels":
        train.labels[0] = (train.labels[0] + 1) % 3
    elif change == "shapes":
        model_cfg["intermediate_size"] = 32
    elif change == "seed":
        seed = 1
    return lambda: train_image_classifier(str(tmp / "vit"), {"train": train, "validation": validation}, model_cfg,
                                          seed=seed, epochs=1, batch_size=8, lr=1e-3, weight_decay=0.0,
                                          warmup_ratio=0.0)


def _bert_base(folder: Path, bump: float = 0.0) -> Path:
    """A tiny BERT base with its tokenizer at `folder`; bump != 0 rewrites its weights in place (same path)."""
    if not folder.exists() or bump:
        model = tiny_model("bert", seed=1, head=None)
        with torch.no_grad():
            model.embeddings.word_embeddings.weight[0, 0] += bump
        model.save_pretrained(str(folder))
        bert_tokenizer().save_pretrained(str(folder))
    return folder


def text_run(tmp: Path, change: str):
    base = _bert_base(tmp / "bert")
    splits = toy_splits("text_classification", 32, 16)
    seed = 0
    if change == "data":
        splits.splits["train"][0] = {**splits.splits["train"][0], "text": "a different sentence"}
    elif change == "split":
        splits.splits["validation"] = splits.splits["validation"][1:] + splits.splits["train"][:1]
    elif change == "labels":
        splits.splits["train"][0] = {**splits.splits["train"][0], "label": 1 - splits.splits["train"][0]["label"]}
    elif change == "base":
        base = _bert_base(tmp / "bert", bump=0.5)       # the same folder, its weights changed in place
    elif change == "shapes":
        splits.label_names = ["negative", "positive", "neutral"]
    elif change == "seed":
        seed = 1
    return lambda: finetune_text_model(str(tmp / "text"), str(base), splits, seed=seed, epochs=1, batch_size=16,
                                       lr=1e-3, weight_decay=0.0, warmup_ratio=0.0, max_length=16,
                                       metric="macro_f1", eval_batch_size=16)


def causal_run(tmp: Path, change: str):
    generator = torch.Generator().manual_seed(0)
    train, validation = torch.randint(0, 97, (16, 8), generator=generator), torch.randint(0, 97, (4, 8), generator=generator)
    bump, seed, overrides = 0.0, 0, {}
    if change == "data":
        train[0, 0] = (train[0, 0] + 1) % 97
    elif change == "split":
        validation = torch.roll(validation, 1, 0)
    elif change == "base":
        bump = 0.5
    elif change == "shapes":
        overrides = {"intermediate_size": 128}
    elif change == "seed":
        seed = 1

    def build():
        model = tiny_decoder("llama", seed=0, **overrides)
        with torch.no_grad():
            model.model.embed_tokens.weight[0, 0] += bump
        return model

    tokenizer = tf.PreTrainedTokenizerFast(tokenizer_object=bert_tokenizer().backend_tokenizer)
    return lambda: train_causal_lm(str(tmp / "lm"), build, tokenizer, train, validation, seed=seed, epochs=1,
                                   batch_size=4, lr=1e-3, weight_decay=0.0, warmup_ratio=0.0,
                                   record={"task": "toy"})


# trainer (the function that calls fit) -> (run(tmp, change) -> call, the changes that decide its training)
TRAINERS = {
    "symfusion.pipeline.tasks.image:_train_vit": (vit_run, ["data", "split", "labels", "shapes", "seed"]),
    "symfusion.pipeline.tasks.text:_finetune": (text_run, ["data", "split", "labels", "base", "shapes", "seed"]),
    "symfusion.pipeline.tasks.lm_models:_train": (causal_run, ["data", "split", "base", "shapes", "seed"]),
}


def scanned_trainers() -> set[str]:
    """module:function of every function in src/symfusion that calls fit(...)."""
    found = set()
    for path in sorted(SRC.rglob("*.py")):
        module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "fit"
                    for c in ast.walk(node)):
                found.add(f"{module}:{node.name}")
    return found


def test_every_trainer_has_fingerprint_cases():
    """A new trainer (a function calling fit) fails here until TRAINERS gives it its changes."""
    assert scanned_trainers() == set(TRAINERS)


CASES = [(trainer, change) for trainer, (_, changes) in TRAINERS.items() for change in changes]


@pytest.mark.parametrize("trainer,change", CASES, ids=[f"{t.split(':')[1]}-{c}" for t, c in CASES])
def test_a_checkpoint_is_resumed_only_by_the_run_that_made_it(tmp_path, fingerprint_of, trainer, change):
    """The same run twice: one fingerprint; one thing that decides training changed: another."""
    run = TRAINERS[trainer][0]
    torch.set_num_threads(1)
    first = fingerprint_of(run(tmp_path, "none"))
    assert fingerprint_of(run(tmp_path, "none")) == first, f"{trainer}: the same run, another fingerprint"
    assert fingerprint_of(run(tmp_path, change)) != first, f"{trainer}: {change} changed, the fingerprint did not"
    assert not (tmp_path / "vit").exists() and not (tmp_path / "text").exists() and not (tmp_path / "lm").exists()
