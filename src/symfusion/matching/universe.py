"""k models moved into one shared basis (a universe) by alternating pairwise whole-group solves onto a consensus.

Models theta_1..theta_k of one layout, one group element g_i each (a Transform: blocks and a residual map,
matching/whole.py), their moved copies X_i = g_i theta_i as stored. The objective is the spread around the mean
    J(g) = sum_i |X_i - mean_j X_j|^2 = (1/k) sum_{i<j} |X_i - X_j|^2.
With m_{-i} the mean of the other k - 1 copies,
    sum_{j != i} |X_i - X_j|^2 = (k - 1) |X_i - m_{-i}|^2 + terms without X_i,
so J as a function of g_i alone is ((k - 1)/k) |X_i - m_{-i}|^2 plus a constant. One step matches the ORIGINAL
theta_i (never a moved copy: no rounding piles up) onto the leave-one-out consensus m_{-i} with the pairwise solver
(match_models), and keeps the new g_i only when its copy is closer to m_{-i} (in float64) than the current one, by
more than TOL times the models' mean squared norm (less is rounding): J never rises (generalised Procrustes;
MergeMany's alternation, here over the whole group).
Start: every model onto model 0 (the anchor matching; g_0 = identity). A round visits i = 0..k-1 in order (each
step sees the copies the earlier steps moved); the alternation stops at a round that keeps no new element (a fixed
point) or after MAX_ROUNDS (converged: false). Every step is deterministic, so the result is.
The map from model i to model j is g_j^-1 g_i: along any cycle the maps compose to the identity, by construction.
Distances are over the floating tensors of `keys` (default: all of model 0's), float64 sums of float32 tensors.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

from symfusion.arch import ModelLayout
from symfusion.errors import SymfusionError, steps
from symfusion.matching.compose import MatchConfig
from symfusion.matching.models import match_models
from symfusion.measures import squared_difference
from symfusion.symmetry import Transform, apply_transform

MAX_ROUNDS = 10       # rounds of k pairwise solves after the start
TOL = 1e-9            # a new g_i is kept when |X_i' - m_{-i}|^2 < |X_i - m_{-i}|^2 - TOL mean_i |theta_i|^2


@dataclass
class Universe:
    """The k group elements (model i -> the shared basis), the moved states as stored, and the alternation's record."""

    transforms: list[Transform]
    aligned: list[dict[str, torch.Tensor]]
    objective: list[float]                    # J after the start, then after each round
    rounds: list[dict] = field(default_factory=list)
    converged: bool = False
    seconds: float = 0.0


def squared(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], keys: Sequence[str]) -> float:
    """|a - b|^2 over `keys`, in float64."""
    return math.fsum(squared_difference(a[k], b[k]) for k in keys)


def mean_state(states: Sequence[Mapping[str, torch.Tensor]], keys: Sequence[str],
               like: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The mean of `states` over `keys`: (in float64, in `like`'s dtypes with every other tensor `like`'s)."""
    exact = {k: sum(s[k].double() for s in states) / len(states) for k in keys}
    return exact, {**like, **{k: v.to(like[k].dtype) for k, v in exact.items()}}


def spread(states: Sequence[Mapping[str, torch.Tensor]], keys: Sequence[str]) -> float:
    """J = sum_i |X_i - mean|^2 (the mean in float64)."""
    total = 0.0
    for k in keys:
        stack = torch.stack([s[k].double() for s in states])
        total += float((stack - stack.mean(0)).pow(2).sum())
    return total


def floating_keys(state: Mapping[str, torch.Tensor], skip=()) -> list[str]:
    return [k for k, v in state.items() if v.is_floating_point() and k not in set(skip)]


@torch.no_grad()
def align_states(states: Sequence[Mapping[str, torch.Tensor]], layout: ModelLayout, config: MatchConfig,
                 keys: Sequence[str] | None = None, tied: bool | None = None,
                 max_rounds: int = MAX_ROUNDS) -> Universe:
    """Move k >= 2 state dicts of one layout into one basis (see the module's docstring); `keys`: the tensors the
    distances count (tied copies once); `tied`: whether an lm_head is tied to the embeddings (match_models)."""
    if len(states) < 2:
        raise SymfusionError(f"aligning many models needs k >= 2 of them, got {len(states)}")
    if config.needs_data or config.runs_models:
        raise SymfusionError("this matching reads data or runs the models; the k-way alignment is data-free for now "
                             "(choose full_symmetry, or a data-free preset)")
    start = time.perf_counter()
    keys = list(keys) if keys is not None else floating_keys(states[0])

    def solve(i: int, target: Mapping[str, torch.Tensor]) -> tuple[Transform, dict]:
        transform = match_models(states[i], target, layout, config, tied=tied).transform
        return transform, apply_transform(states[i], layout, transform)

    transforms, aligned = [Transform()], [dict(states[0])]
    for i in steps(range(1, len(states)), "start: onto model 0", "model"):     # the anchor matching onto model 0
        transform, moved = solve(i, states[0])
        transforms.append(transform)
        aligned.append(moved)
    floor = TOL * math.fsum(float(s[k].double().pow(2).sum()) for s in states for k in keys) / len(states)
    objective, rounds, converged = [spread(aligned, keys)], [], False
    for _ in steps(range(max_rounds), "rounds", "round"):
        kept, gains = [], []
        for i in steps(range(len(states)), "models", "model"):
            exact, consensus = mean_state([x for j, x in enumerate(aligned) if j != i], keys, aligned[i])
            transform, moved = solve(i, consensus)
            before, after = squared(aligned[i], exact, keys), squared(moved, exact, keys)
            if after < before - floor:
                transforms[i], aligned[i] = transform, moved
                kept.append(i)
                gains.append(before - after)
        objective.append(spread(aligned, keys))
        rounds.append({"kept": kept, "leave_one_out_gain": gains, "objective": objective[-1]})
        if not kept:
            converged = True
            break
    return Universe(transforms, aligned, objective, rounds, converged, time.perf_counter() - start)
