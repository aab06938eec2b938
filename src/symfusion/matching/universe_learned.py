"""The learned k-way refinement: every model's map to the universe moved, jointly, to lower the loss of mixtures.

Start: the data-free universe (matching/universe.py): model i's element g_i = (R_i, B_i) in the folded gauge, its
moved copy X_i = B_i R_i fold(theta_i) stored with unit gains. As in the pairwise refinement (matching/learned.py,
whose parametrisations are reused), the continuous coordinates of every g_i are learned:
    R_i = R_i0 expm(S_i - S_i^T) (LayerNorm: on the complement of the all-ones vector), each head's rotations and
    scales (or, refine_group general, the full linear group per head), the unfolding gains t_i = exp(u_i),
so every iterate is an exact symmetry of each model; the discrete parts (head, FFN and residual permutations) stay as
the universe found them. A point w of the simplex is the mixture
    theta(w) = sum_i w_i unfold(X_i, t_i)          (as stored: the weights a merge averages)
and each step lowers, on the step's batch (the data's batches in a fixed order), the loss of the step's points
P = {the centroid} + DIRICHLET draws w ~ Dir(1, ..., 1) (seeded): their mean, or, where the family sets minimax
points (the ViT's), the largest of them (the step's highest point is lowered). With distillation w_d > 0 a point's
loss is w_d times the cross-entropy of its predictions against the end models' own mixed as it mixes them
(sum_i w_i p_i) plus (1 - w_d) times the task loss. Adam, the refinement's learning rate (the gains' times gains_lr)
and schedule, refine_steps steps; all k maps in one optimiser. The refined maps are kept only if the centroid's
loss on the first CHECK_BATCHES batches is below the start's; else the universe's are returned.
Every model maps to the one shared basis, so the maps i -> j (g_j^-1 g_i) are cycle-consistent by construction.
A common map Q of all k (R_i -> Q R_i) moves every mixture by Q and leaves its loss alone: a flat direction of the
objective, harmless to Adam.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import torch
from torch.func import functional_call

from symfusion.arch import ModelLayout
from symfusion.errors import SymfusionError, steps
from symfusion.matching.compose import MatchConfig
from symfusion.matching.learned import CHECK_BATCHES, _current, _learnable, soft_cross_entropy
from symfusion.stream import fold_norms, foldable, rotate_stream, stream_layout, unfold_norms
from symfusion.symmetry import LayerTransform, ResidualMap, Transform, apply_blocks

DIRICHLET = 3        # Dirichlet(1, ..., 1) draws of mixture weights per step, beside the centroid


class _Member:
    """Model i's learned element: its folded canonical state, its parametrised maps and unfolding gains."""

    def __init__(self, folded: dict, transform: Transform, stream, layout: ModelLayout, group: str, gauge: bool):
        self.fs, self.r0, self.blocks = folded, transform.residual.r, Transform(layers=dict(transform.layers))
        self.residual, self.layers = _learnable(self.r0, stream, self.blocks, layout, group)
        self.gains0 = {f.gain: torch.ones(stream.hidden, dtype=torch.float64) for f in stream.folds}
        self.log_gains = {k: torch.zeros_like(g, requires_grad=True) for k, g in self.gains0.items()} if gauge else {}

    def tensors(self) -> list[torch.Tensor]:
        return (list(self.residual.tensors) if self.residual is not None else []) + \
            [t for parts in self.layers.values() for p in parts.values() for t in p.tensors]

    def element(self) -> tuple[torch.Tensor, dict, dict]:
        """(R, per-layer transforms, gains) at the current coordinates."""
        r, layers = _current(self.r0, self.residual, self.blocks, self.layers)
        gains = {k: g * torch.exp(self.log_gains[k]) if k in self.log_gains else g for k, g in self.gains0.items()}
        return r, layers, gains


class _Simplex:
    """The loss of mixtures of the k moved models (as stored), with the end models' predictions for distillation."""

    def __init__(self, model, layout: ModelLayout, stream, members: list[_Member], distill: float):
        self.model, self.layout, self.stream, self.members, self.distill = model, layout, stream, members, distill
        with torch.no_grad():
            self.ends = [self.stored(self.moved(m)) for m in members]

    def moved(self, member: _Member) -> dict:
        r, layers, gains = member.element()
        return unfold_norms(apply_blocks(rotate_stream(member.fs, self.stream, r), self.layout, layers),
                            self.stream.folds, gains)

    def stored(self, point: dict) -> dict:
        point = {k: v for k, v in point.items() if k != self.stream.tied_copy}
        return self.layout.stored_form(point) if self.layout.stored else point

    def output(self, params: dict, batch: dict):
        out = functional_call(self.model, params, args=(), kwargs=batch)
        if getattr(out, "loss", None) is None:
            raise SymfusionError("the learned k-way refinement needs batches with labels (the model's own loss)")
        return out

    def losses(self, points: Sequence[Sequence[float]], batch: dict) -> list[torch.Tensor]:
        """The loss of each mixture point on `batch` (each with its graph); the k models moved once."""
        moved = [self.moved(m) for m in self.members]
        targets = None
        if self.distill:
            with torch.no_grad():
                targets = [torch.softmax(self.output(end, batch).logits, -1) for end in self.ends]
        out = []
        for w in points:
            point = {k: sum(wi * x[k] for wi, x in zip(w, moved)) if v.is_floating_point() else v
                     for k, v in moved[0].items()}
            result = self.output(self.stored(point), batch)
            if targets is None:
                out.append(result.loss)
                continue
            mixed = sum(wi * p for wi, p in zip(w, targets))
            out.append(self.distill * soft_cross_entropy(result.logits, mixed, batch["labels"]) +
                       (1 - self.distill) * result.loss)
        return out


def refine_universe(states: Sequence[Mapping[str, torch.Tensor]], layout: ModelLayout, config: MatchConfig,
                    transforms: Sequence[Transform], model: torch.nn.Module, batches: list[dict],
                    tied: bool | None = None) -> tuple[list[Transform], dict]:
    """(the k refined transforms, model i -> the shared basis; info) from the universe's `transforms` (whole-group
    elements of align_states on these `states`); `model`: a module of the models' architecture (its weights unused),
    `batches`: model inputs with labels."""
    if not batches:
        raise SymfusionError("the learned k-way refinement needs at least one batch of data (with labels)")
    if any(t.residual is None for t in transforms):
        raise SymfusionError("the learned k-way refinement moves whole-group elements: give a matching with a "
                             "residual map (matching.residual=auto, orthogonal or permutation)")
    settings, k = config.refine_settings(layout), len(states)
    stream = stream_layout(layout, states[0], tied)
    canonical = [{n: v.detach().float() if v.is_floating_point() else v for n, v in layout.canonical(s).items()}
                 for s in states]
    stream, _ = foldable(stream, config.residual, canonical)           # as align_states folded them
    members = [_Member(fold_norms(c, stream.folds), t, stream, layout, settings.group, settings.gauge)
               for c, t in zip(canonical, transforms)]
    batches = [{n: v.float() if v.is_floating_point() else v for n, v in b.items()} for b in batches]
    simplex = _Simplex(model.float().eval(), layout, stream, members, settings.distill)
    centroid = [1.0 / k] * k

    def centroid_loss() -> float:
        with torch.no_grad():
            check = batches[:CHECK_BATCHES]
            return math.fsum(simplex.losses([centroid], b)[0].item() for b in check) / len(check)

    before = centroid_loss()
    generator = torch.Generator().manual_seed(settings.seed)
    params = [t for m in members for t in m.tensors()]
    gains = [g for m in members for g in m.log_gains.values()]
    optimiser = torch.optim.Adam([{"params": params}] + ([{"params": gains, "lr": settings.learning_rate *
                                                            settings.gains_lr}] if gains else []),
                                 lr=settings.learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: 1.0 if settings.schedule == "constant" else
                                                 0.5 * (1 + math.cos(math.pi * s / settings.steps)))
    with torch.enable_grad():
        for step in steps(range(settings.steps), "k-way refinement steps", "step"):
            gammas = torch.empty(DIRICHLET, k, dtype=torch.float64).exponential_(generator=generator)
            points = [centroid] + (gammas / gammas.sum(1, keepdim=True)).tolist()   # Dir(1,..,1): normalised Exp(1)
            losses = simplex.losses(points, batches[step % len(batches)])
            loss = max(losses, key=lambda x: x.item()) if settings.minimax else sum(losses) / len(losses)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            schedule.step()
    after = centroid_loss()
    info = {"steps": settings.steps, "learning_rate": settings.learning_rate, "schedule": settings.schedule,
            "points": f"the centroid and {DIRICHLET} Dirichlet(1) draws per step, "
                      f"{'the largest' if settings.minimax else 'their mean'} lowered",
            "group": settings.group, "gauge": settings.gauge, "distill": settings.distill,
            "gains_lr": settings.gains_lr, "seed": settings.seed, "batches": len(batches),
            "check_batches": min(CHECK_BATCHES, len(batches)),
            "centroid_loss_before": before, "centroid_loss_after": after}
    if not after < before:                       # no better on its own data: keep the data-free universe
        return list(transforms), {**info, "kept": "universe"}
    refined = []
    with torch.no_grad():
        for member in members:
            r, layers, unfold = member.element()
            blocks = {i: LayerTransform(**{n: None if v is None else v.detach().clone() for n, v in vars(t).items()})
                      for i, t in layers.items()}
            refined.append(Transform(layers={i: t for i, t in blocks.items() if not t.is_identity()},
                                     residual=ResidualMap(r.detach().clone(),
                                                          {n: g.detach().clone() for n, g in unfold.items()})))
    return refined, {**info, "kept": "refined"}
