"""Causal language models for the causal_lm task: their held-out token loss, Llama- and GPT-2-layout decoders built from a model config, and their trainer.

    evaluate_causal_lm(model, blocks)                  mean next-token loss, perplexity, per-block record
    llama_config(model_cfg, tokenizer, block_size)     conf/model/llama_*.yaml -> transformers.LlamaConfig
    gpt2_config(model_cfg, tokenizer, block_size)      conf/model/gpt2_*.yaml -> transformers.GPT2Config
    decoder_from_scratch(model_cfg, tokenizer, size)   the untrained *ForCausalLM of either family
    train_causal_lm(output, build, tokenizer, ...)     one training run through training.fit, saved atomically
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Callable

import torch
import transformers
from torch.utils.data import DataLoader, TensorDataset

from symfusion.errors import SymfusionError
from symfusion.io.modelio import compute_device, write_json
from symfusion.io.outputs import safe_output
from symfusion.pipeline.data.text.bpe import tokenizer_digest
from symfusion.pipeline.training import (TRAIN_MARKER, adamw, autocast, cosine_schedule, evaluation_precision, fit,
                                         loader_options, remove_checkpoint, training_run, use_autocast)
from symfusion.io.provenance import provenance

SCHEDULE = "cosine"        # linear warmup, then cosine decay to 0 (training.warmup_cosine), as LM pretraining does
# conf/model/llama_*.yaml: the fields a Llama-layout decoder is built from, and the defaults of the optional ones
LLAMA_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
LLAMA_DEFAULTS = {"rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "initializer_range": 0.02}
# conf/model/gpt2_*.yaml: the same sizes (num_key_value_heads none: GPT-2's heads each have their keys and values)
GPT2_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
GPT2_DEFAULTS = {"layer_norm_epsilon": 1e-5, "tie_word_embeddings": False, "initializer_range": 0.02, "dropout": 0.0,
                 "activation_function": "gelu_new"}


# ---------------------------------------------------------------- evaluation

@torch.inference_mode()
def evaluate_causal_lm(model: torch.nn.Module, blocks: torch.Tensor, batch_size: int = 32) -> dict:
    """{"loss" (mean next-token cross-entropy over every predicted token), "perplexity" (exp of it), "n" (blocks),
    "tokens" (predicted tokens), "per_example": {"loss": summed loss of each block, "tokens": its predicted tokens}}
    of `model` on `blocks` (rows, L): the model predicts tokens 1..L-1 of each block from those before them.
    The mean is the correctly rounded sum of the per-block sums (math.fsum) over the tokens, so it does not depend on
    the batching; the bootstrap (uncertainty.py) takes the token-weighted mean of the per-block record. Eval mode."""
    if blocks.dim() != 2 or blocks.shape[0] == 0 or blocks.shape[1] < 2:
        raise SymfusionError(f"no blocks to evaluate ({tuple(blocks.shape)}); check the task's limit and block_size")
    model.eval()
    device = next(model.parameters()).device
    sums = []
    for batch in blocks.split(batch_size):
        batch = batch.to(device)
        logits = model(input_ids=batch).logits[:, :-1]                                 # (b, L - 1, V)
        each = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), batch[:, 1:],
                                                 reduction="none")                     # (b, L - 1)
        sums += each.double().sum(dim=1).tolist()
    per_block = blocks.shape[1] - 1
    tokens = per_block * len(sums)
    loss = math.fsum(sums) / tokens
    return {"loss": loss, "perplexity": math.exp(loss), "n": len(sums), "tokens": tokens,
            "per_example": {"loss": sums, "tokens": [per_block] * len(sums)}}


# ---------------------------------------------------------------- models

def llama_config(model_cfg: dict, tokenizer, block_size: int) -> transformers.LlamaConfig:
    """The LlamaConfig of a from-scratch decoder: RoPE, grouped-query attention, SwiGLU, RMSNorm, no biases, no dropout,
    tied embeddings unless the config says otherwise; vocabulary = the tokenizer's, positions = block_size."""
    missing = [f for f in LLAMA_FIELDS if f not in model_cfg]
    if missing:
        raise SymfusionError(f"model config {model_cfg.get('name')} lacks {missing}; see conf/model/llama_mini.yaml")
    sizes = {f: int(model_cfg[f]) for f in LLAMA_FIELDS}
    heads, kv_heads = sizes["num_attention_heads"], sizes["num_key_value_heads"]
    if min(sizes.values()) < 1 or sizes["hidden_size"] % heads or heads % kv_heads or (sizes["hidden_size"] // heads) % 2:
        raise SymfusionError(f"model {model_cfg.get('name')}: {sizes} must be positive, with hidden_size divisible by "
                             "num_attention_heads into an even head size (RoPE planes), and the heads by the KV heads")
    options = {**LLAMA_DEFAULTS, **{k: model_cfg[k] for k in LLAMA_DEFAULTS if k in model_cfg}}
    eos = tokenizer.eos_token_id
    return transformers.LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=int(block_size), **sizes,
        rope_theta=float(options["rope_theta"]), rms_norm_eps=float(options["rms_norm_eps"]),
        tie_word_embeddings=bool(options["tie_word_embeddings"]), initializer_range=float(options["initializer_range"]),
        attention_bias=False, mlp_bias=False, attention_dropout=0.0, hidden_act="silu",
        bos_token_id=eos, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id,
        architectures=["LlamaForCausalLM"])


def gpt2_config(model_cfg: dict, tokenizer, block_size: int) -> transformers.GPT2Config:
    """The GPT2Config of a from-scratch decoder: learned positions (block_size of them), LayerNorm, biases, GELU,
    one dropout rate for embeddings, residuals and attention (0 unless the config says), untied embeddings unless the
    config says otherwise; vocabulary = the tokenizer's."""
    missing = [f for f in GPT2_FIELDS if f not in model_cfg]
    if missing:
        raise SymfusionError(f"model config {model_cfg.get('name')} lacks {missing}; see conf/model/gpt2_mini.yaml")
    sizes = {f: int(model_cfg[f]) for f in GPT2_FIELDS}
    if min(sizes.values()) < 1 or sizes["hidden_size"] % sizes["num_attention_heads"]:
        raise SymfusionError(f"model {model_cfg.get('name')}: {sizes} must be positive, with hidden_size divisible by "
                             "num_attention_heads")
    options = {**GPT2_DEFAULTS, **{k: model_cfg[k] for k in GPT2_DEFAULTS if k in model_cfg}}
    dropout = float(options["dropout"])
    if not 0.0 <= dropout < 1.0:
        raise SymfusionError(f"model {model_cfg.get('name')}: dropout={dropout} must lie in [0, 1)")
    eos = tokenizer.eos_token_id
    return transformers.GPT2Config(
        vocab_size=len(tokenizer), n_positions=int(block_size), n_embd=sizes["hidden_size"],
        n_layer=sizes["num_hidden_layers"], n_head=sizes["num_attention_heads"], n_inner=sizes["intermediate_size"],
        activation_function=str(options["activation_function"]), layer_norm_epsilon=float(options["layer_norm_epsilon"]),
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
        tie_word_embeddings=bool(options["tie_word_embeddings"]), initializer_range=float(options["initializer_range"]),
        bos_token_id=eos, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, architectures=["GPT2LMHeadModel"])


def decoder_from_scratch(model_cfg: dict, tokenizer, block_size: int) -> Callable[[], torch.nn.Module]:
    """build() of an untrained decoder of the config's family: LlamaForCausalLM (llama) or GPT2LMHeadModel (gpt2)."""
    if model_cfg.get("family") == "gpt2":
        config = gpt2_config(model_cfg, tokenizer, block_size)
        return lambda: transformers.GPT2LMHeadModel(config)
    config = llama_config(model_cfg, tokenizer, block_size)
    return lambda: transformers.LlamaForCausalLM(config)


def parameter_counts(model: torch.nn.Module) -> dict:
    """Parameters of a causal LM: all (tied ones once) and those outside the token embeddings and the LM head."""
    unique = {id(p): p for p in model.parameters()}
    outside = set(id(p) for p in (model.get_input_embeddings().weight, model.get_output_embeddings().weight))
    return {"num_parameters": sum(p.numel() for p in unique.values()),
            "num_parameters_non_embedding": sum(p.numel() for i, p in unique.items() if i not in outside)}


# ---------------------------------------------------------------- the trainer

def _fingerprint(*parts) -> str:
    """A hash of the run's configuration and data: a checkpoint of any other run is ignored."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def train_causal_lm(output_dir: str, build: Callable[[], torch.nn.Module], tokenizer, train_blocks: torch.Tensor,
                    validation_blocks: torch.Tensor, seed: int, epochs: int, batch_size: int, lr: float,
                    weight_decay: float, warmup_ratio: float, eval_batch_size: int = 32,
                    resolved_config: dict | None = None, record: dict | None = None, inputs: list | None = None,
                    precision: str = "auto", patience: int | None = None,
                    data_seed: int | None = None) -> dict:
    """Train build() (seeded with `seed` first; the blocks' order with `data_seed`, None: `seed`) on the train
    blocks, next-token loss, AdamW and a cosine schedule;
    keep the epoch of the lowest validation loss (`patience`: stop after that many epochs without a lower one); save the model, its tokenizer and train.json atomically.
    `record`: what the report says about the model and data (model config, base model, task, unigram baseline);
    `inputs`: folders the output must not be (a base model)."""
    if epochs < 1 or batch_size < 1:
        raise SymfusionError(f"epochs={epochs}, batch_size={batch_size}: both must be at least 1")
    if len(train_blocks) < batch_size:
        raise SymfusionError(f"the train split has {len(train_blocks)} blocks, fewer than batch_size={batch_size}; "
                             "lower batch_size or raise the task's limit")
    if len(validation_blocks) == 0:
        raise SymfusionError("the validation split has no blocks; raise the task's limit or lower block_size")
    with safe_output(output_dir, "symfusion-train", TRAIN_MARKER, inputs=inputs or [], is_dir=True) as claim, training_run(output_dir):
        return _train(claim, Path(output_dir), build, tokenizer, train_blocks, validation_blocks, seed, epochs,
                      batch_size, lr, weight_decay, warmup_ratio, eval_batch_size, resolved_config, record or {},
                      precision, patience, data_seed)


def _train(claim, output: Path, build, tokenizer, train_blocks, validation_blocks, seed: int, epochs: int,
           batch_size: int, lr: float, weight_decay: float, warmup_ratio: float, eval_batch_size: int,
           resolved_config, record: dict, precision: str, patience: int | None, data_seed: int | None) -> dict:
    torch.manual_seed(seed)
    device = compute_device()
    amp = use_autocast(precision, device)
    model = build().to(device)
    if len(tokenizer) > model.config.vocab_size:
        raise SymfusionError(f"the tokenizer has {len(tokenizer)} tokens, the model's vocabulary "
                             f"{model.config.vocab_size}; train a model with its own tokenizer")
    model.train()
    optimizer = adamw(model, lr, weight_decay)
    generator = torch.Generator().manual_seed(seed if data_seed is None else data_seed)     # the data order
    loader = DataLoader(TensorDataset(train_blocks), batch_size=batch_size, shuffle=True, generator=generator,
                        drop_last=True, **loader_options(device))
    scheduler = cosine_schedule(optimizer, epochs * len(loader), warmup_ratio)
    digest = hashlib.sha256(train_blocks.numpy().tobytes() + validation_blocks.numpy().tobytes()).hexdigest()
    fingerprint = _fingerprint(record, seed, epochs, batch_size, lr, weight_decay, warmup_ratio, digest,
                               *(["bf16"] if amp else []), *([] if data_seed is None else [{"data_seed": data_seed}]))

    def batch_loss(batch):
        tokens = batch[0].to(device, non_blocking=True)                                # (b, L)
        with autocast(device, amp):
            return model(input_ids=tokens, labels=tokens).loss

    def validate(model):
        with evaluation_precision(precision, device):
            scores = evaluate_causal_lm(model, validation_blocks, eval_batch_size)
        return scores["loss"], {"validation_loss": scores["loss"], "validation_perplexity": scores["perplexity"]}

    fitted = fit(output, model, optimizer, scheduler, loader, batch_loss, validate, epochs, fingerprint, generator,
                 "loss", maximize=False, patience=patience)
    epoch_tokens = len(loader) * batch_size * train_blocks.shape[1]
    report = {"seed": seed, "data_seed": seed if data_seed is None else data_seed,
              "epochs": epochs, "kind": "causal_lm", "metric": "loss", "schedule": SCHEDULE,
              "batch_size": batch_size, "lr": lr, "weight_decay": weight_decay, "warmup_ratio": warmup_ratio,
              "bf16_autocast": amp, "best_epoch": fitted.best_epoch, "validation_score": fitted.best_score,
              "validation_loss": fitted.best_score, "validation_perplexity": math.exp(fitted.best_score),
              "patience": patience, "epochs_run": len(fitted.history), "stopped_early": fitted.stopped_early,
              "history": fitted.history, "seconds": fitted.seconds,
              "seconds_per_epoch": fitted.seconds / max(1, len(fitted.epoch_seconds)),
              "train_epoch_seconds": fitted.epoch_seconds, "train_tokens_per_epoch": epoch_tokens,
              "train_tokens_per_second": epoch_tokens * len(fitted.epoch_seconds) / max(sum(fitted.epoch_seconds), 1e-9),
              "block_size": int(train_blocks.shape[1]), "train_blocks": len(train_blocks),
              "validation_blocks": len(validation_blocks), "resumed_after_epoch": fitted.resumed_after_epoch,
              "tokenizer": {"tokens": len(tokenizer), "sha256": tokenizer_digest(tokenizer)},
              **parameter_counts(model), **record, "provenance": provenance(resolved_config, seed)}
    with claim.writing() as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        write_json(report, tmp / "train.json")
    remove_checkpoint(output)
    return report
