"""Residual-stream matching: the map R of the stream maximising <R, M> for the cross product M of every residual tensor.

A map h -> R h moves every residual axis (stream.py), and each moved tensor X (its residual axis first,
(d, n)) meets the anchor's Y in the objective as <R X, Y> = <R, Y X^T>. So, with the block transforms
fixed, the distance to the anchor is const - 2 <R, M>, M = sum_X Y X^T, and its minimum over the group
of R is one solve:
- orthogonal (RMSNorm, pre-norm): the Procrustes solution, the polar factor U V^T of M;
- orthogonal fixing the all-ones direction up to sign (LayerNorm): the Procrustes solution of B^T M B on
  the complement of 1 (B an orthonormal basis of it), and sign(1^T M 1) on 1;
- permutation: the linear assignment on M; signed permutation (RMSNorm): on |M|, each sign that of its entry.
Norm gains that are not folded move by |R|: their cross product G = g_a g_s^T adds to the assignment's
score whatever the signs. A tensor with two residual axes (a pooler's weight, permuted on both) is
linearised at the current map: M += Y R X^T + Y^T R X.

The stream's activations give another estimate: the cross-covariance C = sum_tokens h_a h_s^T of the two
models' residual streams at the same inputs (after the embeddings; centred for LayerNorm, whose
mean-centring makes the all-ones direction invisible), solved in the same group.

The gauge: once the stream is moved (and the pre-norms folded), any gain t != 0 per coordinate unfolds it
exactly (the norm's gain and bias times t, its readers' columns divided by t). gauge_gains picks, per norm and
coordinate, the t closest to the anchor as stored, the paper's rescaling problem (eq. 12) for one coordinate:
    f(t) = A t^2 - 2 B t + D / t^2 - 2 E / t,
A = 1 + beta^2 and B = g_a + beta b_a (the folded norm: gain 1, bias beta; the anchor's gain g_a and bias b_a),
D = sum_k |u_k|^2 and E = sum_k <u_k, a_k> over the readers' columns (u: moved source, a: anchor). Taking the
anchor's gains instead (t = g_a) would divide the readers' columns by g_a: a real checkpoint with near-zero
gains (SmolLM2-135M) then had its matched weights 250 times farther from the anchor than before matching.
"""
from __future__ import annotations

from typing import Mapping

import torch

from symfusion.errors import SymfusionError
from symfusion.matching.permutation import max_assignment
from symfusion.matching.rescale import best_scales
from symfusion.matching.rotation import polar_factor_svd
from symfusion.stream import NormFold, StreamLayout, centred_basis, centred_map

GROUPS = ("permutation", "signed_permutation", "orthogonal", "orthogonal_centred")


def residual_group(stream: StreamLayout, kind: str, family: str) -> str:
    """The group a `matching.residual` choice (permutation, orthogonal, auto) means for this model; one error line
    when the model admits none, or not that one."""
    problem = stream.problem(family)
    if problem:
        raise SymfusionError(f"matching.residual={kind}: {problem}")
    if kind == "auto":
        kind = "permutation" if stream.orthogonal_problem(family) else "orthogonal"
    if kind == "permutation":
        return "signed_permutation" if stream.norm == "rmsnorm" else "permutation"
    if kind == "orthogonal":
        problem = stream.orthogonal_problem(family)
        if problem:
            raise SymfusionError(f"matching.residual=orthogonal is not exact for this model: {problem}")
        return "orthogonal_centred" if stream.norm == "layernorm" else "orthogonal"
    raise SymfusionError(f"matching.residual={kind!r}; choose none, permutation, orthogonal or auto")


def residual_cross(source: Mapping[str, torch.Tensor], anchor: Mapping[str, torch.Tensor], stream: StreamLayout,
                   current: torch.Tensor | None = None, keys=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, G): the cross products of the residual tensors (canonical, folded states) that R and |R| meet, (d, d)
    float64 each; `keys` restricts them to some tensors, `current` linearises the two-axis ones."""
    d = stream.hidden
    m = torch.zeros(d, d, dtype=torch.float64)
    g = torch.zeros(d, d, dtype=torch.float64)
    folded = stream.folded
    for key, axes in stream.axes:
        if (keys is not None and key not in keys) or key in folded or key not in anchor:
            continue
        x, y = source[key].to(torch.float64), anchor[key].to(torch.float64)
        if key in stream.gains:                                # unfolded gain: moves by |R|
            g += torch.outer(y, x)
        elif len(axes) == 1:
            xs = torch.movedim(x, axes[0], 0).reshape(d, -1)  # (d, n)
            ys = torch.movedim(y, axes[0], 0).reshape(d, -1)
            m += ys @ xs.T
        elif current is not None:                              # (d, d) with both axes in the stream
            m += y @ current @ x.T + y.T @ current @ x
    return m, g


def solve_residual(m: torch.Tensor, group: str, g: torch.Tensor | None = None) -> torch.Tensor:
    """argmax over R in the group of <R, m> + <|R|, g>, (d, d) float64."""
    d = m.shape[0]
    g = torch.zeros_like(m) if g is None else g
    if group == "orthogonal":
        return polar_factor_svd(m[None])[0]
    if group == "orthogonal_centred":
        basis = centred_basis(d)
        ones = torch.full((d,), d ** -0.5, dtype=torch.float64)
        q = polar_factor_svd((basis.T @ m @ basis)[None])[0]
        return centred_map(q, 1.0 if ones @ m @ ones >= 0 else -1.0)
    if group in ("permutation", "signed_permutation"):
        signed = group == "signed_permutation"
        score = (m.abs() if signed else m) + g
        perm = max_assignment(score.numpy())                   # new coordinate i <- old coordinate perm[i]
        r = torch.zeros(d, d, dtype=torch.float64)
        rows = torch.arange(d)
        r[rows, perm] = torch.where(m[rows, perm] < 0, -1.0, 1.0).to(r.dtype) if signed else 1.0
        return r
    raise SymfusionError(f"unknown residual group {group!r}; one of {', '.join(GROUPS)}")


def project_to_group(x: torch.Tensor, group: str) -> torch.Tensor:
    """The element of a continuous residual group nearest to x (d, d) in Frobenius norm: its polar factor (for
    LayerNorm on the complement of 1, the sign of 1^T x 1 on 1)."""
    if group not in ("orthogonal", "orthogonal_centred"):
        raise SymfusionError(f"no projection onto the {group} group")
    return solve_residual(x, group)


def activation_cross(anchor_states: torch.Tensor, source_states: torch.Tensor, stream: StreamLayout) -> torch.Tensor:
    """sum over tokens of h_a h_s^T for two (tokens, d) residual streams at the same inputs, (d, d) float64;
    LayerNorm streams are centred first (their mean is invisible to every reader)."""
    a, s = anchor_states.to(torch.float64), source_states.to(torch.float64)
    if stream.norm == "layernorm":
        a, s = a - a.mean(dim=1, keepdim=True), s - s.mean(dim=1, keepdim=True)
    return a.T @ s


def gauge_gains(moved: Mapping[str, torch.Tensor], anchor: Mapping[str, torch.Tensor],
                folds: tuple[NormFold, ...]) -> dict[str, torch.Tensor]:
    """Per folded norm, the gains (d,) float64 that unfold the moved source closest to the anchor; `moved`: the
    moved source, folded and canonical; `anchor`: the anchor, canonical as stored (the module docstring)."""
    gains = {}
    for fold in folds:
        a = torch.ones_like(anchor[fold.gain], dtype=torch.float64)
        b = anchor[fold.gain].double().clone()
        if fold.bias:
            beta = moved[fold.bias].double()
            a, b = a + beta ** 2, b + beta * anchor[fold.bias].double()
        readers = [k for k in fold.readers if k in anchor]      # a head of another size has no counterpart
        d = sum((moved[k].double().pow(2).sum(0) for k in readers), torch.zeros_like(a))   # (hidden,) per column
        e = sum(((moved[k].double() * anchor[k].double()).sum(0) for k in readers), torch.zeros_like(a))
        gains[fold.gain] = best_scales(a.numpy(), b.numpy(), d.numpy(), e.numpy())
    return gains
