"""Joint rotation and rescaling of attention heads by alternating Procrustes and quartic steps.

The paper matches attention in two steps: rotation R with a = 1 (Algorithm 1), then the
scale a for that R (eq. 12); Appendix D notes this does not minimise the joint objective.
For one head (QK side; VO is the same with value for Q and output for K) it is
    f(R, a) = A a^2 - 2 a <R, C_q> + D / a^2 - 2 <R, C_k> / a + const
with A = |Q_1|^2, D = |K_1|^2 (source, biases included), C_q, C_k the query and key cross
parts (matching/rotation.py) and const = |Q_2|^2 + |K_2|^2, so that f is the squared
distance of the moved source to the anchor. Block coordinate descent alternates
    R <- argmax <R, a C_q + C_k / a>       (Procrustes for fixed a)
    a <- best_scales(A, <R, C_q>, D, <R, C_k>)   (the quartic for fixed R)
starting from a = 1, so iteration 1 is exactly the sequential method. Each step is an exact
block minimisation, so f cannot increase; rounding can, so every head keeps its best iterate.
All heads are solved at once; the Python loop runs over iterations only.
"""
from __future__ import annotations

from typing import Mapping

import torch

from symfusion.arch import AttentionLayout
from symfusion.matching.rescale import best_scales, squared_norms
from symfusion.matching.rotation import frobenius_inner, procrustes, qk_cross_parts, qk_procrustes, vo_cross_parts
from symfusion.symmetry import LayerTransform

MAX_ITER = 50
REL_TOL = 1e-10


def qk_norms(state: Mapping, att: AttentionLayout, heads: int):
    """Per-(KV-)head squared norms of the query-like and of the key-like maps (biases included), (kv,) each.

    A KV group's query heads are contiguous rows, so reshaping to (kv, -1) sums over the group."""
    kv = heads // att.group

    def side(projections):
        parts = [state[p.weight].reshape(kv, -1) for p in projections]
        parts += [state[p.bias].reshape(kv, -1) for p in projections if p.bias is not None]
        return squared_norms(parts)
    return side(att.query_like), side(att.key_like)


def vo_norms(state: Mapping, att: AttentionLayout, heads: int):
    """Per-(KV-)head squared norms of the value map (weight + bias) and of the output columns, (kv,) each."""
    kv = heads // att.group
    value = [state[att.value.weight].reshape(kv, -1)]
    if att.value.bias is not None:
        value.append(state[att.value.bias].reshape(kv, -1))
    output = state[att.output.weight]
    output = output.reshape(output.shape[0], kv, -1).transpose(0, 1)    # (kv, n, group*d)
    return squared_norms(value), squared_norms([output])


def head_objective(r, a, norm_up, norm_down, cross_up, cross_down, const) -> torch.Tensor:
    """f(R, a) per head: the squared distance of the moved source to the anchor, (H,) float64.

    `up` is the side multiplied by a (query-like / value), `down` the side divided by a
    (key-like / output). r (H, d, d); a, norms and const (H,); crosses (H, d, d).
    """
    inner_up, inner_down = frobenius_inner(r, cross_up), frobenius_inner(r, cross_down)
    return norm_up * a**2 - 2 * a * inner_up + norm_down / a**2 - 2 * inner_down / a + const


def alternate(norm_up, norm_down, cross_up, cross_down, const, max_iter=MAX_ITER, tol=REL_TOL, solver=procrustes):
    """Alternate Procrustes and quartic steps for all heads at once; returns (r, a, info).

    norm_*, const: (H,) float64; cross_*: (H, d, d). Iteration 1 (a = 1, then the quartic) is
    the sequential method; the best iterate per head is kept, so the result is never worse. solver: the
    Procrustes step (rotation.qk_procrustes restricts Q/K to RoPE planes).
    """
    best_r, best_a, best_f, a = None, None, None, None
    history = []                                   # the objective after each iteration, summed over heads
    for step in range(max_iter):
        # a = 1 in the first step, with the sum formed exactly as the sequential method forms it
        combined = cross_up + cross_down if step == 0 else a[:, None, None] * cross_up + cross_down / a[:, None, None]
        r = solver(combined)                                                           # (H, d, d)
        a = best_scales(norm_up, frobenius_inner(r, cross_up), norm_down, frobenius_inner(r, cross_down))
        f = head_objective(r, a, norm_up, norm_down, cross_up, cross_down, const)    # (H,)
        if best_f is None:
            best_r, best_a, best_f = r, a, f
        else:
            better = f < best_f
            best_r = torch.where(better[:, None, None], r, best_r)
            best_a, best_f = torch.where(better, a, best_a), torch.minimum(f, best_f)
        history.append(f.sum().item())
        if len(history) > 1 and history[-2] - history[-1] <= tol * abs(history[-2]):
            break
    info = {"iterations": len(history), "objective": history,
            "objective_sequential": history[0], "objective_joint": best_f.sum().item()}
    return best_r, best_a, info


@torch.no_grad()
def match_qk_joint(source: Mapping, anchor: Mapping, att: AttentionLayout, heads: int, **kwargs):
    """Joint (R_qk, a_qk) per head moving the source's QK maps onto the anchor's: (r, a, info)."""
    cross_q, cross_k = qk_cross_parts(source, anchor, att, heads)
    norm_q, norm_k = qk_norms(source, att, heads)
    const = sum(qk_norms(anchor, att, heads))
    return alternate(norm_q, norm_k, cross_q, cross_k, const, solver=lambda c: qk_procrustes(c, att), **kwargs)


@torch.no_grad()
def match_vo_joint(source: Mapping, anchor: Mapping, att: AttentionLayout, heads: int, **kwargs):
    """Joint (R_vo, a_vo) per head moving the source's value/output maps onto the anchor's: (r, a, info)."""
    cross_v, cross_o = vo_cross_parts(source, anchor, att, heads)
    norm_v, norm_o = vo_norms(source, att, heads)
    const = sum(vo_norms(anchor, att, heads))
    return alternate(norm_v, norm_o, cross_v, cross_o, const, **kwargs)


def match_attention_joint(
    source: Mapping, anchor: Mapping, att: AttentionLayout, heads: int, max_iter: int = MAX_ITER, tol: float = REL_TOL
) -> tuple[LayerTransform, dict]:
    """One layer's attention matched by joint rotation + rescaling; info per side (qk, vo).

    info[side] holds iterations, the objective after each iteration (best so far), and
    objective_sequential (iteration 1 = rotation then rescaling) vs objective_joint (final).
    """
    r_qk, a_qk, info_qk = match_qk_joint(source, anchor, att, heads, max_iter=max_iter, tol=tol)
    r_vo, a_vo, info_vo = match_vo_joint(source, anchor, att, heads, max_iter=max_iter, tol=tol)
    return LayerTransform(r_qk=r_qk, a_qk=a_qk, r_vo=r_vo, a_vo=a_vo), {"qk": info_qk, "vo": info_vo}
