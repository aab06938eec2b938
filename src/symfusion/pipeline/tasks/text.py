"""The text task (classification, token classification, regression): splits, batches, evaluation, manifest, fine-tuning."""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

import torch
import transformers

from symfusion.pipeline.basemodels import resolve_base
from symfusion.pipeline.data.text import KINDS, load_text_splits
from symfusion.errors import SymfusionError
from symfusion.families import token_limit
from symfusion.io.modelio import compute_device, load_pretrained_body, load_tokenizer, to_device, write_json
from symfusion.io.outputs import safe_output
from symfusion.pipeline.packing import padding_free, token_maps
from symfusion.io.provenance import provenance
from symfusion.pipeline.tasks.base import Task, plain, statistics_split
from symfusion.pipeline.tasks.text_encoding import (copy_head, encode_examples, evaluate_text_model, statistic_batches_text,
                                           text_loader)
from symfusion.pipeline.text_metrics import get_metric
from symfusion.pipeline.training import (TRAIN_MARKER, adamw, autocast, evaluation_precision, fit, linear_schedule,
                                         loader_options, remove_checkpoint, training_run, use_autocast)

SCHEDULE = "linear"        # linear warmup then linear decay to 0, as Hugging Face's Trainer (the paper's setup)


@lru_cache(maxsize=8)
def _splits(source: str, seed: int, limit_json: str, options_json: str):
    return load_text_splits(source, seed=seed, limit=json.loads(limit_json), **json.loads(options_json))


class TextTask(Task):
    """A text task on a pretrained encoder: examples are tokenised with the model folder's own tokenizer."""

    kinds = KINDS
    metric = "accuracy"
    profile_section = "language"

    def __init__(self, cfg):
        super().__init__(cfg)
        self._encoded: dict[tuple, object] = {}

    def splits(self):
        """The task's TextSplits (kind, splits, label_names), cached per process."""
        limit = json.dumps(plain(self.cfg.get("limit")) or {}, sort_keys=True)
        options = dict(plain(self.cfg.get("options")) or {})
        if self.cfg.get("cache_dir"):
            options["cache_dir"] = str(self.cfg.cache_dir)
        splits = _splits(self.cfg.source, int(self.cfg.split_seed), limit, json.dumps(options, sort_keys=True))
        if splits.kind != self.kind:
            raise SymfusionError(f"task {self.name} says kind {self.kind} but source {self.cfg.source} gives {splits.kind}")
        return splits

    def examples(self, split: str) -> list[dict]:
        splits = self.splits()
        if split not in splits.splits:
            raise SymfusionError(f"split={split!r}; choose one of {', '.join(splits.splits)}")
        return splits.splits[split]

    def statistic_batches(self, num_batches: int, model_dir: str | Path | None = None,
                          split: str = "validation") -> list[dict]:
        """The first `num_batches` batches of a split (validation, or train; fixed order), tokenised with
        model_dir's tokenizer."""
        return statistic_batches_text(self.examples(statistics_split(split)), load_tokenizer(model_dir), self.kind,
                                      int(self.cfg.max_length), int(self.cfg.fusion_batch_size), num_batches)

    def check_model(self, model: torch.nn.Module, where: str = "the model", model_dir=None) -> None:
        """Also refuse (one line) a model whose vocabulary the token ids of model_dir's tokenizer would overrun
        (in evaluation and in the statistic batches of Fisher, RegMean and OT merges)."""
        limit = token_limit(model.config)
        if limit is not None and int(self.cfg.max_length) > limit:
            raise SymfusionError(f"task {self.name} reads up to max_length={self.cfg.max_length} tokens, but {where} "
                                 f"holds {limit} (its max_position_embeddings); lower task.max_length")
        super().check_model(model, where)
        vocabulary = getattr(model.config, "vocab_size", None)
        if model_dir is not None and vocabulary is not None and len(load_tokenizer(model_dir)) > vocabulary:
            raise SymfusionError(f"the tokenizer of {model_dir} has {len(load_tokenizer(model_dir))} tokens, the "
                                 f"model's vocabulary {vocabulary}; use a model with its own tokenizer")

    def evaluate(self, model: torch.nn.Module, split: str = "test", model_dir=None, examples: int | None = None) -> dict:
        """The task metric, loss and n on a split (its first `examples` examples when given)."""
        self.check_model(model, model_dir=model_dir)
        tokenizer = load_tokenizer(model_dir)
        key = (split, examples, id(tokenizer), int(self.cfg.max_length))
        if key not in self._encoded:             # tokenised once per process, whatever model is scored on it
            chosen = self.examples(split)[: examples or None]
            # the tokenizer is kept with its encoding: alive, its id cannot be reused by another tokenizer
            # (load_tokenizer's cache holds only a few)
            self._encoded[key] = (tokenizer, encode_examples(chosen, tokenizer, self.kind, int(self.cfg.max_length)))
        return evaluate_text_model(model, tokenizer, self._encoded[key][1], self.kind, int(self.cfg.max_length),
                                   self.cfg.metric, int(self.cfg.eval_batch_size),
                                   label_names=self.splits().label_names)

    def num_labels(self) -> int:
        names = self.splits().label_names
        return 1 if self.kind == "regression" else len(names)

    def manifest(self) -> dict:
        """Sizes and a content hash of each split, and the label names."""
        manifest = self.manifest_header()
        splits = self.splits()
        manifest["label_names"] = splits.label_names
        manifest["data_source"] = {k: v for k, v in splits.info.items() if k != "sizes"}
        for name, examples in splits.splits.items():
            digest = hashlib.sha256(json.dumps(examples, sort_keys=True).encode())
            manifest["splits"][name] = {"size": len(examples), "sha256": digest.hexdigest()}
        return manifest

    def copy_head(self, model: torch.nn.Module, head_dir: str | Path) -> list[str]:
        return copy_head(model, head_dir)

    def train(self, output: str, model_cfg: dict, seed: int, resolved_config: dict | None = None,
              precision: str = "auto", data_seed: int | None = None) -> dict:
        """Fine-tune the model's pretrained encoder (model_cfg.base_model) on this task."""
        if not model_cfg.get("base_model"):
            raise SymfusionError(f"model={model_cfg.get('name')} is not a pretrained encoder; "
                                 "text tasks need e.g. model=minilm")
        train = self.cfg.train
        base = resolve_base(model_cfg["base_model"], revision=model_cfg.get("revision"))
        return finetune_text_model(
            output, base.folder, self.splits(), seed=seed,
            epochs=int(train.epochs), batch_size=int(train.batch_size), lr=float(train.lr),
            weight_decay=float(train.weight_decay), warmup_ratio=float(train.warmup_ratio),
            max_length=int(self.cfg.max_length), metric=self.cfg.metric, eval_batch_size=int(self.cfg.eval_batch_size),
            resolved_config=resolved_config, base_model_record=base.to_dict(), precision=precision,
            data_seed=data_seed)


# ---------------------------------------------------------------- the fine-tuner

def build_text_model(base_model_dir: str | Path, kind: str, label_names: list[str] | None):
    """The pretrained encoder of base_model_dir with a fresh head for `kind` (seed torch before calling)."""
    if kind == "regression":
        cls, options = transformers.AutoModelForSequenceClassification, {"num_labels": 1, "problem_type": "regression"}
    else:
        if not label_names:
            raise SymfusionError(f"a {kind} task needs label_names; the data source gave none")
        cls = (transformers.AutoModelForTokenClassification if kind == "token_classification"
               else transformers.AutoModelForSequenceClassification)
        options = {"num_labels": len(label_names), "id2label": dict(enumerate(label_names)),
                   "label2id": {name: i for i, name in enumerate(label_names)}}
        if kind == "text_classification":
            options["problem_type"] = "single_label_classification"
    return load_pretrained_body(base_model_dir, cls, dtype=torch.float32, **options)   # align()'s checks (modelio)


def _fingerprint(*parts) -> str:
    """A short hash of the run's configuration and data: a checkpoint of any other run is ignored."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _check_inputs(base_model_dir, splits, metric: str, epochs: int, batch_size: int) -> None:
    get_metric(metric, splits.kind)
    if not base_model_dir or not Path(base_model_dir).is_dir():
        raise SymfusionError(f"base model folder {base_model_dir!r} does not exist; install the encoder or fix it")
    for name in ("train", "validation"):
        if not splits.splits.get(name):
            raise SymfusionError(f"the {name} split is empty or missing; check the data source and limits")
    if epochs < 1 or batch_size < 1:
        raise SymfusionError(f"epochs={epochs}, batch_size={batch_size}: both must be at least 1")


def finetune_text_model(output_dir: str, base_model_dir: str, splits, seed: int, epochs: int, batch_size: int,
                        lr: float, weight_decay: float, warmup_ratio: float, max_length: int, metric: str,
                        eval_batch_size: int = 64, resolved_config: dict | None = None,
                        base_model_record: dict | None = None, precision: str = "auto",
                        data_seed: int | None = None) -> dict:
    """Fine-tune base_model_dir on splits.splits["train"], keep the best epoch on "validation", save atomically;
    data_seed: the data order's seed (None: `seed`, which always seeds the new head's initialisation)."""
    _check_inputs(base_model_dir, splits, metric, epochs, batch_size)
    with safe_output(output_dir, "symfusion-train", TRAIN_MARKER, inputs=[base_model_dir], is_dir=True) as claim, training_run(output_dir):
        return _finetune(claim, Path(output_dir), base_model_dir, splits, seed, epochs, batch_size, lr, weight_decay,
                         warmup_ratio, max_length, metric, eval_batch_size, resolved_config, base_model_record,
                         precision, data_seed)


def _finetune(claim, output: Path, base_model_dir: str, splits, seed: int, epochs: int, batch_size: int, lr: float,
              weight_decay: float, warmup_ratio: float, max_length: int, metric: str, eval_batch_size: int,
              resolved_config: dict | None, base_model_record: dict | None, precision: str,
              data_seed: int | None) -> dict:
    kind, names = splits.kind, splits.label_names
    tokenizer = load_tokenizer(base_model_dir)
    num_labels = len(names) if names else None
    train_set = encode_examples(splits.splits["train"], tokenizer, kind, max_length, num_labels)
    validation_set = encode_examples(splits.splits["validation"], tokenizer, kind, max_length, num_labels)
    torch.manual_seed(seed)
    device = compute_device()
    amp = use_autocast(precision, device)
    model = build_text_model(base_model_dir, kind, names).to(device)
    optimizer = adamw(model, lr, weight_decay)
    generator = torch.Generator().manual_seed(seed if data_seed is None else data_seed)     # the data order
    loader = text_loader(train_set, batch_size, shuffle=True, generator=generator, **loader_options(device))
    scheduler = linear_schedule(optimizer, epochs * len(loader), warmup_ratio)
    fingerprint = _fingerprint(str(Path(base_model_dir).resolve()), kind, names, seed, epochs, batch_size, lr,
                               weight_decay, warmup_ratio, max_length, metric, splits.splits["train"],
                               splits.splits["validation"], *(["bf16"] if amp else []),
                               *([] if data_seed is None else [{"data_seed": data_seed}]))

    maps = token_maps(model)

    def batch_loss(batch):
        batch = to_device(batch, device)
        with autocast(device, amp), padding_free(maps, batch.get("attention_mask")):
            return model(**batch).loss

    def validate(model):
        with evaluation_precision(precision, device):
            scores = evaluate_text_model(model, tokenizer, validation_set, kind, max_length, metric, eval_batch_size,
                                     label_names=names)
        return scores["score"], {f"validation_{k}": v for k, v in scores.items() if k != "per_example"}

    fitted = fit(output, model, optimizer, scheduler, loader, batch_loss, validate, epochs, fingerprint, generator,
                 metric)
    seconds, epoch_seconds = fitted.seconds, fitted.epoch_seconds
    report = {"seed": seed, "data_seed": seed if data_seed is None else data_seed,
              "epochs": epochs, "kind": kind, "metric": metric, "label_names": names,
              "base_model": str(base_model_dir), "base_model_source": base_model_record,
              "data_source": getattr(splits, "info", None), "schedule": SCHEDULE, "bf16_autocast": amp,
              "best_epoch": fitted.best_epoch,
              "validation_score": fitted.best_score, "history": fitted.history, "seconds": seconds,
              "seconds_per_epoch": seconds / max(1, len(epoch_seconds)), "train_epoch_seconds": epoch_seconds,
              "train_examples_per_second": len(train_set) * len(epoch_seconds) / max(sum(epoch_seconds), 1e-9),
              "resumed_after_epoch": fitted.resumed_after_epoch,
              "num_parameters": sum(p.numel() for p in model.parameters()),
              "provenance": provenance(resolved_config, seed)}
    with claim.writing() as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        write_json(report, tmp / "train.json")
    remove_checkpoint(output)
    return report
