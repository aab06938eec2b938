"""Rotation matching of attention heads: per-head orthogonal Procrustes (paper Algorithm 1).

For each head the source is moved by an orthogonal R (det +1 or -1: the symmetry holds
for every orthogonal matrix, and allowing reflections can only bring the models closer,
so we do not restrict to det = +1). The R maximising <R, M> for the cross-product matrix
M = sum_maps W_1^h (W_2^h)^T + (b_1^h)^T b_2^h is U V^T with M = U S V^T (Kabsch).
All heads of a layer are solved in one batched SVD, split over a small thread pool (the
heads are independent; LAPACK's small SVDs are single-threaded and release the GIL).
Cross products are formed in the weights' precision (at least float32) and decomposed
in float64.

Decoders (arch.AttentionLayout): with grouped-query attention the cross product of a KV head
sums over its `group` query heads (one product per KV head: the group's rows side by side).
Under RoPE the Q/K maps may only move by one 2x2 rotation per frequency plane (i, i + r/2),
r = rotary_dim (Hugging Face's rotate_half pairing); restricted to that group the Procrustes
problem max <R, M> has a closed form per plane: with R = [[cos t, -sin t], [sin t, cos t]] on
dims (i, j = i + r/2), <R, M> = cos t (M_ii + M_jj) + sin t (M_ji - M_ij), largest at
t = atan2(M_ji - M_ij, M_ii + M_jj) with value hypot(M_ii + M_jj, M_ji - M_ij). The dims
past r keep the full orthogonal group (partial rotary).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Mapping

import torch

from symfusion.arch import AttentionLayout, Projection
from symfusion.symmetry import plane_rotations


def compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """float32 for half/bfloat16/float32 weights, float64 for float64 weights."""
    return torch.promote_types(tensor.dtype, torch.float32)


def head_blocks(weight: torch.Tensor, heads: int, group: int = 1) -> torch.Tensor:
    """(H*d, n) row-blocked weight -> (H, d, n); with group > 1 the H / group KV groups' rows side by side:
    (H/group, d, group*n), so that one product sums over a group's query heads."""
    if group == 1:
        return weight.reshape(heads, -1, weight.shape[-1]).to(compute_dtype(weight))
    n = weight.shape[-1]
    blocks = weight.reshape(heads // group, group, -1, n).transpose(1, 2)     # (kv, d, group, n)
    return blocks.reshape(heads // group, -1, group * n).to(compute_dtype(weight))


def projection_cross(source: Mapping, anchor: Mapping, proj: Projection, heads: int, group: int = 1) -> torch.Tensor:
    """sum W_1^h (W_2^h)^T + (b_1^h)^T b_2^h for one row-blocked projection, (H, d, d); with group > 1 summed over
    each KV group's query heads, (H/group, d, d)."""
    w1, w2 = head_blocks(source[proj.weight], heads, group), head_blocks(anchor[proj.weight], heads, group)
    cross = w1 @ w2.transpose(1, 2)
    if proj.bias is not None:
        kv = heads // group
        b1 = source[proj.bias].reshape(kv, group, -1).transpose(1, 2).to(cross.dtype)   # (kv, d, group)
        b2 = anchor[proj.bias].reshape(kv, group, -1).to(cross.dtype)                   # (kv, group, d)
        cross = cross + b1 @ b2
    return cross


def output_blocks(weight: torch.Tensor, heads: int, group: int = 1) -> torch.Tensor:
    """(n, H*d) column-blocked weight -> (H/group, d, group*n): each KV group's query heads' columns, transposed."""
    n = weight.shape[0]
    if group == 1:
        return weight.reshape(n, heads, -1).permute(1, 2, 0).to(compute_dtype(weight))   # (H, d, n)
    blocks = weight.reshape(n, heads // group, group, -1).permute(1, 3, 2, 0)            # (kv, d, group, n)
    return blocks.reshape(heads // group, -1, group * n).to(compute_dtype(weight))


def output_cross(source: Mapping, anchor: Mapping, proj: Projection, heads: int, group: int = 1) -> torch.Tensor:
    """(W_O1^h)^T W_O2^h for the column-blocked output projection, (H, d, d) (summed per KV group with group > 1)."""
    return output_blocks(source[proj.weight], heads, group) @ output_blocks(anchor[proj.weight], heads, group).transpose(1, 2)


def qk_cross_parts(source: Mapping, anchor: Mapping, att: AttentionLayout, heads: int):
    """Cross products of the query-like and of the key-like maps, each (kv_heads, d, d) (kv_heads = H without GQA)."""
    query = sum(projection_cross(source, anchor, p, heads, att.group) for p in att.query_like)
    key = sum(projection_cross(source, anchor, p, heads // att.group) for p in att.key_like)
    return query, key


def vo_cross_parts(source: Mapping, anchor: Mapping, att: AttentionLayout, heads: int):
    """Cross products of the value map and of the output map, each (kv_heads, d, d)."""
    kv = heads // att.group
    return projection_cross(source, anchor, att.value, kv), output_cross(source, anchor, att.output, heads, att.group)


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
    # a NaN error counts as too large (a result near float64's largest gives inf - inf in r^T r)
    bad = ~((r.transpose(1, 2) @ r - eye).abs().amax(dim=(1, 2)) <= ORTHOGONALITY_TOL)
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


def rope_planes(cross: torch.Tensor, rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per RoPE plane (i, i + r/2) of a (..., d, d) cross product: (M_ii + M_jj, M_ji - M_ij), each (..., r/2)."""
    half = rotary_dim // 2
    i = torch.arange(half)
    m = cross.to(torch.float64)
    cos_part = m[..., i, i] + m[..., i + half, i + half]
    sin_part = m[..., i + half, i] - m[..., i, i + half]
    return cos_part, sin_part


def rope_procrustes(cross: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """argmax <R, cross> over R = one 2x2 rotation per RoPE plane on the first rotary_dim dims, any orthogonal
    matrix on the rest: (H, d, d) -> (H, d, d) float64. The closed form per plane is in the module docstring."""
    cos_part, sin_part = rope_planes(cross, rotary_dim)
    r = plane_rotations(torch.atan2(sin_part, cos_part), rotary_dim, cross.shape[-1])
    if rotary_dim < cross.shape[-1]:
        r[:, rotary_dim:, rotary_dim:] = procrustes(cross[:, rotary_dim:, rotary_dim:])
    return r


def qk_procrustes(cross: torch.Tensor, att: AttentionLayout) -> torch.Tensor:
    """The Q/K Procrustes solution in the layout's Q/K group (orthogonal, or RoPE planes), (kv, d, d) float64."""
    if att.qk_group == "rope":
        return rope_procrustes(cross, att.rotary_dim)
    return procrustes(cross)


def _svd_sum(cross: torch.Tensor) -> torch.Tensor:
    return torch.linalg.svdvals(cross).sum(dim=-1)


def nuclear_norm(cross: torch.Tensor) -> torch.Tensor:
    """max over orthogonal R of <R, M> (the sum of singular values), batched over leading dims, float64.

    Split over the small thread pool as procrustes is: one batched call over 1024 heads' 128 x 128 blocks
    (a 7B layer's head pairs) was up to 10x slower on the shared 2-core machine."""
    flat = cross.to(torch.float64).reshape(-1, *cross.shape[-2:])               # (pairs, d, d)
    workers = min(torch.get_num_threads(), flat.shape[0])
    if workers <= 1:
        return _svd_sum(flat).reshape(cross.shape[:-2])
    return torch.cat(list(_svd_pool(workers).map(_svd_sum, flat.chunk(workers)))).reshape(cross.shape[:-2])


def group_value(cross: torch.Tensor, qk_group: str, rotary_dim: int = 0) -> torch.Tensor:
    """max <R, cross> over the group R ranges in (orthogonal, rope planes, or only the identity), over leading dims."""
    if qk_group == "none":
        return torch.diagonal(cross.to(torch.float64), dim1=-2, dim2=-1).sum(dim=-1)
    if qk_group == "orthogonal":
        return nuclear_norm(cross)
    cos_part, sin_part = rope_planes(cross, rotary_dim)
    value = torch.hypot(cos_part, sin_part).sum(dim=-1)
    if rotary_dim < cross.shape[-1]:
        value = value + nuclear_norm(cross[..., rotary_dim:, rotary_dim:])
    return value


def frobenius_inner(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-head <a, b>_F for (H, d, d) stacks -> (H,) float64."""
    return (a.to(torch.float64) * b.to(torch.float64)).sum(dim=(1, 2))
