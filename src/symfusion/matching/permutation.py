"""Permutation matching: FFN neurons by the linear assignment of paper eq. (7) (Hungarian).

For an FFN with input map (W_i, b_i) and output map W_o, the permutation maximising
<P, W_i1 W_i2^T + b_i1^T b_i2 + W_o1^T W_o2> is found with scipy's linear_sum_assignment.
Exact shortcut: when the row-wise argmax of the cross matrix is already a permutation it
is optimal (the sum of row maxima bounds every assignment), so the solver is skipped.
The same solver matches a head's coordinates for the permutation-only baseline.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from symfusion.arch import FFNLayout


def neuron_features(state: Mapping, ffn: FFNLayout) -> torch.Tensor:
    """Per-neuron feature rows [W_i | b_i | W_o^T], (ffn, 2*hidden + 1), float32."""
    parts = [state[ffn.input.weight]]
    if ffn.input.bias is not None:
        parts.append(state[ffn.input.bias][:, None])
    parts.append(state[ffn.output.weight].T)
    return torch.cat([p.float() for p in parts], dim=1)


def ffn_cross(source: Mapping, anchor: Mapping, ffn: FFNLayout) -> np.ndarray:
    """C[j, k] = <anchor neuron j, source neuron k> over W_i, b_i and W_o, (ffn, ffn) float32.

    This product is most of the matching time (29 GFLOP per roberta-base layer). It goes
    through numpy's BLAS (OpenBLAS in the numpy wheels), which on the AMD CPUs we measured
    is about 25% faster than torch's MKL for this shape (benchmarks/bench_matching.py).
    """
    anchor_features = neuron_features(anchor, ffn).cpu().numpy()   # (ffn, 2*hidden + 1)
    source_features = neuron_features(source, ffn).cpu().numpy()   # (ffn, 2*hidden + 1)
    return anchor_features @ source_features.T


def max_assignment(cross: torch.Tensor | np.ndarray) -> torch.Tensor:
    """perm maximising sum_j cross[j, perm[j]]; a long tensor (n,)."""
    cross = cross.numpy() if isinstance(cross, torch.Tensor) else cross
    greedy = cross.argmax(axis=1)
    if np.unique(greedy).size == greedy.size:
        return torch.from_numpy(greedy.astype(np.int64))
    _, cols = linear_sum_assignment(cross, maximize=True)
    return torch.from_numpy(cols.astype(np.int64))


def match_ffn_permutation(source: Mapping, anchor: Mapping, ffn: FFNLayout) -> torch.Tensor:
    """The FFN permutation moving the source onto the anchor (new neuron j = old perm[j])."""
    return max_assignment(ffn_cross(source, anchor, ffn))


def permutation_matrix(perm: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """P with W^T-side action W -> P^T W equal to W[perm]: P[perm[j], j] = 1, (n, n)."""
    n = perm.shape[0]
    matrix = torch.zeros(n, n, dtype=dtype)
    matrix[perm, torch.arange(n)] = 1.0
    return matrix
