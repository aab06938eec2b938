"""Matching baselines of the paper's Figure 4: Git Re-Basin permutations and OT-Fusion FFN alignment.

- git_rebasin (Ainsworth et al. 2023, weight matching): the same objectives as ours, but
  restricted to permutations: each head's QK and VO coordinates and each FFN's neurons are
  permuted by a linear assignment. With the residual stream left in place the layers do not
  couple, so one assignment per block is already the coordinate-descent fixed point.
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


def match_attention_permutation(source: Mapping, anchor: Mapping, att: AttentionLayout, heads: int):
    """Git Re-Basin for one attention layer: (P_qk, P_vo), each (H, d, d)."""
    query, key = qk_cross_parts(source, anchor, att, heads)
    value, output = vo_cross_parts(source, anchor, att, heads)
    return head_permutations(query + key), head_permutations(value + output)


def incoming_weights(state: Mapping, ffn: FFNLayout) -> np.ndarray:
    """Rows [W_i | b_i] per FFN neuron, (ffn, hidden + 1) float64."""
    weight = state[ffn.input.weight].double()
    if ffn.input.bias is not None:
        weight = torch.cat([weight, state[ffn.input.bias].double()[:, None]], dim=1)
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
