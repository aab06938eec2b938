"""The text train stage: fine-tune a local pretrained encoder on one text task, seeded, resumable, best epoch kept."""
from __future__ import annotations

import hashlib
import json
import math
import shutil
import time
import warnings
from pathlib import Path

import torch
import transformers

from symfusion.errors import SymfusionError
from symfusion.evaluate_text import encode_examples, evaluate_text_model, text_loader
from symfusion.modelio import atomic_directory, compute_device, load_config, to_device, write_json_atomic
from symfusion.provenance import provenance
from symfusion.text_metrics import get_metric
from symfusion.train import _checkpoint_dir, load_checkpoint, save_checkpoint, train_epoch

SCHEDULE = "linear"        # linear warmup then linear decay to 0, as Hugging Face's Trainer (the paper's setup)


def load_tokenizer(base_model_dir: str | Path):
    """The tokenizer saved in a local model folder; never downloads, never runs remote code."""
    load_config(base_model_dir)                              # a clear error when the folder is no model folder
    try:
        return transformers.AutoTokenizer.from_pretrained(str(base_model_dir), local_files_only=True,
                                                          trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise SymfusionError(f"cannot load a tokenizer from {base_model_dir}: {str(error).splitlines()[0]}") from error


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
    try:
        return cls.from_pretrained(str(base_model_dir), local_files_only=True, trust_remote_code=False,
                                   dtype=torch.float32, **options)
    except (OSError, ValueError) as error:
        raise SymfusionError(f"cannot load {base_model_dir} as a {kind} model: {str(error).splitlines()[0]}") from error


def linear_schedule(optimizer, total_steps: int, warmup_ratio: float):
    """Linear warmup over ceil(warmup_ratio * total_steps) steps, then linear decay to 0 (Trainer's default)."""
    warmup = math.ceil(warmup_ratio * total_steps)
    return transformers.get_linear_schedule_with_warmup(optimizer, warmup, total_steps)


def _fingerprint(*parts) -> str:
    """A short hash of the run's configuration and data: a checkpoint of any other run is ignored."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _rank(score: float) -> float:
    """Selection key of a validation score: NaN (an undefined correlation) ranks below everything."""
    return -math.inf if score is None or math.isnan(score) else score


def _replay_schedule(scheduler, steps: int) -> None:
    with warnings.catch_warnings():                  # replaying the schedule, no optimizer step needed
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(steps):
            scheduler.step()


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
                        eval_batch_size: int = 64, resolved_config: dict | None = None) -> dict:
    """Fine-tune base_model_dir on splits.splits["train"], keep the best epoch on "validation", save atomically."""
    _check_inputs(base_model_dir, splits, metric, epochs, batch_size)
    output, kind, names = Path(output_dir), splits.kind, splits.label_names
    tokenizer = load_tokenizer(base_model_dir)
    num_labels = len(names) if names else None
    train_set = encode_examples(splits.splits["train"], tokenizer, kind, max_length, num_labels)
    validation_set = encode_examples(splits.splits["validation"], tokenizer, kind, max_length, num_labels)
    torch.manual_seed(seed)
    device = compute_device()
    model = build_text_model(base_model_dir, kind, names).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    loader = text_loader(train_set, batch_size, shuffle=True, generator=generator)
    total_steps = epochs * len(loader)
    scheduler = linear_schedule(optimizer, total_steps, warmup_ratio)
    fingerprint = _fingerprint(str(Path(base_model_dir).resolve()), kind, names, seed, epochs, batch_size, lr,
                               weight_decay, warmup_ratio, max_length, metric, splits.splits["train"],
                               splits.splits["validation"])
    checkpoint = _checkpoint_dir(output)
    start_epoch, best, history = 0, {"score": None, "epoch": None}, []
    resumed = load_checkpoint(checkpoint, model, optimizer, fingerprint, generator)
    if resumed:
        start_epoch, best, history = resumed
        _replay_schedule(scheduler, start_epoch * len(loader))
        print(f"resumed from {checkpoint} after epoch {start_epoch}", flush=True)
    start, epoch_seconds = time.perf_counter(), []
    for epoch in range(start_epoch, epochs):
        tick = time.perf_counter()
        model.train()                                # default dropout while fine-tuning
        train_loss = train_epoch(loader, optimizer, scheduler, f"epoch {epoch + 1}/{epochs}",
                                 lambda batch: model(**to_device(batch, device)).loss)
        epoch_seconds.append(time.perf_counter() - tick)
        scores = evaluate_text_model(model, tokenizer, validation_set, kind, max_length, metric,
                                     eval_batch_size, label_names=names)
        history.append({"epoch": epoch + 1, "train_loss": train_loss,
                        **{f"validation_{k}": v for k, v in scores.items()}})
        print(f"epoch {epoch + 1}/{epochs}: train loss {train_loss:.4f}, validation {metric} "
              f"{scores['score']:.4f}", flush=True)
        if best["epoch"] is None or _rank(scores["score"]) > _rank(best["score"]):
            best = {"score": scores["score"], "epoch": epoch + 1,
                    "state": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}}
        save_checkpoint(checkpoint, model, optimizer, epoch + 1, best, history, fingerprint, generator)
    model.load_state_dict(best["state"])
    model.to("cpu").eval()
    seconds = time.perf_counter() - start
    report = {"seed": seed, "epochs": epochs, "kind": kind, "metric": metric, "label_names": names,
              "base_model": str(base_model_dir), "schedule": SCHEDULE, "best_epoch": best["epoch"],
              "validation_score": best["score"], "history": history, "seconds": seconds,
              "seconds_per_epoch": seconds / max(1, epochs - start_epoch), "train_epoch_seconds": epoch_seconds,
              "train_examples_per_second": len(train_set) * len(epoch_seconds) / max(sum(epoch_seconds), 1e-9),
              "resumed_after_epoch": resumed[0] if resumed else None,
              "num_parameters": sum(p.numel() for p in model.parameters()),
              "provenance": provenance(resolved_config, seed)}
    with atomic_directory(output) as tmp:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        write_json_atomic(report, tmp / "train.json")
    shutil.rmtree(checkpoint, ignore_errors=True)
    return report
