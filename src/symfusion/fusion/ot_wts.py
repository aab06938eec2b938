"""Transport maps from weights (the reference's wts fusion): each neuron's incoming weight row, no data.

Layer by layer, as the reference's fc_fusion with fusion.type: wts: the features of a linear
layer's output neuron are its weight row (no bias), the source's row first expressed in the
anchor's basis on its input side by the map of what it reads (W_s P_in^T), each row divided by
its norm + 1e-9 (wts.norm: true). So the maps depend on the maps before them:

    q, k, v from W P_in(i)^T;  o from W_o P_v^T;  fc1 from W_1 P_mid(i)^T;  fc2 from W_2 P_fc1^T

with P_in, P_mid carried along the residual stream by the residual policy (ot_align.py). Before
layer 0, ViT's patch map comes from the patch projection's rows and its class-token and position
maps from their values, each feature vector normalised (the class token's single entry becomes
its sign, as in the reference); text models' stream map comes from every embedding table before
the layers (word, position, token-type, DeBERTa's relative embeddings): per hidden unit, the
normalised column of each table, concatenated.
"""
from __future__ import annotations

import torch

from symfusion.arch import ModelLayout
from symfusion.families import FAMILIES
from symfusion.fusion.ot_align import TransportMaps, combine, entering_stream, keys_at, residual_axes
from symfusion.fusion.transport import alignment, ground_cost

_EPS = 1e-9   # the reference's normalisation of weight rows: w / (||w|| + 1e-9)


def weight_maps(anchor: dict, source: dict, layout: ModelLayout, reg: float, cost: str, policy: str) -> TransportMaps:
    """The maps of one source (float64 state dicts), computed in the order the reference computes them."""
    def plan(source_rows: torch.Tensor, anchor_rows: torch.Tensor) -> torch.Tensor:
        return alignment(ground_cost(unit_rows(source_rows), unit_rows(anchor_rows), cost), reg)

    def rows(proj, p_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The source's rows with their input in the anchor's basis (W_s P_in^T), and the anchor's rows."""
        return source[proj.weight] @ p_in.T, anchor[proj.weight]                       # (out, in) each

    if FAMILIES[layout.family].inputs == "pixels":
        (key,) = keys_at(anchor, layout, "patches", suffix="projection.weight")
        embeddings = {"patches": plan(source[key].flatten(1), anchor[key].flatten(1)),   # (H, C p p)
                      **vit_value_maps(source, anchor, layout, reg, cost, unit=True)}
    else:
        embeddings = {"stream": plan(_table_columns(source, layout), _table_columns(anchor, layout))}
    maps = TransportMaps(embeddings=embeddings, q=[], k=[], v=[], o=[], fc1=[], fc2=[])
    p_in = entering_stream(embeddings, policy)
    for layer in layout.layers:
        att, ffn = layer.attention, layer.ffn
        maps.q.append(plan(*rows(att.query_like[0], p_in)))
        maps.k.append(plan(*rows(att.key_like[0], p_in)))
        maps.v.append(plan(*rows(att.value, p_in)))
        maps.o.append(plan(*rows(att.output, maps.v[-1])))
        p_mid = combine(policy, p_in, maps.o[-1])
        maps.fc1.append(plan(*rows(ffn.input, p_mid)))
        maps.fc2.append(plan(*rows(ffn.output, maps.fc1[-1])))
        p_in = combine(policy, p_mid, maps.fc2[-1])
    return maps


def _table_columns(state: dict, layout: ModelLayout) -> torch.Tensor:
    """(H, features): per hidden unit, the normalised column of every embedding table before the layers."""
    blocks, tables = [], set(keys_at(state, layout, "embeddings"))
    for key, axes in residual_axes(layout, state).items():
        if key in tables and len(axes) == 1 and state[key].dim() >= 2:
            blocks.append(unit_rows(torch.movedim(state[key], axes[0], 0).flatten(1)))   # (H, entries)
    return torch.cat(blocks, dim=1)


def vit_value_maps(source: dict, anchor: dict, layout: ModelLayout, reg: float | None, cost: str,
                   unit: bool) -> dict[str, torch.Tensor]:
    """ViT's class-token and position maps from their values: per hidden unit, its class-token entry
    (1 feature) and its position-table column. The reference matches them on these values in both
    modes: raw for activation-based OT, each feature vector normalised (`unit`) for weight-based OT."""
    maps = {}
    for place in ("class_token", "positions"):
        (key,) = keys_at(anchor, layout, place)
        features = [s[key].double().reshape(-1, layout.hidden_size).T for s in (source, anchor)]  # (H, tokens)
        if unit:
            features = [unit_rows(f) for f in features]
        maps[place] = alignment(ground_cost(features[0], features[1], cost), reg)
    return maps


def unit_rows(rows: torch.Tensor) -> torch.Tensor:
    """Rows divided by their norm + 1e-9 (the reference's normalisation of weight rows)."""
    return rows / (rows.norm(dim=1, keepdim=True) + _EPS)
