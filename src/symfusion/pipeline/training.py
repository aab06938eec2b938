"""One training loop for every trainer: epochs, validation, keep-best, resumable safetensors checkpoints.

A trainer (ViT from scratch in tasks/image.py, text fine-tuning in tasks/text.py, causal LMs in
tasks/lm_models.py) builds its model, optimizer, schedule and loader, then calls `fit`: one pass over the
loader per epoch, a validation score after each epoch, the best epoch's weights kept (the highest score, or
the lowest with maximize=False, as a loss; ties keep the earlier epoch; NaN ranks lowest), optionally early
stopping (`patience`: the run ends after that many epochs in a row without a better score; off by default),
and after every epoch a checkpoint beside the output folder (`.NAME.checkpoint`) holding the model,
the optimizer moments, the RNG states and the progress. A killed run resumes from it to the same
weights it would have reached without the interruption; a checkpoint of another run (its fingerprint differs)
is ignored. The fingerprint is the trainer's own (its configuration and the data's content: `tensors_digest`)
joined by fit with the digest of the model it starts from (the base weights, the new head, every shape), so a
checkpoint is resumed only by the run that made it, whatever the task kind.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import transformers
from safetensors.torch import load_file, save_file

from symfusion.errors import SymfusionError, steps
from symfusion.io.marks import HOST, mark, marked_folder, own_folder, remove_own
from symfusion.io.outputs import folder_marker, swap_in

CHECKPOINT = "checkpoint"          # the kind in a checkpoint folder's mark
# A folder is a previous output of a trainer when it holds a training report.
TRAIN_MARKER = folder_marker("train.json", ("best_epoch", "history"))


def warmup_cosine(step: int, total: int, warmup_ratio: float) -> float:
    """Learning-rate factor: linear warmup over warmup_ratio*total steps, then cosine decay to 0."""
    warmup = max(1, int(round(warmup_ratio * total)))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def cosine_schedule(optimizer, total_steps: int, warmup_ratio: float):
    """warmup_cosine as a scheduler (the ViT trainer's)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_cosine(s, total_steps, warmup_ratio))


def adamw(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with torch's fused kernel: Hugging Face Trainer's default optimizer (adamw_torch_fused) from
    torch 2.8 on. On the CPU one fused step over all-MiniLM-L6-v2 costs a fifth of the per-tensor loop's."""
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, fused=True)


def linear_schedule(optimizer, total_steps: int, warmup_ratio: float):
    """Linear warmup over ceil(warmup_ratio * total_steps) steps, then linear decay to 0 (Trainer's default)."""
    warmup = math.ceil(warmup_ratio * total_steps)
    return transformers.get_linear_schedule_with_warmup(optimizer, warmup, total_steps)


# ---------------------------------------------------------------- precision and data loading on GPUs

PRECISIONS = ("auto", "bf16", "fp32")


def _checked(precision: str) -> str:
    if precision not in PRECISIONS:
        raise SymfusionError(f"precision={precision!r}; choose one of {', '.join(PRECISIONS)}")
    return precision


def use_autocast(precision: str, device: torch.device) -> bool:
    """Whether to run forward passes under bfloat16 autocast: `auto` does on CUDA (with TF32 matmuls), not on
    the CPU; `bf16` always (the CPU too, which is how the tests keep this path alive); `fp32` never."""
    enabled = _checked(precision) == "bf16" or (precision == "auto" and device.type == "cuda")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = precision != "fp32"
        torch.backends.cudnn.allow_tf32 = precision != "fp32"
    return enabled


def autocast(device: torch.device, enabled: bool):
    """bfloat16 autocast on `device` when enabled (a no-op context otherwise)."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)


@contextmanager
def evaluation_precision(precision: str, device: torch.device):
    """The precision every evaluation runs in (validation for the best epoch, test scores, merges, barriers):
    float32, with TF32 matmuls off on a GPU, unless `bf16` is asked for. `auto` trains under bfloat16 on a GPU
    but scores in float32: bfloat16 (8 bits of mantissa) ties close predictions, and on an H100 a regression
    head's validation correlation read 0.56 under it against 0.94 in float32 for the same model."""
    bf16, cuda = _checked(precision) == "bf16", device.type == "cuda"
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = bf16
    try:
        with autocast(device, bf16):
            yield
    finally:
        if cuda:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def loader_options(device: torch.device) -> dict:
    """DataLoader options that keep a GPU fed (worker processes, pinned memory); none on the CPU, where the
    data sit in memory already and extra processes only compete for the cores. Not persistent workers: a
    persistent iterator draws its workers' base seed from the shuffling generator once, where a resumed run
    draws it again, and shuffles its remaining epochs otherwise (new workers each epoch draw it every epoch,
    as the CPU's single-process loader does)."""
    if device.type != "cuda":
        return {}
    return {"num_workers": min(4, os.cpu_count() or 1), "pin_memory": True}


def rank(score, maximize: bool = True) -> float:
    """Selection key of a validation score (higher is better; a loss with maximize=False): NaN or None (an
    undefined correlation, a diverged loss) ranks below everything."""
    if score is None or math.isnan(score):
        return -math.inf
    return score if maximize else -score


# ---------------------------------------------------------------- resumable checkpoints (safetensors only)

def checkpoint_dir(output: Path) -> Path:
    """Where the checkpoint of a run writing `output` lives: beside it, hidden."""
    output = Path(output)
    return output.parent / f".{output.name}.checkpoint"


def save_checkpoint(path: Path, model, optimizer, epoch: int, best: dict, history: list, fingerprint: str,
                    generator: torch.Generator) -> None:
    """Model, AdamW moments, RNG states and progress after `epoch`, written into a new marked folder (marks.py)
    and swapped in for the previous checkpoint (only ever this trainer's own: training_run checks it)."""
    tensors, seen = {}, set()
    for key, value in model.state_dict().items():
        value = value.detach().cpu().contiguous()
        if value.data_ptr() in seen:           # a tied weight (a decoder's embeddings and LM head): its own copy
            value = value.clone()
        seen.add(value.data_ptr())
        tensors[f"model.{key}"] = value
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        for param in group["params"]:
            for key, value in optimizer.state.get(param, {}).items():
                tensors[f"optim.{names[id(param)]}.{key}"] = torch.as_tensor(value).detach().cpu().clone()
    tensors.update({f"best.{k}": v.cpu().contiguous() for k, v in best.get("state", {}).items()})
    tensors["rng.torch"] = torch.get_rng_state()
    if torch.cuda.is_initialized():            # dropout on a GPU draws from the device's own generator
        tensors["rng.cuda"] = torch.cuda.get_rng_state()
    tensors["rng.generator"] = generator.get_state()
    meta = {"epoch": epoch, "history": history, "fingerprint": fingerprint,
            "best": {k: v for k, v in best.items() if k != "state"}}
    output = path.name[1:-len(".checkpoint")]
    folder = marked_folder(path.parent, f".{output}.tmp-{HOST}-{os.getpid()}-")   # a killed save: a dead writer's temp
    try:
        tmp = folder / "checkpoint"
        tmp.mkdir()
        mark(tmp, CHECKPOINT)
        save_file(tensors, str(tmp / "state.safetensors"))
        (tmp / "progress.json").write_text(json.dumps(meta))
        swap_in(tmp, path)                     # over nothing, or this trainer's own checkpoint (training_run)
    finally:
        remove_own(folder)                     # no half-written checkpoint stays (after a swap: the previous one)


def load_checkpoint(path: Path, model, optimizer, fingerprint: str, generator: torch.Generator):
    """(epoch, best, history) from a checkpoint of the same run (this trainer's own, marked), or None to start afresh."""
    if own_folder(path, CHECKPOINT) is None or not (path / "progress.json").is_file():
        return None
    try:
        meta = json.loads((path / "progress.json").read_text())
    except (OSError, ValueError):
        return None        # a damaged checkpoint: start afresh
    if meta.get("fingerprint") != fingerprint:
        return None        # a checkpoint of another configuration: ignore it
    tensors = load_file(str(path / "state.safetensors"))
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    params = dict(model.named_parameters())
    # a fused kernel reads the step count on the parameter's device; the loop keeps it on the CPU
    on_device = optimizer.defaults.get("fused") or optimizer.defaults.get("capturable")
    for key, value in tensors.items():
        if key.startswith("optim."):
            name, slot = key[6:].rsplit(".", 1)
            param = params[name]
            optimizer.state[param][slot] = value.to(param.device) if on_device or slot != "step" else value
    torch.set_rng_state(tensors["rng.torch"])
    if "rng.cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng.cuda"])
    generator.set_state(tensors["rng.generator"])
    best_state = {k[5:]: v for k, v in tensors.items() if k.startswith("best.")}
    return meta["epoch"], {"state": best_state, **meta["best"]}, meta["history"]


def remove_checkpoint(output: Path) -> None:
    """Delete the checkpoint of a finished run (only the trainer's own hidden folder, as its mark says)."""
    remove_own(checkpoint_dir(output), CHECKPOINT)


@contextmanager
def training_run(output):
    """Around a trainer's run (inside its output claim): refuse a `.NAME.checkpoint` that is not this trainer's
    own (a link, a user's folder, another user's files: never read, written or removed); remove the checkpoint
    when the run ends in an error (no bookkeeping stays behind a refusal); an interruption keeps it to resume."""
    path = checkpoint_dir(Path(output))
    if os.path.lexists(path) and own_folder(path, CHECKPOINT) is None:
        raise SymfusionError(f"{path} is not a checkpoint this trainer wrote (a link, or another's folder); move it "
                             "away, or choose another output")
    try:
        yield
    except Exception:
        remove_own(path, CHECKPOINT)
        raise


# ---------------------------------------------------------------- the loop

def train_epoch(loader, optimizer, scheduler, description: str, batch_loss) -> float:
    """One pass over `loader` (the caller sets train mode): step on batch_loss(batch); the mean training loss."""
    running = 0.0
    for batch in steps(loader, description, "batch"):             # on a terminal only (errors.progress_wanted)
        loss = batch_loss(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        running += loss.item()
    return running / len(loader)


def replay_schedule(scheduler, steps: int) -> None:
    """Advance a resumed run's schedule to where it stopped (no optimizer step needed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(steps):
            scheduler.step()


@dataclass
class Fitted:
    """What `fit` returns: the best epoch (score, epoch), the history, and where the run resumed."""

    best_score: float | None
    best_epoch: int | None
    history: list[dict]
    resumed_after_epoch: int | None
    seconds: float
    epoch_seconds: list[float] = field(default_factory=list)
    stopped_early: bool = False


def patience_spent(epoch: int, best_epoch: int | None, patience: int | None) -> bool:
    """Whether early stopping ends a run after `epoch`: `patience` epochs since the best one (None: never)."""
    return patience is not None and best_epoch is not None and epoch - best_epoch >= patience


def tensors_digest(*tensors: torch.Tensor) -> str:
    """sha256 of tensors' dtypes, shapes and values (a split's content, a model's starting weights)."""
    digest = hashlib.sha256()
    for tensor in tensors:
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{flat.dtype}{tuple(tensor.shape)}".encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def run_fingerprint(fingerprint: str, model: torch.nn.Module) -> str:
    """The trainer's fingerprint joined with the digest of the model's state before training (names included)."""
    state = model.state_dict()
    return hashlib.sha256((fingerprint + json.dumps(sorted(state)) + tensors_digest(*state.values())).encode()).hexdigest()


def fit(output: Path, model: torch.nn.Module, optimizer, scheduler, loader, batch_loss: Callable,
        validate: Callable, epochs: int, fingerprint: str, generator: torch.Generator, metric: str,
        maximize: bool = True, patience: int | None = None) -> Fitted:
    """Train `epochs` epochs (resuming from output's checkpoint), keep the best validation epoch in `model`;
    with `patience`, stop after that many epochs in a row without a better validation score (the count is the
    epochs since the best one, so a resumed run stops where the uninterrupted one would).

    batch_loss(batch) -> loss tensor; validate(model) -> (score, {name: value} for the history); the best epoch
    has the highest score, or the lowest when maximize is False.
    The model ends on the CPU in eval mode with the best epoch's weights.
    """
    checkpoint = checkpoint_dir(output)
    start_epoch, best, history = 0, {"score": None, "epoch": None}, []
    fingerprint = run_fingerprint(fingerprint, model)         # what the run starts from, for every task kind
    resumed = load_checkpoint(checkpoint, model, optimizer, fingerprint, generator)
    if resumed:
        start_epoch, best, history = resumed
        replay_schedule(scheduler, start_epoch * len(loader))
        print(f"resumed from {checkpoint} after epoch {start_epoch}", flush=True)
    if patience is not None and (isinstance(patience, bool) or int(patience) != patience or patience < 1):
        raise SymfusionError(f"patience={patience!r}: a positive number of epochs, or null for no early stopping")
    start, epoch_seconds = time.perf_counter(), []
    stopped = patience_spent(start_epoch, best["epoch"], patience)
    for epoch in range(start_epoch, epochs):
        if stopped:
            break
        tick = time.perf_counter()
        model.train()
        train_loss = train_epoch(loader, optimizer, scheduler, f"epoch {epoch + 1}/{epochs}", batch_loss)
        epoch_seconds.append(time.perf_counter() - tick)
        score, fields = validate(model)
        history.append({"epoch": epoch + 1, "train_loss": train_loss, **fields})
        print(f"epoch {epoch + 1}/{epochs}: train loss {train_loss:.4f}, validation {metric} {score:.4f}", flush=True)
        if best["epoch"] is None or rank(score, maximize) > rank(best["score"], maximize):
            best = {"score": score, "epoch": epoch + 1,
                    "state": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}}
        save_checkpoint(checkpoint, model, optimizer, epoch + 1, best, history, fingerprint, generator)
        stopped = patience_spent(epoch + 1, best["epoch"], patience)
        if stopped and epoch + 1 < epochs:
            print(f"early stop after epoch {epoch + 1}: no better validation {metric} in {patience} epochs "
                  f"(best: epoch {best['epoch']})", flush=True)
    model.load_state_dict(best["state"])
    model.to("cpu").eval()
    return Fitted(best_score=best["score"], best_epoch=best["epoch"], history=history,
                  resumed_after_epoch=resumed[0] if resumed else None, seconds=time.perf_counter() - start,
                  epoch_seconds=epoch_seconds, stopped_early=stopped and len(history) < epochs)
