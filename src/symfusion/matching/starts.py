"""The first residual maps of the whole-group descent: starts that the last bits of the weights do not move.

The first map comes before any block solve, so it reads what no block solve moves: the untouched tensors
(embeddings, positions, class token, norms' biases, writer biases, head maps), whose cross product M_u
(residual.py) R maximises as <R, M_u>; or the cross-covariance of the two models' residual streams after the
embeddings (residual_solve=activations). Either M can be rank-deficient: a ViT's untouched tensors (16 patch
pixels, 50 positions, a class token, a few biases, 10 classes) span 91 of the mini's 95 centred directions,
and its embedding outputs fewer. The polar factor U V^T of M is then not determined on the null space of M,
and float32 rounding of the weights (1e-7) chooses it there: three such roundings sent the descent to three
optima whose simple merges differ by up to 1.9 points. So the orthogonal start is the regularised polar factor
    R0 = M (M^T M + eps^2 I)^(-1/2) = U diag(s / sqrt(s^2 + eps^2)) V^T,   eps = SOFT * s_max
(on the complement of 1 for LayerNorm), continuous in M: it damps what M does not determine instead of
guessing it. R0 is no group element: the attention blocks (heads, rotations, scales) are solved at R0, and the
first group element maximises <R, M> with the attention maps so matched added to M (completed_start); the
descent (descent.py) starts from it. Permutation groups take the linear assignment on M (exact ties aside, a
permutation start is locally constant in M).
"""
from __future__ import annotations

from typing import Mapping

import torch
from torch.func import functional_call

from symfusion.matching.continuous import outside_part
from symfusion.matching.residual import activation_cross, residual_cross, solve_residual
from symfusion.stream import StreamLayout, centred_basis, centred_map
from symfusion.symmetry import LayerTransform, apply_blocks

SOFT = 1e-2     # eps / s_max of the regularised polar factor


def untouched_cross(pair) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, G) of the tensors no block solve moves: those outside the layers, each layer's norms and writer biases."""
    layout, stream = pair.layout, pair.stream
    outside = outside_part(pair)
    m, g = residual_cross(*outside.quadratic, stream, current=torch.eye(stream.hidden, dtype=torch.float64))
    m, g = m + outside.m, g + outside.g
    for i in range(layout.num_layers):
        att, ffn = layout.layers[i].attention, layout.layers[i].ffn
        blocks = set(layout.layer_keys(i)) - {p.bias for p in (att.output, ffn.output) if p.bias}
        fs, fa = pair.layer(i)
        layer_m, layer_g = residual_cross(fs, fa, stream, keys={k for k in fa if k not in blocks})
        m, g = m + layer_m, g + layer_g
    return m, g


def regularised_polar(m: torch.Tensor, group: str, soft: float = SOFT) -> torch.Tensor:
    """U diag(s / sqrt(s^2 + eps^2)) V^T of m = U diag(s) V^T, eps = soft * s_max, (d, d) float64; for
    orthogonal_centred on the complement of the all-ones vector (sign(1^T m 1) on it)."""
    if group == "orthogonal_centred":
        d = m.shape[0]
        basis, ones = centred_basis(d), torch.full((d,), d ** -0.5, dtype=torch.float64)
        return centred_map(regularised_polar(basis.T @ m @ basis, "orthogonal", soft), 1.0 if ones @ m @ ones >= 0 else -1.0)
    u, s, vh = torch.linalg.svd(m.to(torch.float64))
    eps = soft * s[0] if s[0] > 0 else 1.0
    return (u * (s / torch.sqrt(s ** 2 + eps ** 2))) @ vh


def completed_start(pair, group: str, attention: Mapping[int, LayerTransform]) -> torch.Tensor:
    """The first group element: argmax <R, M_u + M_att> + <|R|, G_u>, M_att the cross product of every layer's
    attention maps with `attention` (heads, rotations, scales solved at the regularised start) applied; the FFN
    maps, whose permutations such a start cannot yet tell, wait for the first block solves at it."""
    layout, stream = pair.layout, pair.stream
    m, g = untouched_cross(pair)
    for i in range(layout.num_layers):
        att = layout.layers[i].attention
        keys = att.qk_keys() + att.vo_keys()
        fs, fa = pair.layer(i)
        moved = apply_blocks({k: fs[k] for k in keys}, layout, {i: attention[i]})
        layer_m, _ = residual_cross(moved, {k: fa[k] for k in keys}, stream)
        m = m + layer_m
    return solve_residual(m, group, g)


def first_map(m: torch.Tensor, g: torch.Tensor, group: str) -> tuple[torch.Tensor, bool]:
    """(the descent's first map from a cross product, whether it is a group element)."""
    if group.startswith("orthogonal"):
        return regularised_polar(m, group), False
    return solve_residual(m, group, g), True


def stream_states(model: torch.nn.Module, state, batches: list[dict], tied_copy: str | None = None) -> torch.Tensor:
    """The residual stream after the embeddings, (tokens, d), of `model` holding `state`; padding left out. A tied
    lm_head listed beside its embeddings (`tied_copy`) is left out: the module ties it to them itself."""
    state = {k: v for k, v in state.items() if k != tied_copy}
    found = []
    with torch.no_grad():
        for batch in batches:
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            hidden = functional_call(model, state, args=(), kwargs={**inputs, "output_hidden_states": True})
            states = hidden.hidden_states[0]                                      # (batch, tokens, d)
            if "attention_mask" in inputs:
                states = states[inputs["attention_mask"].bool()]
            found.append(states.reshape(-1, states.shape[-1]))
    return torch.cat(found)


def activation_start(model: torch.nn.Module, batches: list[dict], source, anchor, stream: StreamLayout,
                     group: str) -> tuple[torch.Tensor, bool]:
    """The first map from the two models' residual streams after the embeddings at the same inputs."""
    states = [stream_states(model, s, batches, stream.tied_copy) for s in (anchor, source)]
    m = activation_cross(*states, stream)
    return first_map(m, torch.zeros_like(m), group)
