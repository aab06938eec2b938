"""OT fusion undoes a planted permutation of every basis (residual stream, FFN neurons, head coordinates)."""
import copy

import pytest
import torch
import transformers as tf

from symfusion.arch import layout_of
from symfusion.errors import SymfusionError
from symfusion.fusion import merge_models
from symfusion.fusion.ot import merge_acts, merge_acts_emd, merge_wts
from tiny_models import VARIANT_IDS, VARIANTS, tiny_config, tiny_model

# The oracle, written independently of ot.py: residual axes of the tensors outside the layers.
# If it missed a tensor, the planted model would not compute the same logits.
_TEXT = {
    "embeddings.word_embeddings.weight": (1,), "embeddings.position_embeddings.weight": (1,),
    "embeddings.token_type_embeddings.weight": (1,), "LayerNorm.weight": (0,), "LayerNorm.bias": (0,),
    "pooler.dense.weight": (0, 1), "pooler.dense.bias": (0,), "classifier.weight": (1,),
    "classifier.dense.weight": (0, 1), "classifier.dense.bias": (0,), "classifier.out_proj.weight": (1,),
    "rel_embeddings.weight": (1,),
}
ORACLE = {
    "bert": _TEXT, "roberta": _TEXT, "deberta-v2": _TEXT,
    "vit": {
        "cls_token": (2,), "embeddings.position_embeddings": (2,), "projection.weight": (0,),
        "projection.bias": (0,), "layernorm_before.weight": (0,), "layernorm_before.bias": (0,),
        "layernorm_after.weight": (0,), "layernorm_after.bias": (0,), "layernorm.weight": (0,),
        "layernorm.bias": (0,), "classifier.weight": (1,),
    },
}


def batches_for(family, seed=0, count=2, size=6, seq=9):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        labels = torch.randint(0, 3, (size,), generator=gen)
        if family == "vit":
            out.append({"pixel_values": torch.randn(size, 3, 8, 8, generator=gen), "labels": labels})
            continue
        lengths = torch.randint(3, seq + 1, (size,), generator=gen)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()           # (size, seq), right padding
        batch = {"input_ids": torch.randint(2, 97, (size, seq), generator=gen) * mask, "attention_mask": mask,
                 "labels": labels}
        if family == "bert":
            batch["token_type_ids"] = torch.randint(0, 2, (size, seq), generator=gen)
        out.append(batch)
    return out


@torch.no_grad()
def logits(model, batches):
    return torch.cat([model(**{k: v for k, v in b.items() if k != "labels"}).logits for b in batches])


def loaded(model, state):
    clone = copy.deepcopy(model)
    clone.load_state_dict(state)
    return clone


def _take(tensor, index, axis):
    return tensor.index_select(axis, index)


def _head_index(perm):
    """Per-head permutations (heads, d) as one index over the heads*d rows."""
    heads, d = perm.shape
    return (torch.arange(heads)[:, None] * d + perm).reshape(-1)


def planted(model, seed=7):
    """A copy with the residual stream, each FFN's neurons and each head's coordinates permuted."""
    state = model.state_dict()
    layout = layout_of(model.config, state)
    gen = torch.Generator().manual_seed(seed)
    heads, d = layout.num_heads, layout.head_dim
    res = torch.randperm(layout.hidden_size, generator=gen)
    out = dict(state)
    inside = set()
    for layer in layout.layers:
        att, ffn = layer.attention, layer.ffn
        qk = _head_index(torch.stack([torch.randperm(d, generator=gen) for _ in range(heads)]))
        vo = _head_index(torch.stack([torch.randperm(d, generator=gen) for _ in range(heads)]))
        neurons = torch.randperm(layout.ffn_size, generator=gen)
        for proj, rows in [(p, qk) for p in att.query_like + att.key_like] + [(att.value, vo), (ffn.input, neurons)]:
            out[proj.weight] = _take(_take(out[proj.weight], rows, 0), res, 1)
            if proj.bias:
                out[proj.bias] = _take(out[proj.bias], rows, 0)
            inside.update(proj.keys())
        for proj, cols in [(att.output, vo), (ffn.output, neurons)]:
            out[proj.weight] = _take(_take(out[proj.weight], cols, 1), res, 0)
            if proj.bias:
                out[proj.bias] = _take(out[proj.bias], res, 0)
            inside.update(proj.keys())
    for key in set(state) - inside:
        axes = next((a for s, a in ORACLE[layout.family].items() if key.endswith(s)), ())
        for axis in axes:
            out[key] = _take(out[key], res, axis)
    return loaded(model, out)


# every layout variant, plus DeBERTa-v3's layer-normed relative embeddings without absolute positions
PLANTED = VARIANTS + [("deberta-v2", {"norm_rel_ebd": "layer_norm", "position_biased_input": False})]
PLANTED_IDS = VARIANT_IDS + ["deberta-v3-style"]


@pytest.mark.parametrize("family,overrides", PLANTED, ids=PLANTED_IDS)
def test_emd_undoes_planted_permutation(family, overrides):
    anchor = tiny_model(family, seed=0, **overrides)
    source = planted(anchor)
    batches = batches_for(family)
    torch.testing.assert_close(logits(source, batches), logits(anchor, batches), atol=1e-5, rtol=1e-5)
    assert max((source.state_dict()[k] - v).abs().max() for k, v in anchor.state_dict().items()) > 0.1

    merged = merge_acts_emd([anchor, source], batches)
    for key, tensor in anchor.state_dict().items():
        torch.testing.assert_close(merged[key], tensor, atol=1e-5, rtol=1e-5, msg=key)


def initialised_model(family, seed):
    """A model with transformers' own initialisation: tiny_model's large random weights make the
    activations of deeper layers nearly collinear (rank collapse), which no soft map can resolve."""
    config = tiny_config(family)
    config.num_labels = 3
    torch.manual_seed(seed)
    model = tf.ViTForImageClassification(config) if family == "vit" else \
        tf.AutoModelForSequenceClassification.from_config(config)
    return model.eval()


@pytest.mark.parametrize("family", ["vit", "bert", "deberta-v2"])
def test_soft_maps_nearly_undo_planted_permutation(family):
    anchor = initialised_model(family, seed=0)
    source = planted(anchor, seed=3)
    batches = batches_for(family)
    expected = logits(anchor, batches)
    for merged in (merge_wts([anchor, source], reg=0.01), merge_acts([anchor, source], batches, reg=0.01)):
        torch.testing.assert_close(logits(loaded(anchor, merged), batches), expected, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("family,overrides", VARIANTS, ids=VARIANT_IDS)
def test_three_models_keep_anchor_keys_shapes_dtypes(family, overrides):
    models = [tiny_model(family, seed=s, **overrides) for s in (0, 1, 2)]
    batches = batches_for(family, count=1)
    anchor = models[0].state_dict()
    for method in ("ot_acts", "ot_acts_emd", "ot_wts"):
        merged = merge_models(method, models, batches)
        assert list(merged) == list(anchor)
        for key, tensor in anchor.items():
            assert merged[key].shape == tensor.shape and merged[key].dtype == tensor.dtype, key
            assert torch.isfinite(merged[key].float()).all(), key
        assert torch.isfinite(logits(loaded(models[0], merged), batches)).all()


def test_bfloat16_models_keep_their_dtype():
    models = [tiny_model("vit", seed=s, dtype=torch.bfloat16) for s in (0, 1)]
    merged = merge_acts(models, batches_for("vit", count=1))
    assert all(t.dtype == torch.bfloat16 for t in merged.values())


def test_activation_methods_need_batches():
    models = [tiny_model("vit", seed=s) for s in (0, 1)]
    for merge in (merge_acts, merge_acts_emd):
        with pytest.raises(SymfusionError, match="batches"):
            merge(models, None)


def test_bad_options_raise():
    models = [tiny_model("vit", seed=s) for s in (0, 1)]
    with pytest.raises(SymfusionError, match="reg"):
        merge_wts(models, reg=0.0)
    with pytest.raises(SymfusionError, match="unknown option"):
        merge_acts(models, batches_for("vit"), alpha=0.5)


def test_unsupported_family_raises():
    config = tf.OPTConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, ffn_dim=24,
                          word_embed_proj_dim=16)
    models = [tf.OPTModel(config).eval() for _ in range(2)]
    with pytest.raises(SymfusionError, match="unsupported model_type"):
        merge_wts(models)
    # GPT-2 is a supported family for matching, but OT fusion stays encoder-only and says so
    gpt = [tf.GPT2Model(tf.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2)).eval() for _ in range(2)]
    with pytest.raises(SymfusionError, match="OT fusion supports the encoder families"):
        merge_wts(gpt)


def test_unknown_tensor_raises():
    config = tiny_model("bert").config
    models = [tf.BertForMaskedLM(config).eval() for _ in range(2)]
    with pytest.raises(SymfusionError, match="residual axes of"):
        merge_wts(models)
