"""Text fine-tuning and evaluation: tokenisation, learning on toy tasks, seeding, resume, best epoch, head swaps."""
import json
import random
from dataclasses import dataclass

import pytest
import torch
import transformers as tf
from safetensors.torch import load_file

import symfusion.pipeline.tasks.text as train_text
from symfusion.errors import SymfusionError
from symfusion.pipeline.tasks.text_encoding import (IGNORE_INDEX, collate_text, copy_head, encode_examples, evaluate_text_model,
                                     head_keys, statistic_batches_text)
from symfusion.io.modelio import load_model
from symfusion.pipeline.tasks.text import finetune_text_model
from tiny_models import tiny_config

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
FILLER = ["the", "a", "movie", "film", "plot", "actor", "is", "was", "very", "story", "and", "to", "in", "met"]
VOCAB = SPECIALS + FILLER + ["good", "great", "alice", "bob", "paris", "new", "york", "ber", "##lin"]
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
ENTITIES = [(["alice"], ["B-PER"]), (["bob"], ["B-PER"]), (["paris"], ["B-LOC"]), (["berlin"], ["B-LOC"]),
            (["new", "york"], ["B-LOC", "I-LOC"])]


@dataclass
class Splits:
    """The TextSplits interface of symfusion.pipeline.data.text (kind, splits, label_names)."""
    kind: str
    splits: dict
    label_names: list | None


def _words(rng, n):
    return [rng.choice(FILLER) for _ in range(n)]


def classification_example(rng, i):
    """Class 1 iff the keyword "good" occurs."""
    words = _words(rng, rng.randint(3, 7))
    if i % 2:
        words.insert(rng.randrange(len(words) + 1), "good")
    return {"text": " ".join(words), "label": i % 2}


def regression_example(rng, i):
    """A sentence pair whose score is the number of "great" in both parts (0, 1 or 2)."""
    first, second = _words(rng, rng.randint(2, 5)), _words(rng, rng.randint(2, 5))
    if i % 3 >= 1:
        first.insert(rng.randrange(len(first) + 1), "great")
    if i % 3 == 2:
        second.insert(rng.randrange(len(second) + 1), "great")
    return {"text": " ".join(first), "text_pair": " ".join(second), "label": float(i % 3)}


def token_example(rng, i):
    """Filler words tagged O around one entity (names are B-PER, cities B-LOC / I-LOC; "berlin" is 2 sub-tokens)."""
    words = _words(rng, rng.randint(1, 4))
    entity, entity_tags = ENTITIES[i % len(ENTITIES)]
    at = rng.randrange(len(words) + 1)
    words[at:at] = entity
    tags = ["O"] * len(words)
    tags[at:at + len(entity)] = entity_tags
    return {"tokens": words, "tags": [TAGS.index(t) for t in tags]}


MAKERS = {"text_classification": (classification_example, ["negative", "positive"], "macro_f1"),
          "regression": (regression_example, None, "pearson_spearman"),
          "token_classification": (token_example, TAGS, "span_f1")}


def toy_splits(kind, n_train=96, n_validation=32):
    make, names, _ = MAKERS[kind]
    rng = random.Random(0)
    examples = [make(rng, i) for i in range(n_train + n_validation)]
    return Splits(kind, {"train": examples[:n_train], "validation": examples[n_train:]}, names)


def tokenizer():
    return tf.BertTokenizerFast(vocab={w: i for i, w in enumerate(VOCAB)})


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models on one thread: two intra-op threads on a busy 2-core machine are up to 10x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """A tiny random BERT encoder and its tokenizer saved as a local model folder."""
    folder = tmp_path_factory.mktemp("base") / "tiny-bert"
    torch.manual_seed(0)
    tf.BertModel(tiny_config("bert")).save_pretrained(str(folder))
    tokenizer().save_pretrained(str(folder))
    return folder


def finetune(base_dir, out, kind="text_classification", epochs=3, seed=0, lr=3e-3, **overrides):
    options = dict(seed=seed, epochs=epochs, batch_size=16, lr=lr, weight_decay=0.01, warmup_ratio=0.06,
                   max_length=32, metric=MAKERS[kind][2], eval_batch_size=32)
    options.update(overrides)
    return finetune_text_model(str(out), str(base_dir), toy_splits(kind), **options)


def weights(folder):
    return load_file(str(folder / "model.safetensors"))


# ---------------------------------------------------------------- tokenisation

def test_first_subtoken_carries_the_word_tag_and_the_rest_are_ignored():
    example = {"tokens": ["alice", "met", "berlin", "and", "new", "york"], "tags": [1, 0, 3, 0, 3, 4]}
    feature = encode_examples([example], tokenizer(), "token_classification", 32, len(TAGS))[0]
    pieces = [VOCAB[i] for i in feature["input_ids"]]
    assert pieces == ["[CLS]", "alice", "met", "ber", "##lin", "and", "new", "york", "[SEP]"]
    assert feature["labels"] == [IGNORE_INDEX, 1, 0, 3, IGNORE_INDEX, 0, 3, 4, IGNORE_INDEX]


def test_collate_pads_dynamically_and_keeps_label_types():
    tok = tokenizer()
    tokens = [{"tokens": ["alice"], "tags": [1]}, {"tokens": ["the", "berlin", "film"], "tags": [0, 3, 0]}]
    batch = collate_text(list(encode_examples(tokens, tok, "token_classification", 32)), tok.pad_token_id)
    assert batch["input_ids"].shape == (2, 6) and batch["attention_mask"][0].tolist() == [1, 1, 1, 0, 0, 0]
    assert batch["labels"][0].tolist() == [IGNORE_INDEX, 1, IGNORE_INDEX] + [IGNORE_INDEX] * 3
    pairs = [{"text": "the film", "text_pair": "great", "label": 1.0}, {"text": "a", "text_pair": "b", "label": 0}]
    batch = collate_text(list(encode_examples(pairs, tok, "regression", 32)), tok.pad_token_id)
    assert batch["labels"].dtype == torch.float32 and batch["token_type_ids"][0].tolist() == [0, 0, 0, 0, 1, 1]


def test_truncation_to_max_length():
    example = {"text": " ".join(["the"] * 50), "label": 0}
    assert len(encode_examples([example], tokenizer(), "text_classification", 8)[0]["input_ids"]) == 8


def test_statistic_batches_are_the_first_examples_in_order():
    examples = toy_splits("text_classification").splits["train"]
    batches = statistic_batches_text(examples, tokenizer(), "text_classification", 32, batch_size=8, num_batches=3)
    assert len(batches) == 3 and all(b["input_ids"].shape[0] == 8 for b in batches)
    assert torch.cat([b["labels"] for b in batches]).tolist() == [e["label"] for e in examples[:24]]
    again = statistic_batches_text(examples, tokenizer(), "text_classification", 32, batch_size=8, num_batches=3)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(batches, again))


def test_labels_out_of_range_are_refused():
    tok = tokenizer()
    with pytest.raises(SymfusionError, match="out of range"):
        encode_examples([{"text": "the", "label": 2}], tok, "text_classification", 32, num_labels=2)
    with pytest.raises(SymfusionError, match="out of range"):
        encode_examples([{"tokens": ["the"], "tags": [7]}], tok, "token_classification", 32, num_labels=5)
    with pytest.raises(SymfusionError, match="tags"):
        encode_examples([{"tokens": ["the", "a"], "tags": [0]}], tok, "token_classification", 32)
    with pytest.raises(SymfusionError, match="task kind"):
        encode_examples([{"text": "the", "label": 0}], tok, "summarization", 32)


# ---------------------------------------------------------------- fine-tuning

@pytest.mark.parametrize("kind", list(MAKERS))
def test_learning_beats_chance_on_a_separable_toy_task(base_dir, tmp_path, kind):
    lr, chance_beaten = {"text_classification": (3e-3, 0.9), "regression": (1e-2, 0.75),
                         "token_classification": (1e-2, 0.9)}[kind]
    report = finetune(base_dir, tmp_path / "model", kind=kind, epochs=6, lr=lr)
    assert report["validation_score"] > chance_beaten
    folder = tmp_path / "model"
    saved = json.loads((folder / "train.json").read_text())
    assert saved["best_epoch"] == report["best_epoch"] and saved["num_parameters"] > 0
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    assert not (tmp_path / ".model.checkpoint").exists()                   # removed after success
    model = load_model(folder)                                             # reloads as the fine-tuned class
    expected = {"text_classification": "BertForSequenceClassification", "regression": "BertForSequenceClassification",
                "token_classification": "BertForTokenClassification"}[kind]
    assert type(model).__name__ == expected
    splits = toy_splits(kind)
    scores = evaluate_text_model(model, tf.AutoTokenizer.from_pretrained(str(folder)), splits.splits["validation"],
                                 kind, 32, MAKERS[kind][2], batch_size=7)
    # batch 7 pads differently from batch 32: float sums differ in the last digits
    assert scores["score"] == pytest.approx(report["validation_score"], abs=1e-4) and scores["n"] == 32


def test_same_seed_same_weights_other_seed_other_weights(base_dir, tmp_path):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        finetune(base_dir, tmp_path / name, epochs=1, seed=seed)
    a, b, c = weights(tmp_path / "a"), weights(tmp_path / "b"), weights(tmp_path / "c")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_interrupted_run_resumes_from_its_checkpoint_to_identical_weights(base_dir, tmp_path, monkeypatch):
    uninterrupted = finetune(base_dir, tmp_path / "full")
    real_evaluate, calls = train_text.evaluate_text_model, []

    def interrupt_in_second_epoch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(train_text, "evaluate_text_model", interrupt_in_second_epoch)
    with pytest.raises(KeyboardInterrupt):
        finetune(base_dir, tmp_path / "resumed")
    assert not (tmp_path / "resumed").exists() and (tmp_path / ".resumed.checkpoint").is_dir()
    monkeypatch.setattr(train_text, "evaluate_text_model", real_evaluate)
    report = finetune(base_dir, tmp_path / "resumed")
    assert report["resumed_after_epoch"] == 1
    assert report["history"] == uninterrupted["history"]
    full, resumed = weights(tmp_path / "full"), weights(tmp_path / "resumed")
    assert all(torch.equal(full[k], resumed[k]) for k in full)


def test_a_checkpoint_of_another_configuration_is_ignored(base_dir, tmp_path, monkeypatch):
    real_evaluate = train_text.evaluate_text_model
    monkeypatch.setattr(train_text, "evaluate_text_model", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        finetune(base_dir, tmp_path / "model", seed=5)
    monkeypatch.setattr(train_text, "evaluate_text_model", real_evaluate)
    assert finetune(base_dir, tmp_path / "model", epochs=1)["resumed_after_epoch"] is None


def test_the_best_validation_epoch_is_kept(base_dir, tmp_path, monkeypatch):
    scores, snapshots = iter([0.2, 0.9, float("nan"), 0.5]), []

    def scripted(model, *args, **kwargs):
        snapshots.append({k: v.cpu().clone() for k, v in model.state_dict().items()})   # saved weights are on the CPU
        return {"score": next(scores), "loss": 1.0, "n": 32}

    monkeypatch.setattr(train_text, "evaluate_text_model", scripted)
    report = finetune(base_dir, tmp_path / "model", epochs=4)
    assert report["best_epoch"] == 2 and report["validation_score"] == 0.9
    saved = weights(tmp_path / "model")
    assert all(torch.equal(saved[k], snapshots[1][k]) for k in saved)
    assert not all(torch.equal(saved[k], snapshots[3][k]) for k in saved)


def test_bad_inputs_are_refused(base_dir, tmp_path):
    with pytest.raises(SymfusionError, match="unknown metric"):
        finetune(base_dir, tmp_path / "m", metric="bleu")
    with pytest.raises(SymfusionError, match="scores"):
        finetune(base_dir, tmp_path / "m", metric="span_f1")
    with pytest.raises(SymfusionError, match="does not exist"):
        finetune(tmp_path / "no-such-model", tmp_path / "m")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SymfusionError, match="no config.json"):
        finetune(tmp_path / "empty", tmp_path / "m")
    splits = toy_splits("text_classification")
    splits.splits["train"][3] = {"text": "the film", "label": 2}
    with pytest.raises(SymfusionError, match="out of range"):
        finetune_text_model(str(tmp_path / "m"), str(base_dir), splits, 0, 1, 16, 1e-3, 0.0, 0.1, 32, "macro_f1")
    assert not (tmp_path / "m").exists()


# ---------------------------------------------------------------- evaluation and head swaps

def _model(kind, seed):
    config = tiny_config("bert", num_labels=1 if kind == "regression" else len(TAGS))
    config.vocab_size = len(VOCAB)
    torch.manual_seed(seed)
    cls = tf.BertForTokenClassification if kind == "token_classification" else tf.BertForSequenceClassification
    return cls(config).eval()


@pytest.mark.parametrize("kind", list(MAKERS))
def test_evaluation_loss_is_the_model_loss(kind):
    model, tok = _model(kind, 0), tokenizer()
    examples = toy_splits(kind, n_train=0, n_validation=12).splits["validation"]
    if kind == "text_classification":
        examples = [dict(e, label=e["label"] + 2 * (i % 2)) for i, e in enumerate(examples)]   # 4 of the 5 classes
    result = evaluate_text_model(model, tok, examples, kind, 32, MAKERS[kind][2], batch_size=12, label_names=TAGS)
    batch = collate_text(list(encode_examples(examples, tok, kind, 32)), tok.pad_token_id)
    with torch.no_grad():
        expected = model(**batch).loss.item()
    assert result["loss"] == pytest.approx(expected, rel=1e-5) and result["n"] == 12 and "score" in result


def test_copy_head_swaps_exactly_the_head_keys(tmp_path):
    model, donor = _model("text_classification", 0), _model("text_classification", 1)
    donor.config.id2label = {i: f"class-{i}" for i in range(len(TAGS))}
    donor.config.label2id = {v: k for k, v in donor.config.id2label.items()}
    donor.save_pretrained(str(tmp_path / "donor"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    copied = copy_head(model, tmp_path / "donor")
    assert sorted(copied) == ["classifier.bias", "classifier.weight"] == sorted(head_keys(model))
    after, theirs = model.state_dict(), donor.state_dict()
    for key in after:
        assert torch.equal(after[key], theirs[key] if key in copied else before[key]), key
    assert "bert.pooler.dense.weight" in after and model.config.id2label[0] == "class-0"


def test_copy_head_refuses_another_architecture_or_label_count(tmp_path):
    model = _model("text_classification", 0)
    _model("token_classification", 1).save_pretrained(str(tmp_path / "token"))
    with pytest.raises(SymfusionError, match="same task"):
        copy_head(model, tmp_path / "token")
    _model("regression", 1).save_pretrained(str(tmp_path / "regression"))
    with pytest.raises(SymfusionError, match="shape"):
        copy_head(model, tmp_path / "regression")
    with pytest.raises(SymfusionError, match="config.json"):
        copy_head(model, tmp_path / "nothing")
