"""Learned refinement: the continuous part of a symmetry moved to lower the loss of the two models' midpoint.

Weight matching minimises a distance between parameters; a merge needs a low loss between the models.
As in Theus et al.'s learned matching (Generalized LMC for Transformers), the continuous coordinates of the
transform the descent found are refined by gradient steps (Adam, LEARNING_RATE) on the task loss of the
midpoint of the folded pair, (fold(anchor) + T(fold(source))) / 2, over the data's batches in turn:
- the residual rotation as R0 expm(S - S^T) (LayerNorm: on the complement of the all-ones vector);
- each KV head's V/O rotation, and its Q/K rotation (orthogonal: R0 expm(S - S^T); RoPE: R0 times one
  2x2 rotation per plane by a learned angle, any rotation on the non-rotary dims), as R0 times a learned
  element of the same group, so every iterate is an exact symmetry;
- each KV head's scales as a0 exp(s).
The discrete parts (head, FFN and residual permutations) stay as found.
"""
from __future__ import annotations

import math
from typing import Mapping

import torch
from torch.func import functional_call

from symfusion.arch import ModelLayout
from symfusion.errors import SymfusionError
from symfusion.stream import StreamLayout, centred_basis, is_signed_permutation, rotate_stream
from symfusion.symmetry import LayerTransform, Transform, apply_blocks, plane_rotations

LEARNING_RATE = 1e-2


def _skew(x: torch.Tensor) -> torch.Tensor:
    return x - x.transpose(-1, -2)


class _Rotation:
    """An orthogonal map (or a batch of them) r0 expm(S - S^T), S learned, optionally on the complement of 1."""

    def __init__(self, r0: torch.Tensor, centred: bool = False):
        self.centred = centred
        if centred:
            d = r0.shape[-1]
            self.basis = centred_basis(d)
            ones = torch.full((d,), d ** -0.5, dtype=torch.float64)
            self.sign = 1.0 if ones @ r0.to(torch.float64) @ ones >= 0 else -1.0
            self.ones = torch.outer(ones, ones)
            r0 = self.basis.T @ r0.to(torch.float64) @ self.basis                 # (d-1, d-1)
        self.r0 = r0.to(torch.float64)
        self.s = torch.zeros_like(self.r0, requires_grad=True)

    def value(self) -> torch.Tensor:
        q = self.r0 @ torch.matrix_exp(_skew(self.s))
        return self.sign * self.ones + self.basis @ q @ self.basis.T if self.centred else q


class _RopeRotation:
    """A Q/K map under RoPE: r0 times a learned rotation per plane and any rotation of the non-rotary dims."""

    def __init__(self, r0: torch.Tensor, rotary_dim: int):
        self.r0, self.rotary = r0.to(torch.float64), rotary_dim
        kv, d, _ = r0.shape
        self.angles = torch.zeros(kv, rotary_dim // 2, dtype=torch.float64, requires_grad=True)
        self.rest = torch.zeros(kv, d - rotary_dim, d - rotary_dim, dtype=torch.float64, requires_grad=True)

    def value(self) -> torch.Tensor:
        d = self.r0.shape[-1]
        step = plane_rotations(self.angles, self.rotary, d)                        # (kv, d, d)
        if self.rotary < d:
            step = step.clone()
            step[:, self.rotary:, self.rotary:] = torch.matrix_exp(_skew(self.rest))
        return self.r0 @ step


class _Scale:
    def __init__(self, a0: torch.Tensor):
        self.a0 = a0.to(torch.float64)
        self.s = torch.zeros_like(self.a0, requires_grad=True)

    def value(self) -> torch.Tensor:
        return self.a0 * torch.exp(self.s)


def _learnable(r: torch.Tensor, stream: StreamLayout, blocks: Transform, layout: ModelLayout):
    """(the residual map's parametrisation or None, per layer {part: parametrisation})."""
    residual = None if is_signed_permutation(r) else _Rotation(r, centred=stream.norm == "layernorm")
    layers = {}
    for i, t in blocks.layers.items():
        att, parts = layout.layers[i].attention, {}
        if t.r_qk is not None and att.qk_group == "orthogonal":
            parts["r_qk"] = _Rotation(t.r_qk)
        elif t.r_qk is not None and att.qk_group == "rope":
            parts["r_qk"] = _RopeRotation(t.r_qk, att.rotary_dim)
        if t.r_vo is not None:
            parts["r_vo"] = _Rotation(t.r_vo)
        parts.update({name: _Scale(getattr(t, name)) for name in ("a_qk", "a_vo") if getattr(t, name) is not None})
        layers[i] = parts
    return residual, layers


def _current(r: torch.Tensor, residual, blocks: Transform, layers: dict) -> tuple[torch.Tensor, dict]:
    found = {}
    for i, t in blocks.layers.items():
        values = {name: p.value() for name, p in layers[i].items()}
        found[i] = LayerTransform(r_qk=values.get("r_qk", t.r_qk), a_qk=values.get("a_qk", t.a_qk),
                                  r_vo=values.get("r_vo", t.r_vo), a_vo=values.get("a_vo", t.a_vo),
                                  ffn_perm=t.ffn_perm, head_perm=t.head_perm)
    return (r if residual is None else residual.value()), found


def _midpoint_loss(model, layout: ModelLayout, fs: dict, fa: dict, stream: StreamLayout, r, layers, batch) -> torch.Tensor:
    moved = apply_blocks(rotate_stream(fs, stream, r), layout, layers)
    mid = {k: 0.5 * (fa[k] + moved[k]) if fa[k].is_floating_point() else fa[k] for k in fa}
    params = layout.stored_form(mid) if layout.stored else mid
    out = functional_call(model, params, args=(), kwargs=batch)
    if getattr(out, "loss", None) is None:
        raise SymfusionError("matching.refine=loss needs batches with labels (the model's own loss)")
    return out.loss


def refine_by_loss(fs: Mapping[str, torch.Tensor], fa: Mapping[str, torch.Tensor], layout: ModelLayout,
                   stream: StreamLayout, r: torch.Tensor, blocks: Transform, model: torch.nn.Module,
                   batches: list[dict], steps: int) -> tuple[torch.Tensor, Transform, dict]:
    """(residual map, block transform, info) after `steps` Adam steps on the midpoint's loss; fs, fa: the folded
    canonical states of source and anchor."""
    if not batches:
        raise SymfusionError("matching.refine=loss needs at least one batch of data")
    fs = {k: v.detach().float() if v.is_floating_point() else v for k, v in fs.items()}
    fa = {k: v.detach().float() if v.is_floating_point() else v for k, v in fa.items()}
    model = model.eval()
    residual, layers = _learnable(r, stream, blocks, layout)
    params = ([residual.s] if residual is not None else []) + [
        tensor for parts in layers.values() for p in parts.values()
        for tensor in ((p.angles, p.rest) if isinstance(p, _RopeRotation) else (p.s,))]

    def mean_loss() -> float:
        with torch.no_grad():
            cur_r, cur_layers = _current(r, residual, blocks, layers)
            return math.fsum(_midpoint_loss(model, layout, fs, fa, stream, cur_r, cur_layers, b).item()
                             for b in batches) / len(batches)

    before = mean_loss()
    optimiser = torch.optim.Adam(params, lr=LEARNING_RATE)
    with torch.enable_grad():
        for step in range(steps):
            cur_r, cur_layers = _current(r, residual, blocks, layers)
            loss = _midpoint_loss(model, layout, fs, fa, stream, cur_r, cur_layers, batches[step % len(batches)])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    after = mean_loss()
    info = {"steps": steps, "learning_rate": LEARNING_RATE, "batches": len(batches),
            "midpoint_loss_before": before, "midpoint_loss_after": after,
            "learned": ["residual"] * (residual is not None) + sorted({n for parts in layers.values() for n in parts})}
    if not after < before:                      # no better on its own data: keep what the descent found
        return r, blocks, {**info, "kept": "descent"}
    with torch.no_grad():
        cur_r, cur_layers = _current(r, residual, blocks, layers)
        refined = Transform({i: LayerTransform(**{name: None if v is None else v.detach().clone()
                                                  for name, v in vars(t).items()}) for i, t in cur_layers.items()})
    return cur_r.detach().clone(), refined, {**info, "kept": "refined"}
