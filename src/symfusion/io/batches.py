"""What align()'s data must be before a model runs on it: batches of tensors whose ids and labels the model can read.

A batch is a dict of tensors with the model's input (`input_ids`, integer token ids in [0, vocab_size), or
`pixel_values`, finite floats); a mask or token type ids of the same shape as the ids; labels where the loss is
read: integer ids in [0, classes) or -100 (ignored), where classes is the vocabulary of a causal language model and
config.num_labels of a classifier (a one-label regression head takes finite floats). Shapes: a causal language
model's or a token classifier's labels have the ids' shape, a sequence or image classifier's one label per row. A
batch that breaks a rule is one SymfusionError line naming the batch, the key and the rule, instead of an IndexError
deep in torch (or, for an id out of range on some devices, a silent read of another row).
"""
from __future__ import annotations

import torch

from symfusion.errors import SymfusionError

IGNORED = -100                       # the label transformers' losses skip
SAME_SHAPE = ("attention_mask", "token_type_ids")


def _integers(tensor: torch.Tensor) -> bool:
    return not tensor.is_floating_point() and not tensor.is_complex() and tensor.dtype != torch.bool


def _in_range(tensor: torch.Tensor, high: int, ignored: bool = False) -> bool:
    kept = tensor[tensor != IGNORED] if ignored else tensor
    return kept.numel() == 0 or (int(kept.min()) >= 0 and int(kept.max()) < high)


def check_batches(data, model: torch.nn.Module) -> None:
    """Every batch of `data` against what `model` reads (the rules above); the first problem as one line."""
    config = model.config
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    vocab = embedding.num_embeddings if isinstance(embedding, torch.nn.Embedding) else None     # a ViT: patches
    generates = bool(getattr(model, "can_generate", lambda: False)())
    per_token = generates or type(model).__name__.endswith("ForTokenClassification")
    classes = vocab if generates else int(getattr(config, "num_labels", 0) or 0)
    for i, batch in enumerate(data):
        def refuse(key: str, rule: str):
            raise SymfusionError(f"align(): data[{i}][{key!r}] {rule}")
        for key, value in batch.items():
            if not isinstance(value, torch.Tensor):
                refuse(key, f"must be a tensor, got {type(value).__name__}")
        ids = batch.get("input_ids")
        if ids is None and batch.get("pixel_values") is None:
            refuse("input_ids", "is missing: each batch holds the model's input (input_ids or pixel_values)")
        if ids is not None:
            if not _integers(ids) or ids.dim() != 2:
                refuse("input_ids", f"must be a (batch, length) tensor of integer token ids, got {ids.dtype} "
                                    f"{tuple(ids.shape)}")
            if vocab is not None and not _in_range(ids, vocab):
                refuse("input_ids", f"holds ids from {int(ids.min())} to {int(ids.max())}; the model reads ids in "
                                    f"[0, {vocab}) (its vocabulary)")
            for key in SAME_SHAPE:
                if key in batch and tuple(batch[key].shape) != tuple(ids.shape):
                    refuse(key, f"has shape {tuple(batch[key].shape)}, input_ids {tuple(ids.shape)}; they must agree")
        pixels = batch.get("pixel_values")
        if pixels is not None and (not pixels.is_floating_point() or not bool(torch.isfinite(pixels).all())):
            refuse("pixel_values", "must be finite floating point values")
        labels = batch.get("labels")
        if labels is None:
            continue
        rows = (ids if ids is not None else pixels).shape[0]
        wanted = tuple(ids.shape) if per_token and ids is not None else (rows,)
        if tuple(labels.shape) != wanted:
            refuse("labels", f"has shape {tuple(labels.shape)}; this model's loss reads labels of shape {wanted}")
        if not generates and classes == 1:              # a regression head
            if not labels.is_floating_point() or not bool(torch.isfinite(labels).all()):
                refuse("labels", "must be finite floating point targets (the model has one output: a regression)")
            continue
        if not _integers(labels):
            refuse("labels", f"must be integer class ids, got {labels.dtype}")
        if not _in_range(labels, classes, ignored=True):
            kept = labels[labels != IGNORED]
            refuse("labels", f"holds ids from {int(kept.min())} to {int(kept.max())}; the model has {classes} "
                             f"{'tokens' if generates else 'classes'}: ids in [0, {classes}) or {IGNORED} (ignored)")

