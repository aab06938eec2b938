"""Rotation matching of attention heads: per-head orthogonal Procrustes (paper Algorithm 1).

For each head the source is moved by an orthogonal R (det +1 or -1: the symmetry holds
for every orthogonal matrix, and allowing reflections can only bring the models closer,
so we do not restrict to det = +1). The R maximising <R, M> for the cross-product matrix
M = sum_maps W_1^h (W_2^h)^T + (b_1^h)^T b_2^h is U V^T with M = U S V^T (Kabsch).
All heads of a layer are solved in one batched SVD, split over a small thread pool (the
heads are independent; LAPACK's small SVDs are single-threaded and release the GIL).
Cross products are formed in the weights' precision (at least float32) and decomposed
in float64.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Mapping

import torch

from symfusion.arch import AttentionLayout, Projection


def compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """float32 for half/bfloat16/float32 weights, float64 for float64 weights."""
    return torch.promote_types(tensor.dtype, torch.float32)


def head_blocks(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """(H*d, n) row-blocked weight -> (H, d, n)."""
    return weight.reshape(heads, -1, weight.shape[-1]).to(compute_dtype(weight))


def projection_cross(source: Mapping, anchor: Mapping, proj: Projection, heads: int) -> torch.Tensor:
    """sum W_1^h (W_2^h)^T + (b_1^h)^T b_2^h for one row-blocked projection, (H, d, d)."""
    w1, w2 = head_blocks(source[proj.weight], heads), head_blocks(anchor[proj.weight], heads)
    cross = w1 @ w2.transpose(1, 2)
    if proj.bias is not None:
        b1 = source[proj.bias].reshape(heads, -1, 1).to(cross.dtype)   # (H, d, 1)
        b2 = anchor[proj.bias].reshape(heads, 1, -1).to(cross.dtype)   # (H, 1, d)
        cross = cross + b1 @ b2
    return cross


def output_cross(source: Mapping, anchor: Mapping, proj: Projection, heads: int) -> torch.Tensor:
    """(W_O1^h)^T W_O2^h for the column-blocked output projection, (H, d, d)."""
    def blocks(weight: torch.Tensor) -> torch.Tensor:
        return weight.reshape(weight.shape[0], heads, -1).permute(1, 2, 0).to(compute_dtype(weight))  # (H, d, n)
    return blocks(source[proj.weight]) @ blocks(anchor[proj.weight]).transpose(1, 2)


def qk_cross_parts(source: Mapping, anchor: Mapping, att: AttentionLayout, heads: int):
    """Cross products of the query-like and of the key-like maps, each (H, d, d)."""
    query = sum(projection_cross(source, anchor, p, heads) for p in att.query_like)
    key = sum(projection_cross(source, anchor, p, heads) for p in att.key_like)
    return query, key


def vo_cross_parts(source: Mapping, anchor: Mapping, att: AttentionLayout, heads: int):
    """Cross products of the value map and of the output map, each (H, d, d)."""
    return projection_cross(source, anchor, att.value, heads), output_cross(source, anchor, att.output, heads)


# A polar factor from the Gram matrix is accepted when it is orthogonal to this tolerance;
# otherwise (ill-conditioned or singular cross products) that head falls back to the SVD.
ORTHOGONALITY_TOL = 1e-9


def polar_factor_svd(cross: torch.Tensor) -> torch.Tensor:
    """U V^T of cross = U S V^T, batched: (H, d, d) -> (H, d, d) float64."""
    u, _, vh = torch.linalg.svd(cross.to(torch.float64))
    return u @ vh


def polar_factor(cross: torch.Tensor) -> torch.Tensor:
    """The orthogonal polar factor M (M^T M)^(-1/2) = U V^T, batched, float64.

    A symmetric eigendecomposition of M^T M is about twice as fast as an SVD for small
    heads; it squares the condition number, so any head whose result is not orthogonal
    to ORTHOGONALITY_TOL is recomputed with the SVD.
    """
    m = cross.to(torch.float64)
    evals, evecs = torch.linalg.eigh(m.transpose(1, 2) @ m)                     # (H, d), (H, d, d)
    inv_sqrt = evals.clamp_min(torch.finfo(torch.float64).tiny).rsqrt()
    r = m @ (evecs * inv_sqrt[:, None, :]) @ evecs.transpose(1, 2)
    eye = torch.eye(m.shape[-1], dtype=m.dtype)
    bad = ((r.transpose(1, 2) @ r - eye).abs().amax(dim=(1, 2)) > ORTHOGONALITY_TOL) | ~torch.isfinite(r).all(dim=(1, 2))
    if bad.any():
        r[bad] = polar_factor_svd(m[bad])
    return r


@lru_cache(maxsize=1)
def _svd_pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="symfusion-svd")


def procrustes(cross: torch.Tensor) -> torch.Tensor:
    """argmax over orthogonal R of <R, cross>, batched: (H, d, d) -> (H, d, d) float64."""
    workers = min(torch.get_num_threads(), cross.shape[0])
    if workers <= 1:
        return polar_factor(cross)
    return torch.cat(list(_svd_pool(workers).map(polar_factor, cross.chunk(workers))))


def frobenius_inner(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-head <a, b>_F for (H, d, d) stacks -> (H,) float64."""
    return (a.to(torch.float64) * b.to(torch.float64)).sum(dim=(1, 2))
