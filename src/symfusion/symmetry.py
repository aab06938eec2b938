"""The group actions: rotate, rescale and permute one layer's tensors; transforms as data.

Conventions (torch's nn.Linear, y = x W^T + b, heads are contiguous blocks of rows):
for head h with an orthogonal R (d x d) and a scale a != 0 (paper eq. 4, 5 and 11)
    W_Q^h -> a R^T W_Q^h,   b_Q^h -> a b_Q^h R        (query-like maps)
    W_K^h -> R^T W_K^h / a, b_K^h -> b_K^h R / a      (key-like maps)
    W_V^h -> a R^T W_V^h,   b_V^h -> a b_V^h R
    W_O^h -> W_O^h R / a                              (columns of head h; b_O unchanged)
and for the FFN with a permutation given as an index vector perm (new neuron j = old perm[j])
    W_i -> W_i[perm], b_i -> b_i[perm], W_o -> W_o[:, perm]      (b_o unchanged)
Each of these leaves the model's function unchanged. Beyond the paper, the full linear group of each head
(the learned refinement, matching/learned.py): an invertible M (d x d) acts after R and a as
    W_Q^h -> M^T W_Q^h, b_Q^h -> b_Q^h M,   W_K^h -> M^-1 W_K^h, b_K^h -> b_K^h M^-T      (m_qk: q.k kept)
    W_V^h -> M^T W_V^h, b_V^h -> b_V^h M,   W_O^h -> W_O^h M^-T                            (m_vo)
(under RoPE M must commute with every position's rotation: a scale and a rotation per plane), and a gated
FFN (SwiGLU: act(W_g x) * (W_i x)) keeps its function when neuron j of W_i (row, bias) is multiplied by
c_j and column j of W_o divided by it (ffn_scale, after the permutation).

Decoders (arch.py): with grouped-query attention R_qk, a_qk, R_vo, a_vo are per KV head j and
act on the rows of all `group` query heads j*group .. j*group + group - 1 (query side, output
columns) as well as on KV head j (key, value). Under RoPE, R_qk must be one 2x2 rotation per
frequency plane (i, i + rotary_dim/2) on the rotary dims (random_qk_rotation), since only
those commute with every position's rotation; the remaining dims take any orthogonal matrix.
A head permutation (head_perm, new query head h = old query head head_perm[h]) must move
whole KV groups: it is applied first, and the rotations then act on the permuted heads.

Beyond the blocks, a ResidualMap moves the residual stream shared by all layers (stream.py): fold the
listed pre-norms, h -> r h on every residual axis, unfold with the gains it carries. It acts on the
hidden axis of every map, the block transforms on the head and neuron axes, so the two commute.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import torch
from safetensors.torch import load_file, save_file

from symfusion.arch import AttentionLayout, FFNLayout, ModelLayout, Projection
from symfusion.errors import SymfusionError
from symfusion.presets import family_matching
from symfusion.stream import StreamLayout, centred_map, move_stream, stream_layout


@dataclass
class LayerTransform:
    """One layer's symmetry element; None means identity for that part."""

    r_qk: torch.Tensor | None = None      # (kv_heads, d, d) orthogonal (kv_heads = heads without GQA)
    a_qk: torch.Tensor | None = None      # (kv_heads,) nonzero
    r_vo: torch.Tensor | None = None      # (kv_heads, d, d) orthogonal
    a_vo: torch.Tensor | None = None      # (kv_heads,) nonzero
    ffn_perm: torch.Tensor | None = None  # (ffn,) long, a permutation
    head_perm: torch.Tensor | None = None  # (heads,) long: new query head h = old head_perm[h], whole KV groups
    m_qk: torch.Tensor | None = None      # (kv_heads, d, d) invertible, after r_qk, a_qk (under RoPE: commuting with it)
    m_vo: torch.Tensor | None = None      # (kv_heads, d, d) invertible, after r_vo, a_vo
    ffn_scale: torch.Tensor | None = None  # (ffn,) nonzero, gated FFNs only, after ffn_perm

    def is_identity(self) -> bool:
        return all(getattr(self, name) is None for name in PARTS)


PARTS = ("r_qk", "a_qk", "r_vo", "a_vo", "ffn_perm", "head_perm", "m_qk", "m_vo", "ffn_scale")


@dataclass
class ResidualMap:
    """A map of the residual stream: h -> r h (r orthogonal, or a signed permutation), with the pre-norms in
    `gains` folded before and unfolded to those gains after (stream.move_stream)."""

    r: torch.Tensor                                                   # (hidden, hidden)
    gains: dict[str, torch.Tensor] = field(default_factory=dict)      # folded norm's gain key -> its new gain


@dataclass
class Transform:
    """A whole-model symmetry element: one LayerTransform per transformed layer index, and optionally a map of
    the residual stream."""

    layers: dict[int, LayerTransform] = field(default_factory=dict)
    residual: ResidualMap | None = None

    def restrict(self, indices) -> "Transform":
        """The block transforms of the given layers (a residual map moves every layer: restricting drops it)."""
        keep = set(int(i) for i in indices)
        return Transform({i: t for i, t in self.layers.items() if i in keep})

    def save(self, path: str | Path) -> None:
        tensors = {}
        for i, layer in self.layers.items():
            for name in PARTS:
                value = getattr(layer, name)
                if value is not None:
                    tensors[f"layer.{i}.{name}"] = value.contiguous()
        if self.residual is not None:
            tensors["residual.r"] = self.residual.r.contiguous()
            tensors.update({f"residual.gain.{key}": g.contiguous() for key, g in self.residual.gains.items()})
        save_file(tensors, str(path), metadata={"format": "symfusion-transform-v1"})

    @staticmethod
    def load(path: str | Path) -> "Transform":
        tensors = load_file(str(path))
        layers: dict[int, LayerTransform] = {}
        residual = ResidualMap(tensors.pop("residual.r")) if "residual.r" in tensors else None
        for key, value in tensors.items():
            if key.startswith("residual.gain."):
                residual.gains[key[len("residual.gain."):]] = value
                continue
            _, index, name = key.split(".")
            setattr(layers.setdefault(int(index), LayerTransform()), name, value)
        return Transform(layers, residual)


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


def per_query_head(x: torch.Tensor | None, group: int) -> torch.Tensor | None:
    """A per-KV-head tensor (kv_heads, ...) repeated for the `group` query heads of each KV head (heads, ...)."""
    return x if x is None or group == 1 else x.repeat_interleave(group, dim=0)


def kv_permutation(head_perm: torch.Tensor, group: int) -> torch.Tensor:
    """The KV-head permutation that a query-head permutation induces; raises if it splits a KV group."""
    blocks = head_perm.reshape(-1, group)                     # (kv_heads, group): new group j's old heads
    kv = blocks[:, 0] // group
    if not torch.equal(blocks // group, kv[:, None].expand_as(blocks)):
        raise SymfusionError("a head permutation must move the query heads of one KV group together")
    return kv


def permute_head_rows(tensor: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Blocks of rows (or bias entries) by head: new head h = old head perm[h]. tensor (H*d, ...) or (H*d,)."""
    blocks = tensor.reshape(perm.shape[0], -1, *tensor.shape[1:])    # (H, d, ...)
    return blocks[perm].reshape(tensor.shape)


def permute_head_columns(weight: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Blocks of columns by head: new head h = old head perm[h]. weight (n, H*d)."""
    blocks = weight.reshape(weight.shape[0], perm.shape[0], -1)      # (n, H, d)
    return blocks[:, perm].reshape(weight.shape)


def permute_heads(out: dict, att: AttentionLayout, head_perm: torch.Tensor) -> None:
    """In `out`, move whole heads: query-like rows and output columns by head_perm, key/value rows by its KV groups."""
    kv = kv_permutation(head_perm, att.group)
    for proj, perm in [(p, head_perm) for p in att.query_like] + [(p, kv) for p in att.key_like + (att.value,)]:
        for key in proj.keys():
            out[key] = permute_head_rows(out[key], perm)
    out[att.output.weight] = permute_head_columns(out[att.output.weight], head_perm)


def _apply_attention(out: dict, att: AttentionLayout, t: LayerTransform) -> None:
    if t.head_perm is not None:
        permute_heads(out, att, t.head_perm)
    inv_qk = None if t.a_qk is None else 1.0 / t.a_qk
    inv_vo = None if t.a_vo is None else 1.0 / t.a_vo
    for proj in att.query_like:
        _move_projection(out, proj, per_query_head(t.r_qk, att.group), per_query_head(t.a_qk, att.group))
    for proj in att.key_like:
        _move_projection(out, proj, t.r_qk, inv_qk)
    _move_projection(out, att.value, t.r_vo, t.a_vo)
    weight = out[att.output.weight]
    if t.r_vo is not None:
        weight = rotate_columns(weight, per_query_head(t.r_vo, att.group))
    if inv_vo is not None:
        weight = scale_columns(weight, per_query_head(inv_vo, att.group))
    out[att.output.weight] = weight
    if t.m_qk is not None:
        inverse_t = torch.linalg.inv(t.m_qk).transpose(1, 2)             # M^-T: rotate_rows(W, M^-T) = M^-1 W
        for proj in att.query_like:
            _move_projection(out, proj, per_query_head(t.m_qk, att.group), None)
        for proj in att.key_like:
            _move_projection(out, proj, inverse_t, None)
    if t.m_vo is not None:
        _move_projection(out, att.value, t.m_vo, None)
        inverse_t = torch.linalg.inv(t.m_vo).transpose(1, 2)
        out[att.output.weight] = rotate_columns(out[att.output.weight], per_query_head(inverse_t, att.group))


def _apply_ffn(out: dict, ffn: FFNLayout, perm: torch.Tensor | None, scale: torch.Tensor | None = None) -> None:
    if perm is not None:
        for proj in (ffn.input, ffn.gate) if ffn.gate is not None else (ffn.input,):
            out[proj.weight] = out[proj.weight][perm]
            if proj.bias is not None:
                out[proj.bias] = out[proj.bias][perm]
        out[ffn.output.weight] = out[ffn.output.weight].index_select(1, perm)
    if scale is not None:
        if ffn.gate is None:
            raise SymfusionError("a per-neuron FFN scale keeps the function of gated FFNs (SwiGLU) only")
        out[ffn.input.weight] = out[ffn.input.weight] * scale.to(out[ffn.input.weight].dtype)[:, None]
        if ffn.input.bias is not None:
            out[ffn.input.bias] = out[ffn.input.bias] * scale.to(out[ffn.input.bias].dtype)
        out[ffn.output.weight] = out[ffn.output.weight] / scale.to(out[ffn.output.weight].dtype)[None, :]


def apply_transform(
    state: Mapping[str, torch.Tensor], layout: ModelLayout, transform: Transform
) -> dict[str, torch.Tensor]:
    """A new state dict with the transform applied; untouched tensors are shared, not copied."""
    out = dict(layout.canonical(state))
    if transform.residual is not None:
        out = move_residual(out, state, layout, transform.residual)
    out = apply_blocks(out, layout, transform.layers)
    return layout.stored_form(out) if layout.stored else out


def apply_blocks(canonical: Mapping[str, torch.Tensor], layout: ModelLayout,
                 layers: Mapping[int, LayerTransform]) -> dict[str, torch.Tensor]:
    """A canonical state (layout.canonical) with each layer's block transform applied; stays canonical."""
    out = dict(canonical)
    for i, t in layers.items():
        if not 0 <= i < layout.num_layers:
            raise SymfusionError(f"transform names layer {i}, but the model has {layout.num_layers} layers")
        layer = layout.layers[i]
        _apply_attention(out, layer.attention, t)
        if t.ffn_perm is not None or t.ffn_scale is not None:
            _apply_ffn(out, layer.ffn, t.ffn_perm, t.ffn_scale)
    return out


def move_residual(canonical: dict, state: Mapping[str, torch.Tensor], layout: ModelLayout,
                  residual: ResidualMap) -> dict[str, torch.Tensor]:
    """The residual map applied to a whole model's canonical state (`state`: the same model as stored). A map that
    folds the final norm of a state read as tied (its lm_head equal to its embeddings) was found for the untied form
    (matching.untie, io/untie.py): the state is read as untied."""
    stream = stream_layout(layout, state)
    if stream.tied_final and not set(residual.gains) <= {f.gain for f in stream.folds}:
        stream = stream_layout(layout, state, tied=False)
    if residual.r.shape != (stream.hidden, stream.hidden):
        raise SymfusionError(f"the residual map is {tuple(residual.r.shape)}, the model's stream has {stream.hidden} dims")
    folds = tuple(f for f in stream.folds if f.gain in residual.gains)
    if len(folds) != len(residual.gains):
        unknown = sorted(set(residual.gains) - {f.gain for f in folds})
        raise SymfusionError(f"the residual map folds {unknown[0]!r}, which is no pre-norm of this model")
    return move_stream(canonical, dataclasses.replace(stream, folds=folds), residual.r, residual.gains)


# ---------------------------------------------------------------- random group elements

def random_orthogonal(heads: int, d: int, generator: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    """Haar-random orthogonal matrices (det +1 or -1), (heads, d, d)."""
    gaussian = torch.randn(heads, d, d, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    signs = torch.sign(torch.diagonal(r, dim1=1, dim2=2))       # (heads, d): makes Q Haar-distributed
    return (q * signs[:, None, :]).to(dtype)


def plane_rotations(angles: torch.Tensor, rotary_dim: int, d: int) -> torch.Tensor:
    """Block rotations, one 2x2 rotation by angles[:, i] in each RoPE plane (i, i + rotary_dim/2); identity on
    the other d - rotary_dim dims. angles (heads, rotary_dim/2) -> (heads, d, d)."""
    heads, half = angles.shape[0], rotary_dim // 2
    r = torch.eye(d, dtype=angles.dtype).repeat(heads, 1, 1)
    i = torch.arange(half)
    cos, sin = torch.cos(angles), torch.sin(angles)          # (heads, half)
    r[:, i, i], r[:, i + half, i + half] = cos, cos
    r[:, i, i + half], r[:, i + half, i] = -sin, sin
    return r


def random_qk_rotation(heads: int, d: int, rotary_dim: int, generator: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    """A random element of the Q/K symmetry under RoPE: SO(2) per plane on the rotary dims, O(d - rotary_dim) on the
    rest, (heads, d, d). With rotary_dim = 0 this is random_orthogonal."""
    if rotary_dim == 0:
        return random_orthogonal(heads, d, generator, dtype)
    angles = 2 * torch.pi * torch.rand(heads, rotary_dim // 2, generator=generator, dtype=torch.float64)
    r = plane_rotations(angles, rotary_dim, d)
    if rotary_dim < d:
        r[:, rotary_dim:, rotary_dim:] = random_orthogonal(heads, d - rotary_dim, generator)
    return r.to(dtype)


def random_head_permutation(kv_heads: int, group: int, generator: torch.Generator) -> torch.Tensor:
    """A random query-head permutation moving whole KV groups (and query heads within each group), (heads,)."""
    kv = torch.randperm(kv_heads, generator=generator)
    within = torch.stack([torch.randperm(group, generator=generator) for _ in range(kv_heads)])   # (kv_heads, group)
    return (kv[:, None] * group + within).reshape(-1)


def random_transform(
    layout: ModelLayout,
    seed: int = 0,
    rotation: bool = True,
    scales: bool = True,
    permutation: bool = True,
    scale_range: tuple[float, float] = (0.5, 2.0),
    heads: bool | None = None,
) -> Transform:
    """A random symmetry element of the whole model (for tests, benchmarks and planted problems).

    heads: also permute whole heads (default: the family's, presets/families.yaml: on for decoders). Q/K rotations follow the
    layout's Q/K group: plane rotations under RoPE, none at all with per-head q/k norms.
    """
    gen = torch.Generator().manual_seed(seed)
    kv, d, group = layout.kv_heads, layout.head_dim, layout.num_heads // layout.kv_heads
    qk_group = layout.layers[0].attention.qk_group if layout.layers else "orthogonal"
    heads = family_matching(layout.family)["heads"] if heads is None else heads
    lo, hi = scale_range

    def scale() -> torch.Tensor:
        return (lo + (hi - lo) * torch.rand(kv, generator=gen, dtype=torch.float64))

    layers = {}
    for i in range(layout.num_layers):
        layers[i] = LayerTransform(
            r_qk=random_qk_rotation(kv, d, layout.rotary_dim, gen) if rotation and qk_group != "none" else None,
            a_qk=scale() if scales and qk_group != "none" else None,
            r_vo=random_orthogonal(kv, d, gen) if rotation else None,
            a_vo=scale() if scales else None,
            ffn_perm=torch.randperm(layout.ffn_size, generator=gen) if permutation else None,
        )
        if heads:
            layers[i].head_perm = random_head_permutation(kv, group, gen)
    return Transform(layers)


def random_residual(stream: StreamLayout, kind: str, seed: int = 0,
                    gain_range: tuple[float, float] = (0.5, 2.0)) -> ResidualMap:
    """A random map of the stream: `permutation` (signed for RMSNorm) or `orthogonal` (fixing the all-ones
    direction up to sign for LayerNorm), with random new gains for every foldable norm (random signs too)."""
    gen = torch.Generator().manual_seed(seed)
    d = stream.hidden
    if kind == "permutation":
        r = torch.zeros(d, d, dtype=torch.float64)
        r[torch.arange(d), torch.randperm(d, generator=gen)] = 1.0
        if stream.norm == "rmsnorm":
            r = r * torch.where(torch.rand(d, 1, generator=gen, dtype=torch.float64) < 0.5, -1.0, 1.0)
    elif kind == "orthogonal":
        if stream.norm == "layernorm":
            r = centred_map(random_orthogonal(1, d - 1, gen)[0], -1.0 if torch.rand(1, generator=gen) < 0.5 else 1.0)
        else:
            r = random_orthogonal(1, d, gen)[0]
    else:
        raise SymfusionError(f"unknown residual map kind {kind!r}; choose permutation or orthogonal")
    lo, hi = gain_range
    gains = {}
    for fold in stream.folds:
        magnitude = lo + (hi - lo) * torch.rand(d, generator=gen, dtype=torch.float64)
        gains[fold.gain] = magnitude * torch.where(torch.rand(d, generator=gen, dtype=torch.float64) < 0.2, -1.0, 1.0)
    return ResidualMap(r, gains)
