"""The transport maps of one source and how they move its tensors into the anchor's bases, along the residual stream.

Every map P is an alignment (anchor x source, see transport.py): a source vector x becomes P x,
so a source linear map y = W x + b whose output and input are aligned by P_out and P_in becomes
W -> P_out W P_in^T, b -> P_out b. Maps, as the reference computes them (otfusion_lib.py):

- one map per linear layer output: q, k, v (each over the full attention width, so hidden units
  may move across heads; separate maps for Q and K: the reference's qk_fusion: separate), o (the
  attention output), fc1 (FFN neurons), fc2 (the FFN output);
- before layer 0: one map of the stream entering it ("stream", text models), or ViT's three
  embedding maps: "class_token", "positions" and "patches".

The residual stream has no map of its own: it carries the maps of the blocks that write to it,
combined by the residual policy (the reference's resid_policy):

    P_in(0)  = P_stream, or for ViT combine(P_positions, P_patches)
    P_mid(i) = combine(P_in(i), P_o(i))            after layer i's attention residual add
    P_out(i) = combine(P_mid(i), P_fc2(i)) = P_in(i+1)
    combine(P_resid, P_block) = (P_resid + P_block) / 2   (mean)
                              = P_block                   (no_resid)
                              = P_resid                   (only_resid)

A tensor's input axis takes the map of the stream it reads, e.g. Q, K, V: W -> P_q W P_in(i)^T,
O: W -> P_o W P_v^T, FFN: W1 -> P_fc1 W1 P_mid(i)^T, W2 -> P_fc2 W2 P_fc1^T. Residual tensors
outside the projections (LayerNorms, embeddings, pooler, classifier columns) take the map of
their place along the stream (arch.FamilySpec.stream, e.g. ViT's layernorm_after: P_mid(i); the
final LayerNorm and the classifier: P_out(last)) on their residual axes (FamilySpec.residual_axes;
label rows never move). DeBERTa's positional projections read the relative embeddings (placed
before layer 0: P_in(0)) and are scored against the other side: pos_key (c2p, against the query)
takes P_q on its rows, pos_query (p2c, against the key) P_k.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from symfusion.arch import ModelLayout, Projection
from symfusion.families import FAMILIES, FamilySpec
from symfusion.errors import SymfusionError

RESIDUAL_POLICIES = ("mean", "no_resid", "only_resid")


@dataclass
class TransportMaps:
    """The alignments of one source onto the anchor (each anchor x source)."""

    embeddings: dict[str, torch.Tensor]   # "stream", or ViT's "class_token", "positions", "patches": (H, H)
    q: list[torch.Tensor]                 # per layer (width, width), width = heads * head_dim
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    o: list[torch.Tensor]                 # per layer (H, H)
    fc1: list[torch.Tensor]               # per layer (ffn, ffn)
    fc2: list[torch.Tensor]               # per layer (H, H)


def combine(policy: str, resid: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """The map of the stream after a residual add: the residual path's map and the block's, by policy."""
    if policy == "mean":
        return (resid + block) / 2
    if policy == "no_resid":
        return block
    if policy == "only_resid":
        return resid
    raise SymfusionError(f"unknown residual policy {policy!r}; choose one of {', '.join(RESIDUAL_POLICIES)}")


def entering_stream(embeddings: Mapping[str, torch.Tensor], policy: str) -> torch.Tensor:
    """P_in(0): the text embedding output's map, or ViT's patch map combined with the position map."""
    if "stream" in embeddings:
        return embeddings["stream"]
    return combine(policy, embeddings["positions"], embeddings["patches"])


def stream_maps(maps: TransportMaps, policy: str) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(P_in(i), P_mid(i), P_out(i)) for every layer i."""
    flow, current = [], entering_stream(maps.embeddings, policy)
    for o, fc2 in zip(maps.o, maps.fc2):
        mid = combine(policy, current, o)
        out = combine(policy, mid, fc2)
        flow.append((current, mid, out))
        current = out
    return flow


# ---------------------------------------------------------------- which tensor is where

def layer_prefixes(layout: ModelLayout) -> list[str]:
    """Each layer's key prefix ('bert.encoder.layer.3.'), from its query projection's key."""
    query = FAMILIES[layout.family].modules["query"] + ".weight"
    return [layer.attention.query_like[0].weight[: -len(query)] for layer in layout.layers]


def projection_keys(layout: ModelLayout) -> set[str]:
    """Keys of every Q/K/V/O/FFN projection (including DeBERTa's positional ones)."""
    keys: set[str] = set()
    for layer in layout.layers:
        att = layer.attention
        for proj in att.query_like + att.key_like + (att.value, att.output, layer.ffn.input, layer.ffn.output):
            keys.update(proj.keys())
    return keys


def residual_axes(layout: ModelLayout, state: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """The residual axes of every floating tensor outside the projections (checked to be hidden-sized)."""
    spec, inside, axes = FAMILIES[layout.family], projection_keys(layout), {}
    for key, tensor in state.items():
        if key in inside or not tensor.is_floating_point():
            continue
        axes[key] = spec.residual_axes_of(key)
        for axis in axes[key]:
            if tensor.shape[axis] != layout.hidden_size:
                raise SymfusionError(
                    f"{key!r} has size {tensor.shape[axis]} on its residual axis {axis}, expected hidden size "
                    f"{layout.hidden_size}; OT fusion does not support this {layout.family} variant"
                )
    return axes


def keys_at(state: Mapping[str, torch.Tensor], layout: ModelLayout, place: str, suffix: str = "") -> list[str]:
    """Keys of the floating tensors outside the projections that sit at `place` (and end with `suffix`)."""
    spec, inside = FAMILIES[layout.family], projection_keys(layout)
    return [k for k, v in state.items() if k not in inside and v.is_floating_point() and k.endswith(suffix)
            and spec.stream_position_of(k) == place]


def place_of(key: str, spec: FamilySpec, prefixes: list[str]) -> tuple[str, int | None]:
    """(where a residual tensor sits along the stream, its layer index or None outside the layers)."""
    position = spec.stream_position_of(key)
    layer = next((i for i, prefix in enumerate(prefixes) if key.startswith(prefix)), None)
    inside = position in ("in", "mid", "out")
    if inside != (layer is not None):
        raise SymfusionError(f"{key!r} is placed at {position!r} in the {spec.name} family's stream, "
                             "which does not fit where its key is; fix the family's stream in symfusion/families.py")
    return position, layer


# ---------------------------------------------------------------- applying the maps

def align_state(state: Mapping[str, torch.Tensor], layout: ModelLayout, maps: TransportMaps, policy: str) -> dict:
    """The source state dict expressed in the anchor's bases (float64; integer buffers untouched)."""
    out = {k: v.double() if v.is_floating_point() else v for k, v in state.items()}
    spec, flow = FAMILIES[layout.family], stream_maps(maps, policy)
    first = entering_stream(maps.embeddings, policy)
    prefixes = layer_prefixes(layout)
    for key, axes in residual_axes(layout, out).items():
        if not axes:
            continue
        position, layer = place_of(key, spec, prefixes)
        if position in ("in", "mid", "out"):
            p = flow[layer][("in", "mid", "out").index(position)]
        elif position == "embeddings":
            p = first
        elif position == "head":
            p = flow[-1][2] if flow else first
        elif position in maps.embeddings:     # ViT's class token, positions, patches
            p = maps.embeddings[position]
        else:
            raise SymfusionError(f"{key!r} sits at {position!r}, for which OT fusion computed no map")
        for axis in axes:
            out[key] = _along(out[key], p, axis)
    for i, (layer, (p_in, p_mid, _)) in enumerate(zip(layout.layers, flow)):
        att, ffn = layer.attention, layer.ffn
        _move(out, att.query_like[0], maps.q[i], p_in)
        _move(out, att.key_like[0], maps.k[i], p_in)
        for proj in att.query_like[1:]:      # DeBERTa's pos_query_proj: scored against the key
            _move(out, proj, maps.k[i], first)
        for proj in att.key_like[1:]:        # DeBERTa's pos_key_proj: scored against the query
            _move(out, proj, maps.q[i], first)
        _move(out, att.value, maps.v[i], p_in)
        _move(out, att.output, maps.o[i], maps.v[i])
        _move(out, ffn.input, maps.fc1[i], p_mid)
        _move(out, ffn.output, maps.fc2[i], maps.fc1[i])
    return out


def _move(out: dict, proj: Projection, p_out: torch.Tensor, p_in: torch.Tensor) -> None:
    """W -> P_out W P_in^T, b -> P_out b."""
    out[proj.weight] = p_out @ out[proj.weight] @ p_in.T
    if proj.bias:
        out[proj.bias] = p_out @ out[proj.bias]


def _along(tensor: torch.Tensor, p: torch.Tensor, axis: int) -> torch.Tensor:
    """x -> P x along one axis of a tensor."""
    moved = torch.movedim(tensor, axis, -1)                    # (..., n)
    return torch.movedim(moved @ p.T, -1, axis)
