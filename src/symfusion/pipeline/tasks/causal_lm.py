"""The causal language-modelling task: document splits, its BPE tokenizer, token blocks, statistic batches, held-out perplexity, manifest, trainer.

A task config (conf/task/lm_*.yaml) names the offline corpora (data/text/lm.py), the split seed, the block size,
the tokenizer a model trained from scratch gets (a byte-level BPE of `tokenizer.vocab_size` tokens trained on the
train split, data/text/bpe.py), and `limit`: how many blocks of each split are used (a seeded subset). Blocks are
always cut with the tokenizer of the model folder at hand, so a fine-tune of a pretrained decoder (SmolLM2) is
scored in its own tokens, and every model trained from scratch on the task carries the task's tokenizer. With a
`cache_dir`, the tokenizer and each split's blocks are cached on disk (data/text/lm_cache.py).
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from symfusion.errors import SymfusionError
from symfusion.families import token_limit
from symfusion.io.modelio import load_model, load_tokenizer
from symfusion.pipeline.basemodels import resolve_base
from symfusion.pipeline.data.text.bpe import tokenizer_digest, tokenizer_from_json, train_bpe
from symfusion.pipeline.data.text.lm import (LMDocuments, blocks_digest, load_lm_documents, seeded_rows, token_blocks,
                                             unigram_baseline)
from symfusion.pipeline.data.text.lm_cache import cache_path, cached_blocks, cached_text, corpora_identity
from symfusion.pipeline.data.text.splits import SPLITS
from symfusion.pipeline.tasks.base import Task, plain, statistics_split
from symfusion.pipeline.tasks.lm_models import decoder_from_scratch, evaluate_causal_lm, train_causal_lm

# transformers' causal-LM classes (LlamaForCausalLM, GPT2LMHeadModel, ...): the models a causal_lm task scores
CAUSAL_LM_CLASSES = frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
SOURCE = "lm_corpora"                     # the one source of language-modelling documents (data/text/lm.py)
DECODER_FAMILIES = ("llama", "gpt2")      # model configs a causal_lm task trains (from scratch, or a base to fine-tune)
LIMIT_SEED, EXAMPLES_SEED, STATISTICS_SEED = 2, 3, 4      # offsets of split_seed for the seeded subsets of blocks


@lru_cache(maxsize=4)
def _documents(corpora: tuple[str, ...], seed: int) -> LMDocuments:
    return load_lm_documents(corpora, seed)


@lru_cache(maxsize=4)
def _task_tokenizer(corpora: tuple[str, ...], seed: int, vocab_size: int, min_frequency: int, cache: Path | None):
    """The BPE of the train split (through its tokenizer.json, also when freshly trained: one path, one digest)."""
    return cached_text(cache, lambda: train_bpe(_documents(corpora, seed).splits["train"], vocab_size,
                                                min_frequency).backend_tokenizer.to_str(), parse=tokenizer_from_json)


class CausalLMTask(Task):
    """Next-token prediction on fixed-length blocks of held-out English text (kind `causal_lm`): loss and perplexity."""

    kinds = ("causal_lm",)
    metric = "perplexity"
    inputs = "tokens"
    profile_section = "decoder"

    def __init__(self, cfg):
        super().__init__(cfg)
        if cfg.get("source") != SOURCE:
            raise SymfusionError(f"task {cfg.get('name')}: source {cfg.get('source')!r}; causal_lm tasks read {SOURCE}")
        self._blocks: dict[tuple, tuple] = {}

    # ------------------------------------------------------------ data

    @property
    def block_size(self) -> int:
        return int(self.cfg.block_size)

    def corpora(self) -> tuple[str, ...]:
        return tuple(plain((self.cfg.get("options") or {}).get("corpora")) or ())

    def documents(self) -> LMDocuments:
        """The task's document splits (cached per process)."""
        return _documents(self.corpora(), int(self.cfg.split_seed))

    def tokenizer(self):
        """The task's own tokenizer: a byte-level BPE trained on its train split (what a model trained from scratch
        on the task reads and carries in its folder; the same on every run)."""
        options = self.cfg.get("tokenizer") or {}
        if "vocab_size" not in options:
            raise SymfusionError(f"task {self.name}: tokenizer.vocab_size is not set; see conf/task/lm_english.yaml")
        seed, vocab_size, min_frequency = int(self.cfg.split_seed), int(options["vocab_size"]), int(options.get(
            "min_frequency", 2))
        cache = self._cache("tokenizer", "json", vocab_size=vocab_size, min_frequency=min_frequency)
        return _task_tokenizer(self.corpora(), seed, vocab_size, min_frequency, cache)

    def _cache(self, kind: str, suffix: str, **parts) -> Path | None:
        """Where the cache file of something derived from the task's documents lives (None: no cache_dir)."""
        if not self.cfg.get("cache_dir"):
            return None
        return cache_path(self.cfg.cache_dir, kind, suffix, corpora=corpora_identity(self.corpora()),
                          seed=int(self.cfg.split_seed), **parts)

    def blocks(self, split: str, tokenizer, examples: int | None = None) -> torch.Tensor:
        """(rows, block_size) token ids of a split cut with `tokenizer`: the task's limit (a seeded subset), then
        `examples` (a seeded subset of those). Cached per process and tokenizer."""
        if split not in SPLITS:
            raise SymfusionError(f"split={split!r}; choose one of {', '.join(SPLITS)}")
        key = (split, examples, id(tokenizer))
        if key not in self._blocks:
            seed = int(self.cfg.split_seed)
            cache = self._cache("blocks", "safetensors", split=split, block_size=self.block_size,
                                tokenizer=tokenizer_digest(tokenizer))
            blocks = cached_blocks(cache, lambda: token_blocks(self.documents().splits[split], tokenizer,
                                                               self.block_size), width=self.block_size)
            limit = (plain(self.cfg.get("limit")) or {}).get(split)
            blocks = blocks[seeded_rows(len(blocks), limit, seed + LIMIT_SEED)]
            if examples is not None:
                blocks = blocks[seeded_rows(len(blocks), int(examples), seed + EXAMPLES_SEED)]
            # the tokenizer is kept with its blocks: alive, its id cannot be reused by another tokenizer
            self._blocks[key] = (tokenizer, blocks)
        return self._blocks[key][1]

    def statistic_batches(self, num_batches: int, model_dir: str | Path | None = None,
                          split: str = "validation") -> list[dict]:
        """`num_batches` batches of validation (or train) blocks in a seeded order (the split's documents come corpus
        by corpus), cut with model_dir's tokenizer: {"input_ids", "labels"} (b, L), the labels being the inputs (the
        model shifts them): data for Fisher and RegMean, and the learned refinement."""
        blocks = self.blocks(statistics_split(split), load_tokenizer(model_dir))
        size = int(self.cfg.fusion_batch_size)
        generator = torch.Generator().manual_seed(int(self.cfg.split_seed) + STATISTICS_SEED)
        order = torch.randperm(len(blocks), generator=generator)[: size * num_batches]
        return [{"input_ids": blocks[part].clone(), "labels": blocks[part].clone()} for part in order.split(size)]

    # ------------------------------------------------------------ models

    def check_model(self, model: torch.nn.Module, where: str = "the model", model_dir=None) -> None:
        """Refuse (one line) a model that is no causal LM of a supported family."""
        super().check_model(model, where, model_dir)
        limit = token_limit(model.config)
        if limit is not None and self.block_size > limit:
            raise SymfusionError(f"task {self.name} reads blocks of {self.block_size} tokens, but {where} holds {limit} "
                                 "(its max_position_embeddings); lower task.block_size")
        if type(model).__name__ not in CAUSAL_LM_CLASSES:
            raise SymfusionError(f"{where} is a {type(model).__name__}, not a causal language model; task {self.name} "
                                 "scores next-token predictions: give a *ForCausalLM folder (e.g. trained with "
                                 "model=llama_mini)")

    def evaluate(self, model: torch.nn.Module, split: str = "test", model_dir=None, examples: int | None = None) -> dict:
        """Mean next-token loss, perplexity, blocks and tokens of a split (its seeded subset of `examples` blocks when
        given), cut with model_dir's tokenizer; per_example: each block's summed loss and predicted tokens."""
        self.check_model(model)
        tokenizer = load_tokenizer(model_dir)
        if len(tokenizer) > model.config.vocab_size:
            raise SymfusionError(f"the tokenizer of {model_dir} has {len(tokenizer)} tokens, the model's vocabulary "
                                 f"{model.config.vocab_size}; evaluate a model with its own tokenizer")
        return evaluate_causal_lm(model, self.blocks(split, tokenizer, examples), int(self.cfg.eval_batch_size))

    def manifest(self) -> dict:
        """Per split: documents, characters, blocks (with the task's tokenizer) and their hash; the tokenizer; the
        unigram baseline of every held-out split."""
        manifest = self.manifest_header()
        documents, tokenizer = self.documents(), self.tokenizer()
        manifest.update(block_size=self.block_size, corpora=list(self.corpora()), data_source=documents.info,
                        tokenizer={"kind": "byte-level BPE", "tokens": len(tokenizer),
                                   "sha256": tokenizer_digest(tokenizer)})
        train = self.blocks("train", tokenizer)
        for name, texts in documents.splits.items():
            blocks = self.blocks(name, tokenizer)
            manifest["splits"][name] = {"documents": len(texts), "characters": sum(map(len, texts)),
                                        "size": len(blocks), "tokens": int(blocks.numel()),
                                        "sha256": blocks_digest(blocks)}
        manifest["unigram_baseline"] = {name: unigram_baseline(train, self.blocks(name, tokenizer), len(tokenizer))
                                        for name in ("validation", "test")}
        return manifest

    def train(self, output: str, model_cfg: dict, seed: int, resolved_config: dict | None = None,
              precision: str = "auto", data_seed: int | None = None) -> dict:
        """A Llama- or GPT-2-layout decoder trained from scratch with the task's tokenizer (conf/model/llama_*.yaml,
        conf/model/gpt2_*.yaml), or a pretrained decoder fine-tuned with its own (model_cfg.base_model, e.g.
        conf/model/smollm2_135m.yaml)."""
        if model_cfg.get("family") not in DECODER_FAMILIES:
            raise SymfusionError(f"model={model_cfg.get('name')} is no decoder LLM config (family "
                                 f"{model_cfg.get('family')!r}); causal_lm tasks train e.g. model=llama_mini from "
                                 "scratch or fine-tune model=smollm2_135m")
        train = self.cfg.train
        inputs, record = [], {"task": self.name, "model_config": model_cfg}
        if model_cfg.get("base_model"):
            base = resolve_base(model_cfg["base_model"], revision=model_cfg.get("revision"))
            inputs.append(base.folder)
            tokenizer = load_tokenizer(base.folder)
            record["base_model_source"] = base.to_dict()

            def build():
                model = load_model(base.folder)
                self.check_model(model, f"base model {base.folder}")
                return model
        else:
            tokenizer = self.tokenizer()
            build = decoder_from_scratch(model_cfg, tokenizer, self.block_size)
        train_blocks, validation = self.blocks("train", tokenizer), self.blocks("validation", tokenizer)
        record["unigram_baseline"] = {"validation": unigram_baseline(train_blocks, validation, len(tokenizer))}
        return train_causal_lm(
            output, build, tokenizer, train_blocks, validation, seed=seed, epochs=int(train.epochs),
            batch_size=int(train.batch_size), lr=float(train.lr), weight_decay=float(train.weight_decay),
            warmup_ratio=float(train.warmup_ratio), eval_batch_size=int(self.cfg.eval_batch_size),
            resolved_config=resolved_config, record=record, inputs=inputs, precision=precision,
            patience=train.get("patience"), data_seed=data_seed)



__all__ = ["CausalLMTask", "DECODER_FAMILIES"]
