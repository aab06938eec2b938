"""Padding-free linears (packing.py): the same loss and gradients as the padded batch, on real tokens only."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf

from symfusion.pipeline.packing import padding_free, token_maps
from symfusion.pipeline.tasks import text_encoding
from symfusion.pipeline.tasks.text_encoding import IGNORE_INDEX, TextDataset, evaluate_text_model
from symfusion.pipeline.uncertainty import scores
from tiny_decoders import tiny_decoder
from tiny_models import tiny_config, tiny_model


def padded_batch(batch: int = 4, length: int = 9, vocab: int = 97, seed: int = 0):
    """input_ids (B, L) with real lengths 9, 3, 6, 1 (pad id 0 after them) and its attention mask."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([length, 3, 6, 1][:batch])
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()             # (B, L)
    ids = torch.randint(1, vocab, (batch, length), generator=gen) * mask
    return ids, mask


def loss_and_grads(model, maps, inputs: dict, packed: bool):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)                                  # the same dropout masks in both runs
    with padding_free(maps if packed else [], inputs["attention_mask"]):
        loss = model(**inputs).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def encoder(family: str, head: str):
    config = tiny_config(family, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    config.num_labels = 3
    torch.manual_seed(0)
    cls = tf.AutoModelForTokenClassification if head == "token" else tf.AutoModelForSequenceClassification
    return cls.from_config(config).double().train()      # train mode: dropout draws masks


@pytest.mark.parametrize("family", ["bert", "roberta"])
@pytest.mark.parametrize("head", ["sequence", "token"])
def test_padding_free_gives_the_padded_batch_loss_and_gradients(family, head):
    model = encoder(family, head)
    ids, mask = padded_batch()
    labels = (torch.randint(0, 3, ids.shape, generator=torch.Generator().manual_seed(1)).masked_fill(mask == 0, -100)
              if head == "token" else torch.tensor([0, 2, 1, 2]))
    inputs = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    maps = token_maps(model)
    assert len(maps) == 6 * model.config.num_hidden_layers       # Q, K, V, O, FFN in, FFN out per layer
    loss, grads = loss_and_grads(model, [], inputs, packed=False)
    packed_loss, packed_grads = loss_and_grads(model, maps, inputs, packed=True)
    torch.testing.assert_close(packed_loss, loss, rtol=1e-12, atol=1e-12)
    assert packed_grads.keys() == grads.keys()
    for name, grad in grads.items():
        if name.endswith("attention.self.key.bias"):     # its exact gradient is 0 (softmax ignores it): rounding
            assert grad.abs().max() < 1e-12 and packed_grads[name].abs().max() < 1e-12
            continue
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-9, atol=1e-12, msg=name)


def test_the_linears_see_the_real_tokens_only_and_the_hooks_go_away():
    model = encoder("bert", "sequence").eval()
    ids, mask = padded_batch()
    maps = token_maps(model)
    seen = []
    with padding_free(maps, mask):
        recorder = maps[0].register_forward_pre_hook(lambda module, args: seen.append(tuple(args[0].shape)))
        out = model(input_ids=ids, attention_mask=mask).logits
        recorder.remove()
    assert seen == [(int(mask.sum()), model.config.hidden_size)]           # (n real tokens, hidden)
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in maps)
    with torch.no_grad():
        torch.testing.assert_close(out, model(input_ids=ids, attention_mask=mask).logits, rtol=1e-12, atol=1e-12)


def test_the_mask_is_what_makes_it_exact():
    """Without the attention mask, padding keys take part in attention: packing then changes the function,
    so the equality above rests on the mask (zeroed padding rows are not the padded rows' values)."""
    model = encoder("bert", "sequence").eval()
    ids, mask = padded_batch()
    maps = token_maps(model)
    with torch.no_grad():
        unmasked = model(input_ids=ids).logits
        with padding_free(maps, mask):
            packed_unmasked = model(input_ids=ids).logits
    assert (packed_unmasked - unmasked).abs().max() > 1e-6       # vs 1e-12 with the mask (above)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_decoders_with_right_padding(family):
    model = tiny_decoder(family).double().train()
    ids, mask = padded_batch(vocab=model.config.vocab_size)
    inputs = {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
    maps = token_maps(model)
    assert maps
    loss, grads = loss_and_grads(model, [], inputs, packed=False)
    packed_loss, packed_grads = loss_and_grads(model, maps, inputs, packed=True)
    torch.testing.assert_close(packed_loss, loss, rtol=1e-12, atol=1e-12)
    for name, grad in grads.items():
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-9, atol=1e-11, msg=name)


def test_families_whose_maps_read_more_than_tokens_run_padded():
    assert token_maps(tiny_model("deberta-v2", share_att_key=True)) == []    # Q/K also project rel. embeddings
    assert token_maps(torch.nn.Linear(3, 3)) == []                           # not a transformers model


def test_a_batch_without_padding_is_left_alone():
    model = encoder("bert", "sequence")
    ids, _ = padded_batch()
    with padding_free(token_maps(model), torch.ones_like(ids)):
        assert all(not m._forward_pre_hooks for m in token_maps(model))


def test_text_evaluation_scores_as_the_padded_batches(monkeypatch):
    """evaluate_text_model packs its length-sorted batches: the same predictions and loss as padded."""
    model = encoder("bert", "sequence").eval()
    gen = torch.Generator().manual_seed(3)
    features = []
    for length in (2, 9, 4, 7, 3, 8, 5):
        ids = torch.randint(1, 97, (length,), generator=gen).tolist()
        features.append({"input_ids": ids, "attention_mask": [1] * length, "labels": length % 3})
    dataset = TextDataset(features, "text_classification", 0)
    maps = token_maps(model)
    calls = []
    handles = [m.register_forward_hook(lambda module, args, out: calls.append(args[0].dim())) for m in maps]
    packed = evaluate_text_model(model, None, dataset, "text_classification", 16, "macro_f1", batch_size=3)
    for handle in handles:
        handle.remove()
    assert 2 in calls                                  # some batches ran packed: (n, hidden) inputs
    monkeypatch.setattr(text_encoding, "token_maps", lambda model: [])
    padded = evaluate_text_model(model, None, dataset, "text_classification", 16, "macro_f1", batch_size=3)
    assert packed["per_example"]["prediction"] == padded["per_example"]["prediction"]
    assert packed["per_example"]["loss"] == pytest.approx(padded["per_example"]["loss"], rel=1e-12)
    assert packed["loss"] == pytest.approx(padded["loss"], rel=1e-12)


@pytest.mark.parametrize("kind", ["text_classification", "regression", "token_classification"])
def test_the_per_example_losses_give_the_evaluations_loss_and_its_bootstrap(kind):
    """Each example's summed loss (and, for tokens, its scored count) reproduces the mean loss the evaluation
    reports, so the bootstrap resamples the very loss a figure plots."""
    config = tiny_config("bert")
    config.num_labels = 1 if kind == "regression" else 3
    torch.manual_seed(0)
    cls = tf.AutoModelForTokenClassification if kind == "token_classification" else tf.AutoModelForSequenceClassification
    model = cls.from_config(config).eval()
    gen = torch.Generator().manual_seed(5)
    features = []
    for length in (2, 9, 4, 7, 3, 8, 5, 6):
        ids = torch.randint(1, 97, (length,), generator=gen).tolist()
        if kind == "token_classification":
            labels = [IGNORE_INDEX if i % 3 == 2 else (i + length) % 3 for i in range(length)]
        else:
            labels = (length / 9) if kind == "regression" else length % 3
        features.append({"input_ids": ids, "attention_mask": [1] * length, "labels": labels})
    metric = {"regression": "pearson_spearman", "text_classification": "macro_f1"}.get(kind, "span_f1")
    result = evaluate_text_model(model, None, TextDataset(features, kind, 0), kind, 16, metric, batch_size=3,
                                 label_names=["O", "B-PER", "I-PER"] if kind == "token_classification" else None)
    record = result["per_example"]
    assert len(record["loss"]) == len(features)
    whole = np.arange(len(features))[None, :]
    assert scores("loss", record, whole)[0] == pytest.approx(result["loss"], rel=1e-12)
    assert ("tokens" in record) == (kind == "token_classification")
    first = np.zeros((1, len(features)), dtype=int)           # a resample of the first example only
    alone = evaluate_text_model(model, None, TextDataset(features[:1], kind, 0), kind, 16, metric,
                                label_names=["O", "B-PER", "I-PER"] if kind == "token_classification" else None)
    assert scores("loss", record, first)[0] == pytest.approx(alone["loss"], rel=1e-6)   # float32, other batches
