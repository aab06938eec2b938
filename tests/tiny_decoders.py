"""Tiny random decoder LLMs of every supported decoder family, built from configs (no network)."""
from __future__ import annotations

import torch
import transformers as tf

from tiny_models import randomize

SMALL = dict(vocab_size=97, hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2, intermediate_size=96,
             max_position_embeddings=64)


def decoder_config(family: str, **overrides):
    """A small config: llama/mistral/qwen2/qwen3/stablelm take num_key_value_heads and (stablelm) partial rotary."""
    kwargs = dict(SMALL, **overrides)
    if family == "llama":
        return tf.LlamaConfig(**kwargs)
    if family == "mistral":
        return tf.MistralConfig(sliding_window=None, **kwargs)
    if family == "qwen2":
        return tf.Qwen2Config(**kwargs)
    if family == "qwen3":
        return tf.Qwen3Config(head_dim=kwargs["hidden_size"] // kwargs["num_attention_heads"], **kwargs)
    if family == "stablelm":
        return tf.StableLmConfig(**{"use_qkv_bias": True, "partial_rotary_factor": 0.5, **kwargs})
    if family == "gpt2":
        return tf.GPT2Config(vocab_size=kwargs["vocab_size"], n_embd=kwargs["hidden_size"], n_layer=kwargs["num_hidden_layers"],
                             n_head=kwargs["num_attention_heads"], n_inner=kwargs["intermediate_size"], n_positions=64,
                             **{k: kwargs[k] for k in ("tie_word_embeddings",) if k in kwargs})
    raise ValueError(family)


# (family, config overrides): MHA and GQA, biases (qwen2, stablelm, gpt2), partial rotary (stablelm), Conv1D (gpt2)
DECODERS = [
    ("llama", {"num_key_value_heads": 4}),
    ("llama", {"num_key_value_heads": 2}),
    ("llama", {"num_key_value_heads": 1}),
    ("mistral", {"num_key_value_heads": 2}),
    ("qwen2", {"num_key_value_heads": 2}),
    ("stablelm", {"num_key_value_heads": 2}),
    ("stablelm", {"num_key_value_heads": 4, "partial_rotary_factor": 0.25}),
    ("gpt2", {}),
]
DECODER_IDS = [f"{f}-{'-'.join(f'{k}={v}' for k, v in o.items()) or 'default'}" for f, o in DECODERS]


def tiny_decoder(family: str, seed: int = 0, dtype=torch.float32, **overrides):
    """A randomly initialised causal LM (every parameter random: norms and biases too)."""
    config = decoder_config(family, **overrides)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(config)
    return randomize(model.to(dtype), seed, scale=0.3)
