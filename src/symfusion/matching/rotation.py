"""Rotation matching of attention heads: per-head orthogonal Procrustes (paper Algorithm 1).

For each head the source is moved by an orthogonal R (det +1 or -1: the symmetry holds
for every orthogonal matrix, and allowing reflections can only bring the models closer,
so we do not restrict to det = +1). The R maximising <R, M> for the cross-product matrix
M = sum_maps W_1^h (W_2^h)^T + (b_1^h)^T b_2^h is U V^T with M = U S V^T (Kabsch).
All heads of a layer are solved in one batched SVD.
"""
from __future__ import annotations

from typing import Mapping

import torch

from symfusion.arch import AttentionLayout, Projection

# Cross products are accumulated and decomposed in float64; R is cast back when applied.
CROSS_DTYPE = torch.float64


def head_blocks(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """(H*d, n) row-blocked weight -> (H, d, n)."""
    return weight.reshape(heads, -1, weight.shape[-1]).to(CROSS_DTYPE)


def projection_cross(source: Mapping, anchor: Mapping, proj: Projection, heads: int) -> torch.Tensor:
    """sum W_1^h (W_2^h)^T + (b_1^h)^T b_2^h for one row-blocked projection, (H, d, d)."""
    w1, w2 = head_blocks(source[proj.weight], heads), head_blocks(anchor[proj.weight], heads)
    cross = w1 @ w2.transpose(1, 2)
    if proj.bias is not None:
        b1 = source[proj.bias].reshape(heads, -1, 1).to(CROSS_DTYPE)   # (H, d, 1)
        b2 = anchor[proj.bias].reshape(heads, 1, -1).to(CROSS_DTYPE)   # (H, 1, d)
        cross = cross + b1 @ b2
    return cross


def output_cross(source: Mapping, anchor: Mapping, proj: Projection, heads: int) -> torch.Tensor:
    """(W_O1^h)^T W_O2^h for the column-blocked output projection, (H, d, d)."""
    def blocks(weight: torch.Tensor) -> torch.Tensor:
        return weight.reshape(weight.shape[0], heads, -1).permute(1, 2, 0).to(CROSS_DTYPE)  # (H, d, n)
    return blocks(source[proj.weight]) @ blocks(anchor[proj.weight]).transpose(1, 2)


def qk_cross_parts(source: Mapping, anchor: Mapping, att: AttentionLayout, heads: int):
    """Cross products of the query-like and of the key-like maps, each (H, d, d)."""
    query = sum(projection_cross(source, anchor, p, heads) for p in att.query_like)
    key = sum(projection_cross(source, anchor, p, heads) for p in att.key_like)
    return query, key


def vo_cross_parts(source: Mapping, anchor: Mapping, att: AttentionLayout, heads: int):
    """Cross products of the value map and of the output map, each (H, d, d)."""
    return projection_cross(source, anchor, att.value, heads), output_cross(source, anchor, att.output, heads)


def procrustes(cross: torch.Tensor) -> torch.Tensor:
    """argmax over orthogonal R of <R, cross>, batched: (H, d, d) -> (H, d, d)."""
    u, _, vh = torch.linalg.svd(cross)
    return u @ vh


def frobenius_inner(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-head <a, b>_F for (H, d, d) stacks -> (H,)."""
    return (a * b).sum(dim=(1, 2))
