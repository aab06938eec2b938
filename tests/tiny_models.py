"""Tiny random models of every supported family, built from configs (no network)."""
from __future__ import annotations

import torch
import transformers as tf

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)


def tiny_config(family: str, **overrides):
    """A small config of one family; DeBERTa variants via overrides (share_att_key, pos_att_type)."""
    kwargs = dict(SMALL, **overrides)
    if family == "bert":
        return tf.BertConfig(vocab_size=97, max_position_embeddings=64, **kwargs)
    if family == "roberta":
        return tf.RobertaConfig(vocab_size=97, max_position_embeddings=64, **kwargs)
    if family == "deberta-v2":
        defaults = dict(vocab_size=97, max_position_embeddings=64, relative_attention=True,
                        position_buckets=8, max_relative_positions=16, pos_att_type=["p2c", "c2p"],
                        share_att_key=False)
        return tf.DebertaV2Config(**{**defaults, **kwargs})
    if family == "vit":
        return tf.ViTConfig(image_size=8, patch_size=4, num_channels=3, **kwargs)
    raise ValueError(family)


# (family, config overrides) covering every supported layout variant
VARIANTS = [
    ("bert", {}),
    ("roberta", {}),
    ("deberta-v2", {"share_att_key": False, "pos_att_type": ["p2c", "c2p"]}),
    ("deberta-v2", {"share_att_key": True, "pos_att_type": ["p2c", "c2p"]}),
    ("deberta-v2", {"share_att_key": False, "pos_att_type": ["c2p"]}),
    ("deberta-v2", {"share_att_key": False, "pos_att_type": ["p2c"]}),
    ("deberta-v2", {"relative_attention": False, "pos_att_type": None}),
    ("vit", {}),
]
VARIANT_IDS = [f"{f}-{'-'.join(f'{k}={v}' for k, v in o.items()) or 'default'}" for f, o in VARIANTS]


def randomize(model: torch.nn.Module, seed: int, scale: float = 0.5) -> torch.nn.Module:
    """Give every parameter random values (biases and LayerNorms too), so no symmetry is trivial."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * scale)
    return model.eval()


def tiny_model(family: str, seed: int = 0, head: str = "sequence", dtype=torch.float32, **overrides):
    """A randomly initialised model with a classification head (or bare with head=None)."""
    config = tiny_config(family, **overrides)
    config.num_labels = 3
    torch.manual_seed(seed)
    if head is None:
        model = tf.AutoModel.from_config(config)
    elif family == "vit":
        model = tf.ViTForImageClassification(config)
    else:
        model = tf.AutoModelForSequenceClassification.from_config(config)
    return randomize(model.to(dtype), seed)


# A ViT of the digits task's images (8x8, grey, 10 classes), the k-way tests' models.
DIGITS_VIT = dict(image_size=8, patch_size=4, num_channels=1, num_labels=10, hidden_size=16, num_hidden_layers=1,
                  num_attention_heads=2, intermediate_size=24)


def digits_vit_folders(root, k: int = 3) -> list:
    """k tiny digits-ViT folders under root (seeds 0..k-1): the first sharded (an index and several shards), the others
    single files."""
    paths = []
    for seed in range(k):
        path = root / f"vit_{seed}"
        randomize(tf.ViTForImageClassification(tf.ViTConfig(**DIGITS_VIT)), seed).save_pretrained(
            str(path), **({"max_shard_size": "4KB"} if seed == 0 else {}))
        paths.append(path)
    return paths
