"""Scores of k models merged into one: the centroid merge on a task's test split, the simplex barrier, the best end model and the logit ensemble.

One source of truth for benchmarks/bench_kway.py and the k-way stage (symfusion-kway, stages/kway.py). A task is a
task object of pipeline/tasks (its `metric`: accuracy, or perplexity for a causal_lm task; `evaluate`, `split`,
`blocks`); `model_dir` is the folder whose tokenizer cuts a decoder's test blocks (None for images). The maths of the
simplex (its grid, the mixtures, the barrier) is the library's: symfusion.interpolation.
    centroid     the equal-weight merge (1/k) sum_i X_i, on the whole test split
    barrier      max over the grid's points w of loss(sum_i w_i X_i) - sum_i w_i loss(end_i), on `examples` test
                 examples (the end models' losses on the same examples)
"""
from __future__ import annotations

import math

import torch
from torch.utils.data import DataLoader

from symfusion.interpolation import mixture, simplex_barrier, simplex_grid, simplex_losses
from symfusion.io.modelio import load_tokenizer

TEST = "test"


def evaluate(model, state, task, examples: int | None = None, model_dir=None) -> dict:
    """The task's metric (accuracy, or perplexity) and loss of `model` holding `state`, on the test split (`examples`:
    its seeded subset of that many)."""
    model.load_state_dict(state)
    return scored(model, task, examples, model_dir)


def scored(model, task, examples: int | None = None, model_dir=None) -> dict:
    """{metric, loss} of the model as it is, on the test split."""
    result = task.evaluate(model.eval(), TEST, model_dir=model_dir, examples=examples)
    return {task.metric: result[task.metric], "loss": result["loss"]}


def best_of(ends: list[dict]) -> dict:
    """The best end model's scores: the highest accuracy, or for a decoder the lowest loss."""
    return max(ends, key=lambda r: r["accuracy"]) if "accuracy" in ends[0] else min(ends, key=lambda r: r["loss"])


@torch.no_grad()
def ensemble(models, task, model_dir=None) -> dict:
    """The logit ensemble (the mean of the k models' logits) on the whole test split: accuracy and the cross-entropy
    of the mean logits, or a decoder's perplexity and loss in nats per token."""
    if task.metric == "perplexity":
        return _ensemble_lm(models, task, model_dir)
    hits, losses = 0, []
    for batch in DataLoader(task.split(TEST), batch_size=500, shuffle=False):
        logits = torch.stack([m.eval()(pixel_values=batch["pixel_values"]).logits for m in models]).mean(0)
        hits += int((logits.argmax(-1) == batch["labels"]).sum())
        losses += torch.nn.functional.cross_entropy(logits.double(), batch["labels"], reduction="none").tolist()
    return {"accuracy": hits / len(losses), "loss": math.fsum(losses) / len(losses)}


def _ensemble_lm(models, task, model_dir) -> dict:
    """A decoder's logit ensemble on the test blocks: the loss of the mean next-token logits, nats per token."""
    blocks, sums = task.blocks(TEST, load_tokenizer(model_dir)), []
    for batch in blocks.split(int(task.cfg.eval_batch_size)):
        logits = torch.stack([m.eval()(input_ids=batch).logits[:, :-1] for m in models]).mean(0)
        sums += torch.nn.functional.cross_entropy(logits.double().transpose(1, 2), batch[:, 1:],
                                                  reduction="none").sum(1).tolist()
    loss = math.fsum(sums) / (len(sums) * (blocks.shape[1] - 1))
    return {"perplexity": math.exp(loss), "loss": loss}


@torch.no_grad()
def end_losses(model, ends: list[dict], task, examples: int | None = None, model_dir=None) -> list[float]:
    """Each end model's loss on the barrier's test examples (the line under the simplex barrier)."""
    return [evaluate(model, state, task, examples, model_dir)["loss"] for state in ends]


@torch.no_grad()
def score_way(model, states: list[dict], ends_loss: list[float], task, grid: int = 4, examples: int | None = None,
              model_dir=None) -> dict:
    """One way of moving k models into one basis, scored: its centroid merge on the whole test split, and its simplex
    barrier over simplex_grid(k, grid) on `examples` test examples against the end models' losses `ends_loss` there
    (end_losses). `model`: a module of the family whose weights are overwritten."""
    k = len(states)
    points = simplex_grid(k, grid)
    centroid = evaluate(model, mixture(states, [1 / k] * k), task, model_dir=model_dir)
    losses = simplex_losses(model, states, lambda m: scored(m, task, examples, model_dir), points)
    return {"centroid": centroid, "barrier": simplex_barrier(points, [r["loss"] for r in losses], ends_loss),
            "points": losses}
