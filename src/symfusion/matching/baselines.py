"""Matching baselines of the paper's Figure 4: Git Re-Basin permutations and OT-Fusion FFN alignment.

- git_rebasin (Ainsworth et al. 2023, weight matching): the same objectives as ours, but
  restricted to permutations: each head's QK and VO coordinates and each FFN's neurons are
  permuted by a linear assignment. With the residual stream left in place the layers do not
  couple, so one assignment per block is already the coordinate-descent fixed point.
  Under RoPE no permutation of a head's rotary q/k dims keeps the logits (it would mix
  frequency planes or reflect one), so only the non-rotary dims are permuted there; with
  per-head q/k norms none are. Whole heads (KV groups, query heads within a group) are
  permuted by matching/heads.py before, as for rotation matching.
- ot_ffn (Imfeld et al. 2024 style, FFN only): FFN neurons aligned by exact optimal
  transport (POT's EMD, uniform marginals) on squared Euclidean distances between the
  neurons' incoming weights [W_i | b_i]. With equal widths and uniform marginals the EMD
  plan is a permutation; we read it off with an assignment on the plan.
Both return the same kind of per-layer pieces as rotation matching.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from symfusion.arch import AttentionLayout, FFNLayout
from symfusion.matching.permutation import max_assignment, permutation_matrix
from symfusion.matching.rotation import qk_cross_parts, vo_cross_parts


def head_permutations(cross: torch.Tensor) -> torch.Tensor:
    """Per head, the permutation matrix P maximising <P, cross[h]>, as (H, d, d) float64."""
    # <P, M> = sum_j M[perm[j], j] with P[perm[j], j] = 1, so assign on M^T
    return torch.stack([permutation_matrix(max_assignment(m.T.contiguous())) for m in cross])


def qk_permutations(cross: torch.Tensor, att: AttentionLayout) -> torch.Tensor | None:
    """Per KV head, the best permutation of the q/k coordinates that keep the logits (none under RoPE's rotary
    dims or per-head norms), (kv, d, d) float64; None when only the identity is allowed."""
    if att.qk_group == "orthogonal":
        return head_permutations(cross)
    d = cross.shape[-1]
    if att.qk_group == "none" or att.rotary_dim == d:
        return None
    r = torch.eye(d, dtype=torch.float64).repeat(cross.shape[0], 1, 1)
    r[:, att.rotary_dim:, att.rotary_dim:] = head_permutations(cross[:, att.rotary_dim:, att.rotary_dim:])
    return r


def match_attention_permutation(source: Mapping, anchor: Mapping, att: AttentionLayout, heads: int):
    """Git Re-Basin for one attention layer: (P_qk or None, P_vo), each (kv_heads, d, d)."""
    query, key = qk_cross_parts(source, anchor, att, heads)
    value, output = vo_cross_parts(source, anchor, att, heads)
    return qk_permutations(query + key, att), head_permutations(value + output)


def incoming_weights(state: Mapping, ffn: FFNLayout) -> np.ndarray:
    """Rows [W_i | b_i] (and the gate's [W_g | b_g]) per FFN neuron, (ffn, hidden + 1) float64."""
    parts = []
    for proj in (ffn.input, ffn.gate) if ffn.gate is not None else (ffn.input,):
        parts.append(state[proj.weight].double())
        if proj.bias is not None:
            parts.append(state[proj.bias].double()[:, None])
    weight = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
    return weight.numpy()


def match_ffn_ot(source: Mapping, anchor: Mapping, ffn: FFNLayout) -> torch.Tensor:
    """The FFN permutation from an exact OT plan between anchor and source neurons."""
    import ot  # POT imports scikit-learn: only pay for it when this baseline runs

    anchor_rows, source_rows = incoming_weights(anchor, ffn), incoming_weights(source, ffn)
    cost = ot.dist(anchor_rows, source_rows, metric="sqeuclidean")      # (ffn_anchor, ffn_source)
    n = cost.shape[0]
    marginal = np.full(n, 1.0 / n)
    plan = ot.emd(marginal, marginal, cost / cost.max())
    return max_assignment(plan)
