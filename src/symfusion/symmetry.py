"""The group actions: rotate, rescale and permute one layer's tensors; transforms as data.

Conventions (torch's nn.Linear, y = x W^T + b, heads are contiguous blocks of rows):
for head h with an orthogonal R (d x d) and a scale a != 0 (paper eq. 4, 5 and 11)
    W_Q^h -> a R^T W_Q^h,   b_Q^h -> a b_Q^h R        (query-like maps)
    W_K^h -> R^T W_K^h / a, b_K^h -> b_K^h R / a      (key-like maps)
    W_V^h -> a R^T W_V^h,   b_V^h -> a b_V^h R
    W_O^h -> W_O^h R / a                              (columns of head h; b_O unchanged)
and for the FFN with a permutation given as an index vector perm (new neuron j = old perm[j])
    W_i -> W_i[perm], b_i -> b_i[perm], W_o -> W_o[:, perm]      (b_o unchanged)
Each of these leaves the model's function unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import torch
from safetensors.torch import load_file, save_file

from symfusion.arch import AttentionLayout, FFNLayout, ModelLayout, Projection
from symfusion.errors import SymfusionError


@dataclass
class LayerTransform:
    """One layer's symmetry element; None means identity for that part."""

    r_qk: torch.Tensor | None = None      # (heads, d, d) orthogonal
    a_qk: torch.Tensor | None = None      # (heads,) nonzero
    r_vo: torch.Tensor | None = None      # (heads, d, d) orthogonal
    a_vo: torch.Tensor | None = None      # (heads,) nonzero
    ffn_perm: torch.Tensor | None = None  # (ffn,) long, a permutation

    def is_identity(self) -> bool:
        return all(v is None for v in (self.r_qk, self.a_qk, self.r_vo, self.a_vo, self.ffn_perm))


@dataclass
class Transform:
    """A whole-model symmetry element: one LayerTransform per transformed layer index."""

    layers: dict[int, LayerTransform] = field(default_factory=dict)

    def restrict(self, indices) -> "Transform":
        keep = set(int(i) for i in indices)
        return Transform({i: t for i, t in self.layers.items() if i in keep})

    def save(self, path: str | Path) -> None:
        tensors = {}
        for i, layer in self.layers.items():
            for name in ("r_qk", "a_qk", "r_vo", "a_vo", "ffn_perm"):
                value = getattr(layer, name)
                if value is not None:
                    tensors[f"layer.{i}.{name}"] = value.contiguous()
        save_file(tensors, str(path), metadata={"format": "symfusion-transform-v1"})

    @staticmethod
    def load(path: str | Path) -> "Transform":
        tensors = load_file(str(path))
        layers: dict[int, LayerTransform] = {}
        for key, value in tensors.items():
            _, index, name = key.split(".")
            setattr(layers.setdefault(int(index), LayerTransform()), name, value)
        return Transform(layers)


# ---------------------------------------------------------------- per-head primitives

def rotate_rows(weight: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """W^h -> R^T W^h for each head's block of rows. weight (H*d, n), r (H, d, d)."""
    heads, d, _ = r.shape
    blocks = weight.reshape(heads, d, -1)                       # (H, d, n)
    return (r.transpose(1, 2).to(weight.dtype) @ blocks).reshape(weight.shape)


def rotate_bias(bias: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """b^h -> b^h R for each head. bias (H*d,), r (H, d, d)."""
    heads, d, _ = r.shape
    blocks = bias.reshape(heads, 1, d)                          # (H, 1, d)
    return (blocks @ r.to(bias.dtype)).reshape(bias.shape)


def rotate_columns(weight: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """W_O^h -> W_O^h R for each head's block of columns. weight (n, H*d), r (H, d, d)."""
    heads, d, _ = r.shape
    blocks = weight.reshape(weight.shape[0], heads, d).transpose(0, 1)  # (H, n, d)
    return (blocks @ r.to(weight.dtype)).transpose(0, 1).reshape(weight.shape)


def scale_rows(weight: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Multiply head h's rows (or bias entries) by a[h]. weight (H*d, ...) , a (H,)."""
    heads = a.shape[0]
    blocks = weight.reshape(heads, -1)                          # (H, d*n)
    return (blocks * a.to(weight.dtype)[:, None]).reshape(weight.shape)


def scale_columns(weight: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Multiply head h's columns by a[h]. weight (n, H*d), a (H,)."""
    heads = a.shape[0]
    blocks = weight.reshape(weight.shape[0], heads, -1)         # (n, H, d)
    return (blocks * a.to(weight.dtype)[None, :, None]).reshape(weight.shape)


# ---------------------------------------------------------------- applying a transform

def _move_projection(out: dict, proj: Projection, r: torch.Tensor | None, a: torch.Tensor | None) -> None:
    """Rotate then scale a head-blocked projection (weight rows and bias) in `out`."""
    for key, is_bias in ((proj.weight, False), (proj.bias, True)):
        if key is None:
            continue
        tensor = out[key]
        if r is not None:
            tensor = rotate_bias(tensor, r) if is_bias else rotate_rows(tensor, r)
        if a is not None:
            tensor = scale_rows(tensor, a)
        out[key] = tensor


def _apply_attention(out: dict, att: AttentionLayout, t: LayerTransform) -> None:
    inv_qk = None if t.a_qk is None else 1.0 / t.a_qk
    inv_vo = None if t.a_vo is None else 1.0 / t.a_vo
    for proj in att.query_like:
        _move_projection(out, proj, t.r_qk, t.a_qk)
    for proj in att.key_like:
        _move_projection(out, proj, t.r_qk, inv_qk)
    _move_projection(out, att.value, t.r_vo, t.a_vo)
    weight = out[att.output.weight]
    if t.r_vo is not None:
        weight = rotate_columns(weight, t.r_vo)
    if inv_vo is not None:
        weight = scale_columns(weight, inv_vo)
    out[att.output.weight] = weight


def _apply_ffn(out: dict, ffn: FFNLayout, perm: torch.Tensor) -> None:
    out[ffn.input.weight] = out[ffn.input.weight][perm]
    if ffn.input.bias is not None:
        out[ffn.input.bias] = out[ffn.input.bias][perm]
    out[ffn.output.weight] = out[ffn.output.weight].index_select(1, perm)


def apply_transform(
    state: Mapping[str, torch.Tensor], layout: ModelLayout, transform: Transform
) -> dict[str, torch.Tensor]:
    """A new state dict with the transform applied; untouched tensors are shared, not copied."""
    out = dict(state)
    for i, t in transform.layers.items():
        if not 0 <= i < layout.num_layers:
            raise SymfusionError(f"transform names layer {i}, but the model has {layout.num_layers} layers")
        layer = layout.layers[i]
        _apply_attention(out, layer.attention, t)
        if t.ffn_perm is not None:
            _apply_ffn(out, layer.ffn, t.ffn_perm)
    return out


# ---------------------------------------------------------------- random group elements

def random_orthogonal(heads: int, d: int, generator: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    """Haar-random orthogonal matrices (det +1 or -1), (heads, d, d)."""
    gaussian = torch.randn(heads, d, d, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    signs = torch.sign(torch.diagonal(r, dim1=1, dim2=2))       # (heads, d): makes Q Haar-distributed
    return (q * signs[:, None, :]).to(dtype)


def random_transform(
    layout: ModelLayout,
    seed: int = 0,
    rotation: bool = True,
    scales: bool = True,
    permutation: bool = True,
    scale_range: tuple[float, float] = (0.5, 2.0),
) -> Transform:
    """A random symmetry element of the whole model (for tests, benchmarks and planted problems)."""
    gen = torch.Generator().manual_seed(seed)
    h, d = layout.num_heads, layout.head_dim
    lo, hi = scale_range

    def scale() -> torch.Tensor:
        return (lo + (hi - lo) * torch.rand(h, generator=gen, dtype=torch.float64))

    layers = {}
    for i in range(layout.num_layers):
        layers[i] = LayerTransform(
            r_qk=random_orthogonal(h, d, gen) if rotation else None,
            a_qk=scale() if scales else None,
            r_vo=random_orthogonal(h, d, gen) if rotation else None,
            a_vo=scale() if scales else None,
            ffn_perm=torch.randperm(layout.ffn_size, generator=gen) if permutation else None,
        )
    return Transform(layers)
