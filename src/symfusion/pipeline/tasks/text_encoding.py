"""Text models: tokenise examples into padded batches, score a model with its task metric, swap task heads."""
from __future__ import annotations

import copy
import numbers
import os
from functools import lru_cache, partial
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from symfusion.families import family_spec
from symfusion.pipeline.data.text import KINDS as TEXT_KINDS
from symfusion.errors import SymfusionError
from symfusion.io.modelio import load_model, to_device
from symfusion.pipeline.packing import padding_free, token_maps
from symfusion.pipeline.text_metrics import get_metric

IGNORE_INDEX = -100        # label of special tokens, padding and non-first sub-tokens (ignored by the loss)


class TextDataset(Dataset):
    """Tokenised examples: a list of dicts of int lists (input_ids, attention_mask, ..., labels)."""

    def __init__(self, features: list[dict], kind: str, pad_token_id: int):
        self.features, self.kind, self.pad_token_id = features, kind, pad_token_id

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, index: int) -> dict:
        return self.features[index]


def _check_kind(kind: str) -> None:
    if kind not in TEXT_KINDS:
        raise SymfusionError(f"task kind {kind!r}; choose one of {', '.join(TEXT_KINDS)}")


def _check_label(label, num_labels: int | None, where: str) -> int:
    """The label as an int, refused unless an integer in 0..num_labels-1 (any integer when num_labels is None)."""
    if not isinstance(label, numbers.Integral) or (num_labels is not None and not 0 <= label < num_labels):
        bound = f"0..{num_labels - 1}" if num_labels is not None else "the integers"
        raise SymfusionError(f"{where}: label {label!r} is out of range {bound}; check label_names")
    return int(label)


def _sequence_features(examples: list[dict], tokenizer, kind: str, max_length: int, num_labels) -> list[dict]:
    pairs = [e.get("text_pair") for e in examples]
    if any(p is None for p in pairs) and any(p is not None for p in pairs):
        raise SymfusionError("some examples have a text_pair and others not; a task is all pairs or all single texts")
    texts = [e["text"] for e in examples]
    encoded = tokenizer(texts, pairs if pairs[0] is not None else None, truncation=True, max_length=max_length)
    features = []
    for i, example in enumerate(examples):
        label = example["label"]
        if kind == "regression":
            label = float(label)
        else:
            label = _check_label(label, num_labels, f"example {i}")
        features.append({**{k: v[i] for k, v in encoded.items()}, "labels": label})
    return features


def first_subtoken_labels(word_ids: list, tags: list[int]) -> list[int]:
    """Per token: the word's tag on its first sub-token, IGNORE_INDEX on the other sub-tokens and specials."""
    labels, previous = [], None
    for word in word_ids:
        labels.append(IGNORE_INDEX if word is None or word == previous else tags[word])
        previous = word
    return labels


def _token_features(examples: list[dict], tokenizer, max_length: int, num_labels) -> list[dict]:
    if not getattr(tokenizer, "is_fast", False):
        raise SymfusionError("token classification needs a fast tokenizer (word_ids); the model folder has a slow one")
    words = [e["tokens"] for e in examples]
    encoded = tokenizer(words, is_split_into_words=True, truncation=True, max_length=max_length)
    features = []
    for i, example in enumerate(examples):
        if len(example["tags"]) != len(example["tokens"]):
            raise SymfusionError(f"example {i}: {len(example['tokens'])} tokens but {len(example['tags'])} tags")
        tags = [_check_label(tag, num_labels, f"example {i}") for tag in example["tags"]]
        labels = first_subtoken_labels(encoded.word_ids(i), tags)
        features.append({**{k: v[i] for k, v in encoded.items()}, "labels": labels})
    return features


def encode_examples(examples: list[dict], tokenizer, kind: str, max_length: int,
                    num_labels: int | None = None) -> TextDataset:
    """Tokenise examples (truncated to max_length); labels are checked against num_labels when given."""
    _check_kind(kind)
    if kind == "token_classification":
        features = _token_features(examples, tokenizer, max_length, num_labels)
    else:
        features = _sequence_features(examples, tokenizer, kind, max_length, num_labels)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return TextDataset(features, kind, pad)


def collate_text(batch: list[dict], pad_token_id: int = 0) -> dict:
    """Pad a list of features to the longest in the batch: input_ids with pad_token_id, masks 0, labels -100."""
    length = max(len(f["input_ids"]) for f in batch)
    out = {}
    for key in batch[0]:
        if key == "labels" and not isinstance(batch[0]["labels"], list):
            dtype = torch.float32 if isinstance(batch[0]["labels"], float) else torch.long
            out[key] = torch.tensor([f[key] for f in batch], dtype=dtype)
            continue
        fill = {"input_ids": pad_token_id, "labels": IGNORE_INDEX}.get(key, 0)
        out[key] = torch.tensor([f[key] + [fill] * (length - len(f[key])) for f in batch], dtype=torch.long)
    return out


def text_loader(dataset: TextDataset, batch_size: int, **options) -> DataLoader:
    """A DataLoader over a TextDataset with dynamic padding."""
    collate = partial(collate_text, pad_token_id=dataset.pad_token_id)
    return DataLoader(dataset, batch_size=batch_size, collate_fn=collate, **options)


def statistic_batches_text(examples: list[dict], tokenizer, kind: str, max_length: int, batch_size: int,
                           num_batches: int) -> list[dict]:
    """The first num_batches padded batches of `examples` in their order: data for Fisher / RegMean / OT statistics."""
    dataset = encode_examples(examples[:batch_size * num_batches], tokenizer, kind, max_length)
    return list(text_loader(dataset, batch_size, shuffle=False))


# ---------------------------------------------------------------- evaluation

def _batch_loss_and_outputs(logits: torch.Tensor, labels: torch.Tensor, kind: str):
    """(summed loss in float64, number of scored items, predictions, references, per-example summed losses,
    per-example scored items) of one batch. The per-example losses add up to the batch's sum only to rounding:
    the sum stays torch's own reduction (summing them instead moves the reported loss by an ulp in about half
    the batches), which costs a second loss over the logits, negligible beside the forward pass."""
    if kind == "regression":
        values = logits.squeeze(-1).double()
        each = torch.nn.functional.mse_loss(values, labels.double(), reduction="none")         # (batch,)
        loss = torch.nn.functional.mse_loss(values, labels.double(), reduction="sum")
        return loss.item(), labels.numel(), values.tolist(), labels.tolist(), each.tolist(), [1] * labels.numel()
    if kind == "text_classification":
        each = torch.nn.functional.cross_entropy(logits.double(), labels, reduction="none")     # (batch,)
        loss = torch.nn.functional.cross_entropy(logits.double(), labels, reduction="sum")
        return (loss.item(), labels.numel(), logits.argmax(-1).tolist(), labels.tolist(), each.tolist(),
                [1] * labels.numel())
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).double(), labels.flatten(),
                                             ignore_index=IGNORE_INDEX, reduction="sum")
    each = torch.nn.functional.cross_entropy(logits.double().transpose(1, 2), labels, ignore_index=IGNORE_INDEX,
                                             reduction="none")                                  # (batch, tokens)
    keep, best = labels != IGNORE_INDEX, logits.argmax(-1)
    predictions = [best[i][keep[i]].tolist() for i in range(labels.shape[0])]
    references = [labels[i][keep[i]].tolist() for i in range(labels.shape[0])]
    return (loss.item(), int(keep.sum()), predictions, references, each.sum(dim=1).tolist(),
            keep.sum(dim=1).tolist())


def length_order(dataset: TextDataset) -> list[int]:
    """Example indices shortest first, so that batches pad little (every metric here is order-free)."""
    return sorted(range(len(dataset)), key=lambda i: len(dataset.features[i]["input_ids"]))


def per_example_record(kind: str, predictions: list, references: list, order: list[int],
                       losses: tuple[list, list] | None = None) -> dict:
    """What the bootstrap of the task metric needs per example (uncertainty.py), in the examples' own order:
    predicted and reference labels or values, or per sentence the entity spans predicted, gold and matched;
    with `losses` (per-example summed loss, scored items), also "loss" and, for token classification,
    "tokens" (the loss is then the token-weighted mean, as the evaluation's)."""
    def original(values: list) -> list:
        placed = [None] * len(values)
        for position, index in enumerate(order):
            placed[index] = values[position]
        return placed
    loss = {}
    if losses is not None:
        loss = {"loss": original(losses[0])}
        if kind == "token_classification":
            loss["tokens"] = original(losses[1])
    if kind != "token_classification":
        return {"prediction": original(predictions), "reference": original(references), **loss}
    from seqeval.metrics.sequence_labeling import get_entities   # a pipeline package, as in text_metrics

    tp, predicted, gold = [], [], []
    for reference, prediction in zip(references, predictions):
        gold_spans, predicted_spans = set(get_entities(reference)), set(get_entities(prediction))
        tp.append(len(gold_spans & predicted_spans))
        predicted.append(len(predicted_spans))
        gold.append(len(gold_spans))
    return {"tp": original(tp), "predicted": original(predicted), "gold": original(gold), **loss}


def _tag_names(model, label_names) -> list[str]:
    if label_names is not None:
        return list(label_names)
    id2label = getattr(model.config, "id2label", None) or {}
    return [id2label[i] for i in range(len(id2label))]


@torch.inference_mode()
def evaluate_text_model(model: torch.nn.Module, tokenizer, examples, kind: str, max_length: int, metric: str,
                        batch_size: int = 64, label_names: list[str] | None = None) -> dict:
    """The metric's entries plus "loss", "n" and "per_example" (the bootstrap's record, uncertainty.py) of
    `model` on `examples` (or an encoded TextDataset); eval mode.

    "loss" is the mean of the model's own loss over examples (cross-entropy; MSE for regression) or,
    for token classification, over the scored first sub-tokens; "n" counts examples. Token
    classification is scored on the words that survive truncation to max_length; tag names come from
    `label_names`, else from the model config's id2label.
    """
    _check_kind(kind)
    score = get_metric(metric, kind)
    dataset = examples if isinstance(examples, TextDataset) else encode_examples(examples, tokenizer, kind, max_length)
    if len(dataset) == 0:
        raise SymfusionError("the evaluation split is empty; check the task's limit settings")
    model.eval()
    device = next(model.parameters()).device
    loss_sum, count, predictions, references, example_losses, example_items = 0.0, 0, [], [], [], []
    order = length_order(dataset)
    ordered = TextDataset([dataset.features[i] for i in order], dataset.kind, dataset.pad_token_id)
    maps = token_maps(model)                   # sorted batches still pad: their linears skip it (packing.py)
    for batch in text_loader(ordered, batch_size, shuffle=False):
        labels = batch.pop("labels")
        batch = to_device(batch, device)
        with padding_free(maps, batch.get("attention_mask")):
            logits = model(**batch).logits.cpu()
        parts = _batch_loss_and_outputs(logits, labels, kind)
        loss_sum, count = loss_sum + parts[0], count + parts[1]
        predictions += parts[2]
        references += parts[3]
        example_losses += parts[4]
        example_items += parts[5]
    if kind == "token_classification":
        names = _tag_names(model, label_names)
        predictions = [[names[t] for t in row] for row in predictions]
        references = [[names[t] for t in row] for row in references]
    return {**score(references, predictions), "loss": loss_sum / max(count, 1), "n": len(dataset),
            "per_example": per_example_record(kind, predictions, references, order, (example_losses, example_items))}


# ---------------------------------------------------------------- task heads

def head_keys(model: torch.nn.Module) -> list[str]:
    """State-dict keys of the task head: everything outside the family's body (BERT's pooler stays body)."""
    return family_spec(model.config).head_keys(model.state_dict())


@lru_cache(maxsize=4)
def _donor_head(head_dir: str) -> tuple[str, str, dict, dict]:
    """(class name, base prefix, head tensors, label fields) of a fine-tuned model folder, read once per process."""
    donor = load_model(head_dir)
    state = donor.state_dict()
    head = {key: state[key].detach().clone() for key in head_keys(donor)}
    labels = {field: getattr(donor.config, field) for field in ("id2label", "label2id", "problem_type")}
    return type(donor).__name__, donor.base_model_prefix, head, labels


def copy_head(model: torch.nn.Module, head_dir: str | Path) -> list[str]:
    """Replace `model`'s task head (and its id2label / label2id) by the one in head_dir; returns the keys copied."""
    theirs, prefix, donor_state, labels = _donor_head(os.path.realpath(head_dir))
    ours = type(model).__name__
    if ours != theirs or prefix != model.base_model_prefix:
        raise SymfusionError(f"{head_dir} holds a {theirs}, not a {ours}; take the head from a model of the same task")
    keys, state = head_keys(model), model.state_dict()
    if sorted(keys) != sorted(donor_state):
        raise SymfusionError(f"{head_dir}: head tensors {sorted(donor_state)} differ from {sorted(keys)}")
    for key in keys:
        if donor_state[key].shape != state[key].shape:
            raise SymfusionError(f"{head_dir}: head tensor {key} has shape {tuple(donor_state[key].shape)}, "
                                 f"the model expects {tuple(state[key].shape)}; same number of labels needed")
    with torch.no_grad():
        for key in keys:
            state[key].copy_(donor_state[key])
    for field, value in labels.items():
        setattr(model.config, field, copy.deepcopy(value))
    return keys
