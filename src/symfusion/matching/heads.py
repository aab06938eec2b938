"""Head matching: which source KV group, and which query head inside it, goes to each anchor head.

Whole heads are a symmetry of multi-head attention; with grouped-query attention so are whole
KV groups (a KV head with its `group` query heads) and query heads within one group
(symmetry.py's head_perm). The assignment is solved before the within-head solves, with
scores that do not depend on the within-head gauge: for a (source, anchor) pair, the value
max_R <R, M> of the pair's cross product M over the Q/K group (RoPE planes, orthogonal, or
only the identity) plus that over the orthogonal V/O group (rotation.group_value). So a
planted head permutation is found even when the heads were rotated as well.

Multi-head attention (group = 1): the objective separates over head pairs, so one linear
assignment on the pair values is the exact optimum over head permutations and rotations.
Grouped-query attention: for each (source group, anchor group) pair, the order of the query
heads is the assignment on per-query-head values (a query head's Q and O cross products, each
maximised on its own: an upper bound), kept only where it beats the identity order on the
pair's exact value (the Q cross products of the group summed with K's, the O ones with V's).
The KV groups are then assigned on those exact values, so the result is never worse than
leaving the heads in place.

git_rebasin assigns heads on its own group's values (linear-assignment values of the V/O and
non-rotary Q/K coordinates); rotation matching with grouped-query attention computes both
assignments and keeps the one with the larger rotation objective (with multi-head attention its
own assignment is already the exact optimum), so that rotation matching is never farther from the
anchor than git_rebasin, and git_rebasin never farther than no matching.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
from scipy.optimize import linear_sum_assignment

from symfusion.arch import AttentionLayout, Projection
from symfusion.matching.permutation import max_assignment
from symfusion.matching.rotation import compute_dtype, group_value, nuclear_norm


def pair_cross(source: Mapping, anchor: Mapping, proj: Projection, heads: int) -> torch.Tensor:
    """W_1^s (W_2^a)^T (+ biases) for every (source head s, anchor head a) of a row-blocked map, (H, H, d, d)."""
    w1, w2 = source[proj.weight], anchor[proj.weight]
    dtype = compute_dtype(w1)
    cross = w1.to(dtype) @ w2.to(dtype).T                                     # (H*d, H*d)
    if proj.bias is not None:
        cross = cross + torch.outer(source[proj.bias].to(dtype), anchor[proj.bias].to(dtype))
    d = cross.shape[0] // heads
    return cross.reshape(heads, d, heads, d).transpose(1, 2)                 # (H_source, H_anchor, d, d)


def output_pair_cross(source: Mapping, anchor: Mapping, proj: Projection, heads: int) -> torch.Tensor:
    """(W_O1^s)^T W_O2^a for every (source head, anchor head) of the column-blocked output map, (H, H, d, d)."""
    w1, w2 = source[proj.weight], anchor[proj.weight]
    dtype = compute_dtype(w1)
    cross = w1.to(dtype).T @ w2.to(dtype)                                     # (H*d, H*d)
    d = cross.shape[0] // heads
    return cross.reshape(heads, d, heads, d).transpose(1, 2)


def permutation_value(cross: torch.Tensor) -> torch.Tensor:
    """max over permutation matrices P of <P, M>, batched over leading dims (a linear assignment each), float64."""
    flat = cross.to(torch.float64).reshape(-1, *cross.shape[-2:]).numpy()
    values = [m[rows, cols].sum() for m in flat for rows, cols in [linear_sum_assignment(m, maximize=True)]]
    return torch.tensor(values, dtype=torch.float64).reshape(cross.shape[:-2])


def qk_permutation_value(cross: torch.Tensor, att: AttentionLayout) -> torch.Tensor:
    """max <P, M> over the q/k coordinate permutations that keep the logits (none on RoPE's rotary dims)."""
    if att.qk_group == "orthogonal":
        return permutation_value(cross)
    r = att.rotary_dim if att.qk_group == "rope" else cross.shape[-1]
    value = torch.diagonal(cross[..., :r, :r].to(torch.float64), dim1=-2, dim2=-1).sum(dim=-1)
    if r < cross.shape[-1]:
        value = value + permutation_value(cross[..., r:, r:])
    return value


@dataclass
class PairCrosses:
    """Cross products of every (source head, anchor head) pair of one layer, grouped by KV head:
    query, output (kv_s, kv_a, g_s, g_a, d, d); key, value (kv_s, kv_a, d, d)."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    output: torch.Tensor

    @property
    def group(self) -> int:
        return self.query.shape[2]


def pair_crosses(source: Mapping, anchor: Mapping, att: AttentionLayout, heads: int) -> PairCrosses:
    """Every head pair's Q, K, V and O cross products (biases included) of one attention layer."""
    group, kv = att.group, heads // att.group
    query = sum(pair_cross(source, anchor, p, heads) for p in att.query_like)        # (H, H, d, d)
    output = output_pair_cross(source, anchor, att.output, heads)                    # (H, H, d, d)
    d = query.shape[-1]
    return PairCrosses(
        query=query.reshape(kv, group, kv, group, d, d).transpose(1, 2),             # (kv_s, kv_a, g_s, g_a, d, d)
        key=sum(pair_cross(source, anchor, p, kv) for p in att.key_like),            # (kv_s, kv_a, d, d)
        value=pair_cross(source, anchor, att.value, kv),
        output=output.reshape(kv, group, kv, group, d, d).transpose(1, 2),
    )


def _values(att: AttentionLayout, kind: str):
    """(Q/K value, V/O value) functions of a cross product for rotation or permutation matching."""
    if kind == "rotation":
        return lambda m: group_value(m, att.qk_group, att.rotary_dim), nuclear_norm
    return lambda m: qk_permutation_value(m, att), permutation_value


def _pair_value(c: PairCrosses, s: int, a: int, order: torch.Tensor, values) -> torch.Tensor:
    """The exact objective of source group s on anchor group a, anchor query head t <- source head order[t]."""
    qk_value, vo_value = values
    within = torch.arange(c.group)
    return (qk_value(c.query[s, a, order, within].sum(0) + c.key[s, a])
            + vo_value(c.output[s, a, order, within].sum(0) + c.value[s, a]))


def assignment_value(c: PairCrosses, perm: torch.Tensor, values) -> float:
    """The objective of a whole head permutation (new head h = old head perm[h]), summed over KV groups."""
    g = c.group
    return sum(_pair_value(c, int(perm[a * g]) // g, a, perm[a * g:(a + 1) * g] % g, values).item()
               for a in range(perm.shape[0] // g))


def rotation_values(att: AttentionLayout):
    """The (Q/K value, V/O value) functions of rotation matching: max <R, M> over each side's group."""
    return _values(att, "rotation")


def head_scores(c: PairCrosses, values) -> torch.Tensor:
    """Multi-head attention: the objective of every (source head, anchor head) pair, (H_source, H_anchor)."""
    qk_value, vo_value = values
    return qk_value(c.query[:, :, 0, 0] + c.key) + vo_value(c.value + c.output[:, :, 0, 0])


def assign_heads(c: PairCrosses, values) -> torch.Tensor:
    """The head permutation maximising the objective given by `values` (exact for MHA; see the module docstring)."""
    qk_value, vo_value = values
    kv, group = c.key.shape[0], c.group
    if group == 1:
        return max_assignment(head_scores(c, values).T.contiguous().numpy())
    upper = qk_value(c.query) + vo_value(c.output)                                  # (kv_s, kv_a, g_s, g_a)
    scores = torch.empty(kv, kv, dtype=torch.float64)
    orders = {}
    identity = torch.arange(group)
    for s in range(kv):
        for a in range(kv):
            candidates = [identity, max_assignment(upper[s, a].T.contiguous().numpy())]   # anchor t <- source
            exact = [_pair_value(c, s, a, order, values) for order in candidates]
            best = int(torch.stack(exact).argmax())
            scores[s, a], orders[s, a] = exact[best], candidates[best]
    kv_perm = max_assignment(scores.T.contiguous().numpy())                         # anchor group a <- source group
    return torch.cat([kv_perm[a] * group + orders[int(kv_perm[a]), a] for a in range(kv)])


def match_heads(source: Mapping, anchor: Mapping, att: AttentionLayout, heads: int,
                kind: str = "rotation") -> torch.Tensor | None:
    """The query-head permutation (new head h = old head perm[h]) moving the source's heads onto the anchor's,
    whole KV groups at a time, for rotation or permutation (git_rebasin) matching; None for the identity.

    Permutation matching assigns on its own group's values. Rotation matching with grouped-query attention also
    tries that assignment and keeps the one with the larger rotation objective, so it is never farther than
    git_rebasin; with multi-head attention its own assignment is the exact optimum, which no other can beat."""
    c = pair_crosses(source, anchor, att, heads)
    if kind == "rotation" and att.group == 1:
        perm = assign_heads(c, _values(att, "rotation"))       # the exact optimum: never below git_rebasin's
    else:
        permutation = assign_heads(c, _values(att, "permutation"))
        perm = permutation
    if kind == "rotation" and att.group > 1:
        rotation, values = assign_heads(c, _values(att, "rotation")), _values(att, "rotation")
        if assignment_value(c, rotation, values) >= assignment_value(c, permutation, values):
            perm = rotation
    if torch.equal(perm, torch.arange(heads)):
        return None
    return perm
