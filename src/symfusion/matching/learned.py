"""Learned refinement: the continuous part of the whole symmetry moved to lower the loss along the merge path.

Weight matching minimises a distance between parameters; a merge needs a low loss between the models. As in
Theus et al.'s learned matching (Generalized LMC for Transformers), the continuous coordinates of the
transform the descent found are refined by Adam steps on the task loss of points of the path
    theta(alpha) = alpha anchor + (1 - alpha) T(source)
as stored (the weights a merge averages), alpha drawn uniformly from `alphas` at each step (seeded), or, with
`minimax` points given, the point among them whose loss on the step's batch is the largest (min over T of the max
over the points: the path's highest point is lowered, not one chosen in advance), over the data's batches in a
fixed order, with a cosine-decayed learning rate, for a fixed number of steps; with a
distillation weight w > 0 each step's loss is w times the cross-entropy of the point's predictions against the end
models' own, mixed as the point mixes them (alpha p_anchor + (1 - alpha) p_source), plus (1 - w) times the task loss:
- the residual rotation as R0 expm(S - S^T) (LayerNorm: on the complement of the all-ones vector);
- the gains t that unfold the moved source's folded pre-norms (the gauge, stream.py), as t0 exp(u): the
  midpoint of two models stored with different gains is not the midpoint of their folded forms (u's learning rate
  is `gains_lr` times the others');
- each KV head's maps: group `orthogonal`, its V/O rotation and Q/K rotation (RoPE: one rotation per plane by a
  learned angle, any rotation of the non-rotary dims) times a learned element of the same group, and its
  scales a0 exp(s); group `general`, the full linear group of the head: an invertible M = expm(X) after the
  descent's R and a for V/O and for Q/K (RoPE: the angles, and a scale per plane, which commutes with the
  position's rotation; any invertible map of the non-rotary dims), and for gated FFNs (SwiGLU) a scale
  exp(s) per neuron (symmetry.py);
so every iterate is an exact symmetry. The discrete parts (head, FFN and residual permutations) stay as found.
The refined transform is kept only if its midpoint loss (on the first CHECK_BATCHES batches) is below the
descent's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import torch
from torch.func import functional_call

from symfusion.arch import ModelLayout
from symfusion.errors import SymfusionError, steps
from symfusion.matching.residual import gauge_gains
from symfusion.stream import StreamLayout, centred_basis, is_signed_permutation, rotate_stream, unfold_norms
from symfusion.symmetry import LayerTransform, Transform, apply_blocks, plane_rotations

GROUPS = ("orthogonal", "general")
CHECK_BATCHES = 16          # the midpoint loss that decides whether the refinement is kept: on the first batches
SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True)
class RefineSettings:
    """How the refinement runs (MatchConfig.refine_*; the module docstring)."""

    steps: int = 200
    learning_rate: float = 1e-2
    schedule: str = "cosine"                     # constant | cosine (decay to 0 over `steps`)
    alphas: tuple[float, float] = (0.5, 0.5)     # the path points read: alpha uniform in [lo, hi] (1 = anchor)
    minimax: tuple[float, ...] = ()              # else each step at the one of these points with the largest loss
    group: str = "orthogonal"                    # orthogonal | general (the full linear group per head)
    gauge: bool = True                           # the path as stored, the unfolding gains learned
    distill: float = 0.0                         # the weight of the end models' predictions as targets (0: labels only)
    gains_lr: float = 1.0                        # the unfolding gains' learning rate, a multiple of learning_rate
    seed: int = 0                                # the alphas' draws

    def __post_init__(self):
        if self.steps < 1 or not self.learning_rate > 0:
            raise SymfusionError(f"matching.refine_steps={self.steps} and refine_lr={self.learning_rate} must be > 0")
        if self.schedule not in SCHEDULES or self.group not in GROUPS:
            raise SymfusionError(f"matching.refine_schedule={self.schedule!r}, refine_group={self.group!r}; choose "
                                 f"from {SCHEDULES} and {GROUPS}")
        if len(self.alphas) != 2 or not 0 <= self.alphas[0] <= self.alphas[1] <= 1:
            raise SymfusionError(f"matching.refine_alphas={list(self.alphas)} must satisfy 0 <= lo <= hi <= 1")
        if not all(0 <= alpha <= 1 for alpha in self.minimax):
            raise SymfusionError(f"matching.refine_minimax={list(self.minimax)} must be points 0 <= alpha <= 1")
        if not 0 <= self.distill <= 1:
            raise SymfusionError(f"matching.refine_distill={self.distill} must satisfy 0 <= w <= 1")
        if not self.gains_lr > 0:
            raise SymfusionError(f"matching.refine_gains_lr={self.gains_lr} must be > 0")


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
        self.tensors = (self.s,)

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
        self.tensors = (self.angles, self.rest)

    def value(self) -> torch.Tensor:
        d = self.r0.shape[-1]
        step = plane_rotations(self.angles, self.rotary, d)                        # (kv, d, d)
        if self.rotary < d:
            step = step.clone()
            step[:, self.rotary:, self.rotary:] = torch.matrix_exp(_skew(self.rest))
        return self.r0 @ step


class _General:
    """An invertible map per KV head, expm(X) (X learned, from 0); under RoPE a scale exp(s) per plane on the
    rotary dims (both of the plane's dims) and expm(X) on the rest."""

    def __init__(self, kv: int, d: int, rotary_dim: int = 0):
        self.d, self.rotary = d, rotary_dim
        rest = d - rotary_dim
        self.planes = torch.zeros(kv, rotary_dim // 2, dtype=torch.float64, requires_grad=True)
        self.rest = torch.zeros(kv, rest, rest, dtype=torch.float64, requires_grad=True)
        self.tensors = (self.planes, self.rest) if rotary_dim else (self.rest,)

    def value(self) -> torch.Tensor:
        if not self.rotary:
            return torch.matrix_exp(self.rest)
        scales = torch.exp(torch.cat([self.planes, self.planes], dim=1))           # (kv, rotary): plane i, i + half
        rest = torch.ones(scales.shape[0], self.d - self.rotary, dtype=scales.dtype)
        m = torch.diag_embed(torch.cat([scales, rest], dim=1))                     # (kv, d, d)
        if self.rotary < self.d:
            m = m.clone()
            m[:, self.rotary:, self.rotary:] = torch.matrix_exp(self.rest)
        return m


class _Scale:
    def __init__(self, a0: torch.Tensor):
        self.a0 = a0.to(torch.float64)
        self.s = torch.zeros_like(self.a0, requires_grad=True)
        self.tensors = (self.s,)

    def value(self) -> torch.Tensor:
        return self.a0 * torch.exp(self.s)


def _learnable(r: torch.Tensor, stream: StreamLayout, blocks: Transform, layout: ModelLayout, group: str):
    """(the residual map's parametrisation or None, per layer {part: parametrisation})."""
    residual = None if is_signed_permutation(r) else _Rotation(r, centred=stream.norm == "layernorm")
    layers = {}
    for i in range(layout.num_layers):
        t, att, ffn, parts = blocks.layers.get(i, LayerTransform()), layout.layers[i].attention, layout.layers[i].ffn, {}
        kv, d = layout.kv_heads, layout.head_dim
        rotary = att.rotary_dim if att.qk_group == "rope" else 0
        if att.qk_group == "rope" and t.r_qk is not None:
            parts["r_qk"] = _RopeRotation(t.r_qk, att.rotary_dim)
        if group == "general":
            if att.qk_group in ("orthogonal", "rope"):
                parts["m_qk"] = _General(kv, d, rotary)
            parts["m_vo"] = _General(kv, d)
            if ffn.gate is not None:
                parts["ffn_scale"] = _Scale(torch.ones(layout.ffn_size, dtype=torch.float64))
        else:
            if t.r_qk is not None and att.qk_group == "orthogonal":
                parts["r_qk"] = _Rotation(t.r_qk)
            if t.r_vo is not None:
                parts["r_vo"] = _Rotation(t.r_vo)
            parts.update({n: _Scale(getattr(t, n)) for n in ("a_qk", "a_vo") if getattr(t, n) is not None})
        layers[i] = parts
    return residual, layers


def _current(r: torch.Tensor, residual, blocks: Transform, layers: dict) -> tuple[torch.Tensor, dict]:
    found = {}
    for i, parts in layers.items():
        t = blocks.layers.get(i, LayerTransform())
        found[i] = LayerTransform(**{**vars(t), **{name: p.value() for name, p in parts.items()}})
    return (r if residual is None else residual.value()), found


class _Path:
    """The loss of a point of the path between the anchor and the moved source (both as stored, or both folded);
    with distillation, `ends` holds the two end models' parameters (set before the steps)."""

    def __init__(self, model, layout: ModelLayout, stream: StreamLayout, fs: dict, anchor: dict, distill: float = 0.0):
        self.model, self.layout, self.stream, self.fs, self.distill = model, layout, stream, fs, distill
        self.anchor = {k: v for k, v in anchor.items() if k != stream.tied_copy}
        self.ends = None
        self._targets = None            # (batch, the two ends' predictions on it): a batch read at several points

    def moved(self, r, layers, gains) -> dict:
        """The source moved by R and the block transforms, unfolded with `gains` (None: left folded)."""
        moved = apply_blocks(rotate_stream(self.fs, self.stream, r), self.layout, layers)
        return moved if gains is None else unfold_norms(moved, self.stream.folds, gains)

    def params(self, r, layers, gains, alpha: float, moved: dict | None = None) -> dict:
        """The point at alpha (1 = anchor); `moved`: self.moved(r, layers, gains), when already computed."""
        moved = self.moved(r, layers, gains) if moved is None else moved
        point = {k: alpha * a + (1 - alpha) * moved[k] if a.is_floating_point() else a for k, a in self.anchor.items()}
        return self.layout.stored_form(point) if self.layout.stored else point

    def output(self, params: dict, batch: dict):
        out = functional_call(self.model, params, args=(), kwargs=batch)
        if getattr(out, "loss", None) is None:
            raise SymfusionError("matching.refine=loss needs batches with labels (the model's own loss)")
        return out

    def loss(self, r, layers, gains, alpha: float, batch: dict, moved: dict | None = None) -> torch.Tensor:
        out = self.output(self.params(r, layers, gains, alpha, moved), batch)
        if not self.distill:
            return out.loss
        if self._targets is None or self._targets[0] is not batch:
            with torch.no_grad():
                self._targets = (batch, *(torch.softmax(self.output(params, batch).logits, -1) for params in self.ends))
        _, anchor, source = self._targets
        target = alpha * anchor + (1 - alpha) * source
        return self.distill * soft_cross_entropy(out.logits, target, batch["labels"]) + (1 - self.distill) * out.loss


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of `logits` against the distributions `target` over the positions the task loss
    reads: every row of a classifier's (batch, classes); a causal LM's (batch, seq, vocab) predicts the next
    token, so its last position is dropped and positions whose next label is -100 are left out."""
    log_p = torch.log_softmax(logits, -1)
    if logits.dim() == 3 and labels.dim() == 2:
        keep = labels[:, 1:] != -100                                           # (batch, seq - 1)
        return -(target[:, :-1] * log_p[:, :-1]).sum(-1)[keep].mean()
    return -(target * log_p).sum(-1).mean()


def refine_by_loss(fs: Mapping[str, torch.Tensor], fa: Mapping[str, torch.Tensor], anchor: Mapping[str, torch.Tensor],
                   layout: ModelLayout, stream: StreamLayout, r: torch.Tensor, blocks: Transform,
                   model: torch.nn.Module, batches: list[dict], settings: RefineSettings
                   ) -> tuple[torch.Tensor, Transform, dict | None, dict]:
    """(residual map, block transform, unfolding gains (None: leave them to the distance), info) after the
    refinement; fs, fa: the folded canonical states of source and anchor; anchor: the anchor as stored."""
    if not batches:
        raise SymfusionError("matching.refine=loss needs at least one batch of data")
    floats = lambda state: {k: v.detach().float() if v.is_floating_point() else v for k, v in state.items()}
    fs = floats(fs)
    path = _Path(model.eval(), layout, stream, fs,
                 floats(layout.canonical(anchor)) if settings.gauge else floats(fa), settings.distill)
    residual, layers = _learnable(r, stream, blocks, layout, settings.group)
    gains0, log_gains = None, {}
    if settings.gauge:
        with torch.no_grad():
            gains0 = gauge_gains(apply_blocks(rotate_stream(fs, stream, r), layout, blocks.layers),
                                 layout.canonical(anchor), stream.folds)
        log_gains = {k: torch.zeros_like(g, requires_grad=True) for k, g in gains0.items()}
    if settings.distill:                  # the end models as the path's ends at the descent's transform
        with torch.no_grad():
            path.ends = [path.params(r, blocks.layers, gains0, alpha) for alpha in (1.0, 0.0)]
    params = ([t for t in residual.tensors] if residual is not None else []) + \
        [t for parts in layers.values() for p in parts.values() for t in p.tensors]
    groups = [{"params": params}] + \
        ([{"params": list(log_gains.values()), "lr": settings.learning_rate * settings.gains_lr}] if log_gains else [])

    def state():
        cur_r, cur_layers = _current(r, residual, blocks, layers)
        gains = None if gains0 is None else {k: g * torch.exp(log_gains[k]) for k, g in gains0.items()}
        return cur_r, cur_layers, gains

    def midpoint_loss() -> float:
        with torch.no_grad():
            cur = state()
            check = batches[:CHECK_BATCHES]
            return math.fsum(path.loss(*cur, 0.5, b).item() for b in check) / len(check)

    before = midpoint_loss()
    lo, hi = settings.alphas
    alphas = lo + (hi - lo) * torch.rand(settings.steps, generator=torch.Generator().manual_seed(settings.seed),
                                         dtype=torch.float64)
    optimiser = torch.optim.Adam(groups, lr=settings.learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda k: 1.0 if settings.schedule == "constant" else
                                                 0.5 * (1 + math.cos(math.pi * k / settings.steps)))
    def highest(batch: dict) -> torch.Tensor:
        """The loss on `batch` at the minimax point where it is largest (the first of equal ones), with its graph:
        the source moved once for every point, each point's graph dropped once a higher one is found."""
        cur = state()
        moved = path.moved(*cur)
        top, top_value = None, -math.inf
        for alpha in settings.minimax:
            loss = path.loss(*cur, alpha, batch, moved)
            if top is None or loss.item() > top_value:
                top, top_value = loss, loss.item()
        return top

    with torch.enable_grad():
        for step in steps(range(settings.steps), "refinement steps", "step"):
            batch = batches[step % len(batches)]
            loss = highest(batch) if settings.minimax else path.loss(*state(), float(alphas[step]), batch)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            schedule.step()
    after = midpoint_loss()
    info = {"steps": settings.steps, "learning_rate": settings.learning_rate, "schedule": settings.schedule,
            "alphas": list(settings.alphas), "minimax": list(settings.minimax), "group": settings.group, "gauge": settings.gauge, "distill": settings.distill,
            "gains_lr": settings.gains_lr,
            "batches": len(batches), "midpoint_loss_before": before, "midpoint_loss_after": after,
            "learned": ["residual"] * (residual is not None) + ["gains"] * bool(log_gains) +
            sorted({n for parts in layers.values() for n in parts})}
    if not after < before:                      # no better on its own data: keep what the descent found
        return r, blocks, None, {**info, "kept": "descent"}
    with torch.no_grad():
        cur_r, cur_layers, gains = state()
        refined = Transform({i: LayerTransform(**{name: None if v is None else v.detach().clone()
                                                  for name, v in vars(t).items()}) for i, t in cur_layers.items()})
        gains = None if gains is None else {k: g.detach().clone() for k, g in gains.items()}
    return cur_r.detach().clone(), refined, gains, {**info, "kept": "refined"}
