"""RegMean (Jin et al. 2023): linear layers merged in closed form from their input Gram matrices.

For every nn.Linear reached by the data, with G_i = X_i^T X_i / n_i the Gram matrix of model i's
inputs to it:

    W^T = (sum_i G'_i)^-1 sum_i G'_i W_i^T,   G'_i = alpha G_i + (1 - alpha) diag(G_i)

alpha scales the off-diagonal entries (the reference's regmean_reduce_nondiag); alpha = 0 is the
diagonal Gram (regmean_diag: true), where the merge is a per-input-coordinate weighted average
W[:, j] = sum_i G_i[j, j] W_i[:, j] / sum_i G_i[j, j]. Biases, LayerNorms, embeddings and linear
layers no batch reaches are plainly averaged; `anchor_keys` are taken from the anchor (the
reference's ViT merger keeps the anchor's classifier weight: multi_label_head_special).

A linear layer whose weight is tied to another module's (a decoder's LM head that shares the token
embeddings, as SmolLM2's does) is averaged with the embeddings it shares: the closed form holds for a
weight used only as that linear map, while the embedding lookup reads the same tensor.
"""
from __future__ import annotations

import torch
from torch import nn

from symfusion.errors import SymfusionError
from symfusion.fusion.common import first_examples
from symfusion.fusion.options import FusionMethod, Option
from symfusion.fusion.simple import average_states


def _rows(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The input rows (n, d) of a linear layer: non-padded tokens only when x is (B, T, d) along the mask."""
    if mask is not None and x.dim() == 3 and x.shape[:2] == mask.shape:
        return x[mask.bool()]  # (B, T, d) -> (tokens kept, d)
    return x.reshape(-1, x.shape[-1])  # (..., d) -> (n, d)


def tied_linears(model: nn.Module) -> set[str]:
    """Names of the nn.Linear modules whose weight is also registered under another name (an LM head tied to the
    token embeddings)."""
    names: dict[int, int] = {}
    for _, parameter in model.named_parameters(remove_duplicate=False):
        names[id(parameter)] = names.get(id(parameter), 0) + 1
    return {n for n, m in model.named_modules() if isinstance(m, nn.Linear) and names.get(id(m.weight), 0) > 1}


@torch.no_grad()
def gram_matrices(model: nn.Module, batches: list[dict]) -> dict:
    """G = X^T X / n (float64, (in, in)) of the inputs of every nn.Linear reached, by module name (linears whose
    weight is tied to another module's are left out: they are averaged)."""
    if not batches:
        raise SymfusionError("RegMean needs data batches (set fusion.num_batches > 0)")
    sums, counts, state = {}, {}, {"mask": None, "last": None}

    def hook(name):
        def record(module, args, kwargs):
            x = args[0] if args else kwargs["input"]
            last = state["last"]
            if last is not None and last[0] is x and last[1] == x._version:  # q, k, v projections read one tensor
                gram, n = last[2], last[3]
            else:
                rows = _rows(x, state["mask"]).double()
                gram, n = rows.T @ rows, rows.shape[0]  # (d, n) @ (n, d) -> (d, d)
                state["last"] = (x, x._version, gram, n)
            sums[name] = sums.get(name, 0) + gram
            counts[name] = counts.get(name, 0) + n
        return record

    tied = tied_linears(model)
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in tied]
    handles = [m.register_forward_pre_hook(hook(n), with_kwargs=True) for n, m in linears]
    training = {m: m.training for m in model.modules()}
    device = next(model.parameters()).device
    model.eval()
    try:
        for batch in batches:
            batch = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
            state["mask"] = batch.get("attention_mask")
            model(**batch)
            state["last"] = None
    finally:
        state["last"] = None
        for handle in handles:
            handle.remove()
        for module, flag in training.items():
            module.training = flag
    return {n: sums[n] / counts[n] for n in sums if counts[n] > 0}


def _solve(gram: torch.Tensor, rhs: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """gram^-1 rhs (float64). A singular gram (dead input features, or fewer tokens than features at
    alpha=1) gets a tiny ridge pulling towards `fallback`, so undetermined entries stay averaged."""
    if gram.diagonal().max() == 0:  # all inputs zero: any weight gives the same output
        return fallback
    factor, info = torch.linalg.cholesky_ex(gram)  # gram = L L^T
    pivots = factor.diagonal() ** 2  # each Cholesky pivot >= the smallest eigenvalue
    if info or not pivots.min() > 1e-12 * pivots.max():
        ridge = 1e-8 * gram.diagonal().mean()
        gram = gram + ridge * torch.eye(len(gram), dtype=gram.dtype, device=gram.device)
        rhs = rhs + ridge * fallback
        factor, info = torch.linalg.cholesky_ex(gram)
        if info:  # not even the ridge makes it positive definite (rounding): a general solve
            return torch.linalg.solve(gram, rhs)
    return torch.cholesky_solve(rhs, factor)  # two triangular solves with the factor above


def _statistic(model: nn.Module, batches: list[dict], num_examples: int | None) -> dict:
    """G_i: model i's Gram matrices on the first `num_examples` examples of its batches."""
    return gram_matrices(model, first_examples(batches, num_examples))


def _fuse(models: list, grams: list[dict], alpha: float, anchor_keys: list[str]) -> dict:
    """W^T = (sum_i G'_i)^-1 sum_i G'_i W_i^T for every linear layer, G' = alpha G + (1-alpha) diag(G);
    everything else simply averaged, `anchor_keys` from the anchor. `grams`: G_i of each model (`_statistic`)."""
    states = [m.state_dict() for m in models]
    missing = sorted(set(anchor_keys) - set(states[0]))
    if missing:
        raise SymfusionError(f"regmean: anchor_keys names {missing[0]!r}, which the models do not have")
    merged = average_states(states)
    for name in grams[0]:
        key = f"{name}.weight"
        if key not in merged or any(name not in g for g in grams):
            continue  # not a state-dict weight, or not reached in every model: averaged
        scaled = [alpha * g[name] + (1 - alpha) * torch.diag(g[name].diagonal()) for g in grams]  # (in, in)
        rhs = sum(g @ s[key].double().T.to(g.device) for g, s in zip(scaled, states))  # (in, out)
        solution = _solve(sum(scaled), rhs, merged[key].double().T.to(rhs.device))  # W^T: (in, out)
        merged[key] = solution.T.to(device=states[0][key].device, dtype=states[0][key].dtype)
    for key in anchor_keys:
        merged[key] = states[0][key].clone()
    return merged


# The defaults: RegMean; ViT as the reference's vit-fusion/experiments/regmean.yaml (regmean_diag: true = alpha 0,
# 1,000 validation images, the anchor's classifier weight kept by multi_label_head_special); text models: alpha 0.1
# (the NLP reference's RoBERTa value; the language merges pass 0.1 or 0.9 themselves).
METHOD = FusionMethod(
    "regmean", _fuse, "closed-form merge of every linear layer from its input Gram matrices", reads_data=True,
    label="RegMean",
    statistic=_statistic, statistic_options=("num_examples",),
    options=(
        Option("alpha", {"vit": 0.0, "default": 0.1},
               "scale of the off-diagonal Gram entries (0: diagonal Gram matrices)",
               valid=lambda v: 0.0 <= v <= 1.0, rule="in [0, 1]"),
        Option("anchor_keys", {"vit": ["classifier.weight"], "default": []},
               "state-dict keys taken from the anchor instead of merged", kind=list),
        Option("num_examples", {"vit": 1000, "default": None},
               "examples per model the Gram matrices are computed on (null: every example given)",
               kind=int, valid=lambda v: v >= 1, rule=">= 1", nullable=True),
    ),
)
merge = METHOD.merge
