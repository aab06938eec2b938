"""Fisher merging (Matena & Raffel 2022): parameters averaged with diagonal-Fisher weights.

    theta = sum_i w_i theta_i / sum_i w_i,   w_i = c_i (F_i + eps)            (per entry)

F_i is model i's diagonal Fisher, the mean over examples of the squared per-example gradient of
the loss (the labels' loss: the empirical Fisher). With normalize=param (the reference's ViT
setting, fisher_normalize: param), each model's Fisher is first scaled per parameter tensor p:
c_i = (1 / (||F_i[p]|| + eps)) / sum_j (1 / (||F_j[p]|| + eps)), ||.|| the Frobenius norm, so a
model whose Fisher is uniformly larger does not dominate; with normalize=none, c_i = 1.
Tensors whose name contains one of `plain_average` are plainly averaged (the reference's ViT
merger does this for every name containing "embedding" or "classifier").
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from symfusion.errors import SymfusionError
from symfusion.fusion.common import first_examples
from symfusion.fusion.options import FusionMethod, Option
from symfusion.fusion.simple import average_states


def split_batch(batch: dict, device) -> tuple[dict, dict, int]:
    """(per-example tensors with a leading batch dim, other inputs, batch size); tensors moved to `device`."""
    if "labels" not in batch:
        raise SymfusionError("Fisher merging needs 'labels' in every batch (the loss is differentiated)")
    size = batch["labels"].shape[0]
    examples, static = {}, {}
    for key, value in batch.items():
        if torch.is_tensor(value):
            value = value.to(device)
            if value.dim() >= 1 and value.shape[0] == size:
                examples[key] = value
                continue
        static[key] = value
    return examples, static, size


def _squared_grads_vmap(model, params, buffers, examples, static) -> dict:
    """Sum over examples of the squared per-example gradient, with vmap(grad) over the batch dim."""
    def example_loss(p, example):
        inputs = {k: v.unsqueeze(0) for k, v in example.items()}  # one example: (1, ...)
        return functional_call(model, (p, buffers), args=(), kwargs={**inputs, **static}).loss

    grads = vmap(grad(example_loss), in_dims=(None, 0))(params, examples)  # name -> (B, *param.shape)
    return {n: _squared(g).sum(0) for n, g in grads.items()}


def _one_example(examples: dict, i: int) -> dict:
    """Example i as a batch of one, without its padding: a padded position changes no gradient (it is masked
    and its label ignored), so the trailing pad tokens of a text example are cut off before the pass."""
    one = {k: v[i:i + 1] for k, v in examples.items()}
    mask = one.get("attention_mask")
    if mask is None or mask.dim() != 2 or not bool(mask[0].any()):
        return one
    length = int(mask[0].nonzero().max()) + 1                          # last real token
    sequence = mask.shape[1]
    return {k: v[:, :length] if v.dim() >= 2 and v.shape[1] == sequence else v for k, v in one.items()}


def _squared_grads_loop(model, params, examples, static) -> dict:
    """The same sum, one backward pass per example (for models vmap cannot transform).

    Embedding tables give sparse gradients here: one example's gradient of a (vocabulary, hidden) table is
    zero outside the rows of its own tokens, so only those rows are summed (duplicates first) and squared.
    """
    for p in params.values():
        p.requires_grad_(True)
    sums = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()}
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding) and not m.sparse]
    try:
        for module in embeddings:
            module.sparse = True
        for i in range(len(examples["labels"])):
            loss = model(**_one_example(examples, i), **static).loss
            grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
            for name, g in zip(params, grads):
                if g is None:
                    continue
                if g.is_sparse:                              # rows of the example's tokens only
                    g = g.coalesce()                         # (rows, hidden) values, duplicate rows summed
                    sums[name].index_add_(0, g.indices()[0], _squared(g.values()))
                else:
                    sums[name] += _squared(g)
    finally:
        for module in embeddings:
            module.sparse = False
    return sums


def _squared(g: torch.Tensor) -> torch.Tensor:
    """g^2 in float32, NaN (an example without any labelled token) set to 0, in place on a fresh tensor."""
    return g.float().square().nan_to_num_(nan=0.0, posinf=math.inf)


def diagonal_fisher(model: nn.Module, batches: list[dict], chunk_size: int = 8, vectorize: bool = True) -> dict:
    """F = mean over examples of (d loss_example / d theta)^2, per parameter name (float32, param shape).

    Per-example gradients come from torch.func (vmap over chunks of `chunk_size` examples) or, if
    vmap fails for this model or `vectorize` is False, from a loop over examples. The model runs in
    eval mode (no dropout); its train flags and requires_grad are restored afterwards. Examples whose
    loss has no labelled token contribute zero. Tied parameters are listed under every name.
    """
    if not batches:
        raise SymfusionError("Fisher merging needs data batches (set fusion.num_batches > 0)")
    training = {m: m.training for m in model.modules()}
    requires = {p: p.requires_grad for p in model.parameters()}
    named = {n: p for n, p in model.named_parameters() if p.is_floating_point()}
    detached = {n: p.detach() for n, p in named.items()}
    buffers = dict(model.named_buffers())
    device = next(model.parameters()).device
    sums = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in named.items()}
    count = 0
    model.eval()
    try:
        for batch in batches:
            examples, static, size = split_batch(batch, device)
            for start in range(0, size, chunk_size):
                chunk = {k: v[start:start + chunk_size] for k, v in examples.items()}  # (<= chunk_size, ...)
                squared = None
                if vectorize:
                    try:
                        squared = _squared_grads_vmap(model, detached, buffers, chunk, static)
                    except Exception:  # noqa: BLE001 - vmap cannot transform this model: loop from now on
                        vectorize = False
                if squared is None:
                    squared = _squared_grads_loop(model, named, chunk, static)
                for name in sums:
                    sums[name] += squared[name]
            count += size
    finally:
        for module, flag in training.items():
            module.training = flag
        for p, flag in requires.items():
            p.requires_grad_(flag)
    fisher = {n: s / count for n, s in sums.items()}
    for name, p in model.named_parameters(remove_duplicate=False):  # aliases of tied parameters
        if name not in fisher and p.is_floating_point():
            fisher[name] = fisher[next(n for n, q in named.items() if q is p)]
    return fisher


def fisher_weights(fishers: list[dict], name: str, epsilon: float, normalize: str) -> list[torch.Tensor]:
    """w_i = c_i (F_i + eps) of one tensor (float64); c_i from the per-tensor norms when normalize=param."""
    values = [f[name].double() for f in fishers]
    if normalize == "none":
        return [v + epsilon for v in values]
    inverse = [1.0 / (v.norm() + epsilon) for v in values]           # 1 / (||F_i|| + eps)
    return [c / sum(inverse) * (v + epsilon) for c, v in zip(inverse, values)]


@torch.no_grad()
def _weighted(weights: list[torch.Tensor], states: list[dict], name: str) -> torch.Tensor:
    """sum_i w_i theta_i / sum_i w_i in float64, cast back to the anchor's dtype."""
    total = sum(w * s[name].double() for w, s in zip(weights, states))
    return (total / sum(weights)).to(states[0][name].dtype)


def _statistic(model: nn.Module, batches: list[dict], num_examples: int | None, chunk_size: int) -> dict:
    """F_i: model i's diagonal Fisher on the first `num_examples` examples of its batches."""
    return diagonal_fisher(model, first_examples(batches, num_examples), chunk_size=chunk_size)


def _fuse(models: list, fishers: list[dict], epsilon: float, normalize: str, plain_average: list[str]) -> dict:
    """Fisher-weighted average of every parameter (plain average where no model has a gradient, and for
    names containing a `plain_average` part); buffers and non-float tensors from the anchor.
    `fishers`: F_i of each model (`_statistic`)."""
    states = [m.state_dict() for m in models]
    merged = average_states(states)  # kept for parameters without any gradient (all F_i = 0)
    for key, tensor in states[0].items():
        if key not in fishers[0]:
            merged[key] = tensor.clone()  # a buffer
        elif any(part in key for part in plain_average):
            continue
        elif any(f[key].any() for f in fishers):
            merged[key] = _weighted(fisher_weights(fishers, key, epsilon, normalize), states, key)
    return merged


# The defaults: Fisher merging; ViT as the reference's vit-fusion/experiments/fisher.yaml (fisher_normalize: param,
# fisher_smooth 1e-10, 1,000 validation images one per batch, "embedding"/"classifier" tensors averaged:
# otfusion/avg_merger.py); text models keep the NLP settings (no normalisation).
METHOD = FusionMethod(
    "fisher", _fuse, "diagonal-Fisher weighted average of every parameter", reads_data=True, label="Fisher",
    statistic=_statistic, statistic_options=("num_examples", "chunk_size"),
    options=(
        Option("num_examples", {"vit": 1000, "default": None},
               "examples per model the Fisher is estimated on (null: every example given)",
               kind=int, valid=lambda v: v >= 1, rule=">= 1", nullable=True),
        Option("normalize", {"vit": "param", "default": "none"},
               "scale each model's Fisher per parameter tensor (param) or not (none)", kind=str, choices=("none", "param")),
        Option("plain_average", {"vit": ["embedding", "classifier"], "default": []},
               "parameters whose name contains one of these are plainly averaged", kind=list),
        Option("epsilon", {"vit": 1e-10, "default": 1e-8},
               "added to every Fisher value (keeps parameters without gradient averaged)",
               valid=lambda v: v > 0, rule="> 0"),
        Option("chunk_size", 8, "examples per vmap call of the per-example gradients", kind=int,
               valid=lambda v: v >= 1, rule=">= 1"),
    ),
)
merge = METHOD.merge
