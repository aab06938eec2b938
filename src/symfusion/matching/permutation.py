"""Permutation matching: FFN neurons by the linear assignment of paper eq. (7) (Hungarian).

For an FFN with input map (W_i, b_i) and output map W_o, the permutation maximising
<P, W_i1 W_i2^T + b_i1^T b_i2 + W_o1^T W_o2> is found with scipy's linear_sum_assignment.
Exact shortcut: when the row-wise argmax of the cross matrix is already a permutation it
is optimal (the sum of row maxima bounds every assignment), so the solver is skipped.
From LAPJV_MIN_SIZE neurons on (7B decoders' FFNs: 11008, 14336) the assignment goes to
lap's Jonker-Volgenant solver, which found the same optimum as scipy's 1.6x faster on
unrelated 11008-neuron FFNs (34.5 s vs 54.7 s on the shared 2-core machine; 7.5x faster
on fine-tune-like pairs); smaller problems (the paper's encoders) keep scipy's solver.
The same solver matches a head's coordinates for the permutation-only baseline.
"""
from __future__ import annotations

from typing import Mapping

import lap
import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from symfusion.arch import FFNLayout


LAPJV_MIN_SIZE = 4096


def weight_f32(state: Mapping, key: str) -> np.ndarray:
    """One tensor of a state dict as a float32 numpy array (no copy when it already is one on the CPU)."""
    return state[key].detach().cpu().to(torch.float32).numpy()


def ffn_cross(source: Mapping, anchor: Mapping, ffn: FFNLayout) -> np.ndarray:
    """C[j, k] = <anchor neuron j, source neuron k> over W_i, b_i and W_o, (ffn, ffn) float32.

    C = W_i1 W_i2^T + b_i1^T b_i2 + W_o1^T W_o2 (+ W_g1 W_g2^T + b_g1^T b_g2 for a gated FFN). The products are most of the matching
    time (29 GFLOP per roberta-base layer). They go through numpy's BLAS (OpenBLAS in the
    numpy wheels), about 25% faster than torch's MKL for this shape on the AMD CPUs we
    measured, with the transposes passed to BLAS rather than copied
    (benchmarks/bench_matching.py).
    """
    cross = weight_f32(anchor, ffn.input.weight) @ weight_f32(source, ffn.input.weight).T     # (ffn, ffn)
    cross += weight_f32(anchor, ffn.output.weight).T @ weight_f32(source, ffn.output.weight)  # (ffn, ffn)
    if ffn.input.bias is not None:
        cross += np.outer(weight_f32(anchor, ffn.input.bias), weight_f32(source, ffn.input.bias))
    if ffn.gate is not None:
        cross += weight_f32(anchor, ffn.gate.weight) @ weight_f32(source, ffn.gate.weight).T
        if ffn.gate.bias is not None:
            cross += np.outer(weight_f32(anchor, ffn.gate.bias), weight_f32(source, ffn.gate.bias))
    return cross


def max_assignment(cross: torch.Tensor | np.ndarray) -> torch.Tensor:
    """perm maximising sum_j cross[j, perm[j]]; a long tensor (n,)."""
    cross = cross.numpy() if isinstance(cross, torch.Tensor) else cross
    greedy = cross.argmax(axis=1)
    if np.unique(greedy).size == greedy.size:
        return torch.from_numpy(greedy.astype(np.int64))
    if cross.shape[0] >= LAPJV_MIN_SIZE and cross.shape[0] == cross.shape[1]:
        _, cols, _ = lap.lapjv(-cross.astype(np.float64), extend_cost=False)   # minimises: negate
        return torch.from_numpy(cols.astype(np.int64))
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
