"""k models moved into one shared basis (a universe) by alternating pairwise whole-group solves onto a consensus.

Models theta_1..theta_k of one layout, one group element g_i each, their moved copies X_i = g_i theta_i. The objective
is the spread around the mean
    J(g) = sum_i |X_i - mean_j X_j|^2 = (1/k) sum_{i<j} |X_i - X_j|^2,
measured where the pairwise solver measures its distance. For a whole-group matching (matching.residual: the
residual stream moves) that is the folded gauge (stream.py: every pre-norm's gain folded into its readers, the gains
then 1): X_i = B_i R_i fold(theta_i), and the descent of matching/descent.py minimises exactly |B R fold(theta_i) - Y|
for a folded target Y. For a block-only matching it is the models as stored.
With m_{-i} the mean of the other k - 1 copies,
    sum_{j != i} |X_i - X_j|^2 = (k - 1) |X_i - m_{-i}|^2 + terms without X_i,
so J as a function of g_i alone is ((k - 1)/k) |X_i - m_{-i}|^2 plus a constant: one step matches the ORIGINAL
theta_i (never a moved copy: no rounding piles up) onto m_{-i}, and keeps the new g_i only when its copy is closer to
m_{-i} (in float64) by more than TOL times the models' mean squared norm (less is rounding): J never rises
(generalised Procrustes; MergeMany's alternation, here over the whole group).
Start (incremental): g_0 = identity; model i is matched onto the mean of the copies 0..i-1 already placed (at k = 2:
the pairwise solve of model 1 onto model 0). A round visits i = 0..k-1 in order (each step sees the copies the
earlier steps moved); a whole-group step's descent starts from the current R_i (a warm start: near the fixed point
it takes a block solve and a short inner loop). The alternation stops at a round that keeps no new element (a fixed
point), or lowers J by less than REL_TOL of J (settled), or after max_rounds (converged: false). Every step is
deterministic, so the result is.
Stored: a whole-group element is unfolded with unit gains for every model (W -> W diag(1), gain -> 1), so the stored
copies are the folded ones: a plain average of the stored weights is the average J measures, and the aligned models
are as far apart as stored as J says. The map from model i to model j is g_j^-1 g_i: along any cycle the maps
compose to the identity, by construction.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch

from symfusion.arch import ModelLayout
from symfusion.errors import SymfusionError, steps
from symfusion.matching.compose import MatchConfig, StageClock
from symfusion.matching.descent import descend
from symfusion.matching.models import match_models
from symfusion.matching.pairs import StatePair
from symfusion.matching.residual import residual_group
from symfusion.matching.starts import first_map, untouched_cross
from symfusion.measures import squared_difference
from symfusion.stream import fold_norms, foldable, rotate_stream, stream_layout
from symfusion.symmetry import ResidualMap, Transform, apply_blocks, apply_transform

MAX_ROUNDS = 10       # rounds of k pairwise solves after the start
TOL = 1e-9            # a new g_i is kept when |X_i' - m_{-i}|^2 < |X_i - m_{-i}|^2 - TOL mean_i |theta_i|^2
REL_TOL = 1e-3        # a round lowering J by less than this fraction of J ends the alternation (settled)
STARTS = ("incremental", "anchor")   # where model i starts: onto the mean of 0..i-1, or onto model 0


@dataclass
class Universe:
    """The k group elements (model i -> the shared basis), the moved states as stored, and the alternation's record."""

    transforms: list[Transform]
    aligned: list[dict[str, torch.Tensor]]
    objective: list[float]                    # J after the start, then after each round (where the solver measures)
    rounds: list[dict] = field(default_factory=list)
    converged: bool = False
    seconds: float = 0.0
    stop: str = ""                            # fixed point | settled | cap
    gauge: str = "stored"                     # folded (whole group: J in the folded gauge) | stored (block-only)
    start_cpu_seconds: float = 0.0            # CPU time of the start
    distances_before: list[list[float]] = field(default_factory=list)   # |X_i - X_j| unmoved, in J's gauge
    distances_after: list[list[float]] = field(default_factory=list)    # the same, moved
    cpu_seconds: float = 0.0                  # this process's CPU time for the whole alternation, start included


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


def pairwise(states: Sequence[Mapping[str, torch.Tensor]], keys: Sequence[str]) -> list[list[float]]:
    """|X_i - X_j| for every pair (a symmetric k x k table)."""
    k = len(states)
    table = [[0.0] * k for _ in range(k)]
    for i in range(k):
        for j in range(i + 1, k):
            table[i][j] = table[j][i] = squared(states[i], states[j], keys) ** 0.5
    return table


def floating_keys(state: Mapping[str, torch.Tensor], skip=()) -> list[str]:
    return [k for k, v in state.items() if v.is_floating_point() and k not in set(skip)]


@dataclass
class Space:
    """Where the alternation runs: the states it moves (folded canonical, or as stored), the keys J counts, how an
    element moves model i (placed), how model i is matched onto a target from an element or cold (solve), and the
    whole transform of an element (transform)."""

    states: list[dict]
    keys: list[str]
    placed: Callable
    solve: Callable
    transform: Callable
    identity: object
    gauge: str


def folded_space(states, layout: ModelLayout, config: MatchConfig, tied: bool | None) -> Space:
    """The whole group in the folded gauge: an element is (R, blocks); the solve is the pairwise descent."""
    stream = stream_layout(layout, states[0], tied)
    stream, kind = foldable(stream, config.residual, [layout.canonical(s) for s in states])
    group = residual_group(stream, kind, layout.family)
    folded = [fold_norms(layout.canonical(s), stream.folds) for s in states]
    keys = [k for k in floating_keys(folded[0]) if k != stream.tied_copy]    # the embeddings count once
    eye = torch.eye(stream.hidden, dtype=torch.float64)

    def placed(i: int, element) -> dict:
        return apply_blocks(rotate_stream(folded[i], stream, element[0]), layout, element[1])

    def solve(i: int, target: Mapping, warm) -> tuple:
        pair = StatePair(folded[i], {k: v for k, v in target.items() if k != stream.tied_copy}, layout, stream)
        r0, in_group = (warm[0], True) if warm is not None else first_map(*untouched_cross(pair), group)
        r, blocks, _, _ = descend(pair, group, r0, in_group, config, StageClock())
        return r, blocks

    def transform(element) -> Transform:
        gains = {f.gain: torch.ones(stream.hidden, dtype=torch.float64) for f in stream.folds}
        return Transform(layers={i: t for i, t in element[1].items() if not t.is_identity()},
                         residual=ResidualMap(element[0], gains))
    return Space(folded, keys, placed, solve, transform, (eye, {}), "folded")


def stored_space(states, layout: ModelLayout, config: MatchConfig, keys, tied: bool | None) -> Space:
    """A block-only matching, as stored: an element is a Transform; each solve is the pairwise solve, cold."""
    return Space([dict(s) for s in states], list(keys), lambda i, t: apply_transform(states[i], layout, t),
                 lambda i, target, warm: match_models(states[i], target, layout, config, tied=tied).transform,
                 lambda t: t, Transform(), "stored")


@torch.no_grad()
def align_states(states: Sequence[Mapping[str, torch.Tensor]], layout: ModelLayout, config: MatchConfig,
                 keys: Sequence[str] | None = None, tied: bool | None = None,
                 max_rounds: int = MAX_ROUNDS, start: str = "incremental") -> Universe:
    """Move k >= 2 state dicts of one layout into one basis (see the module's docstring); `keys`: the tensors a
    block-only matching's distances count (tied copies once); `tied`: whether an lm_head is tied to the embeddings
    (match_models); `start`: incremental (model i onto the mean of the copies placed before it) or anchor (model i
    onto model 0: the pairwise solves of anchor matching)."""
    if start not in STARTS:
        raise SymfusionError(f"start must be one of {', '.join(STARTS)}, got {start!r}")
    if len(states) < 2:
        raise SymfusionError(f"aligning many models needs k >= 2 of them, got {len(states)}")
    if config.needs_data or config.runs_models:
        raise SymfusionError("this matching reads data or runs the models; the k-way alignment is data-free for now "
                             "(choose full_symmetry, or a data-free preset)")
    begin, cpu = time.perf_counter(), time.process_time()
    space = folded_space(states, layout, config, tied) if config.residual != "none" else \
        stored_space(states, layout, config, keys if keys is not None else floating_keys(states[0]), tied)
    keys, k = space.keys, len(states)
    elements, moved = [space.identity], [space.placed(0, space.identity)]
    for i in steps(range(1, k), "start: onto the models placed", "model"):
        _, target = mean_state(moved if start == "incremental" else moved[:1], keys, space.states[i])
        elements.append(space.solve(i, target, None))
        moved.append(space.placed(i, elements[-1]))
    start_cpu = time.process_time() - cpu
    floor = TOL * math.fsum(float(s[key].double().pow(2).sum()) for s in space.states for key in keys) / k
    objective, rounds, stop = [spread(moved, keys)], [], "cap"
    for _ in steps(range(max_rounds), "rounds", "round"):
        clock, kept, before, after = time.process_time(), [], [], []
        for i in steps(range(k), "models", "model"):
            exact, target = mean_state([x for j, x in enumerate(moved) if j != i], keys, space.states[i])
            element = space.solve(i, target, elements[i])
            candidate = space.placed(i, element)
            before.append(squared(moved[i], exact, keys))
            after.append(squared(candidate, exact, keys))
            if after[-1] < before[-1] - floor:
                elements[i], moved[i] = element, candidate
                kept.append(i)
        objective.append(spread(moved, keys))
        rounds.append({"kept": kept, "leave_one_out_before": before, "leave_one_out_after": after,
                       "objective": objective[-1], "cpu_seconds": time.process_time() - clock})
        if not kept:
            stop = "fixed point"
            break
        if objective[-2] - objective[-1] < REL_TOL * objective[-2]:
            stop = "settled"
            break
    transforms = [space.transform(e) for e in elements]
    aligned = [apply_transform(s, layout, t) for s, t in zip(states, transforms)]
    return Universe(transforms, aligned, objective, rounds, stop != "cap", time.perf_counter() - begin, stop,
                    space.gauge, start_cpu, pairwise(space.states, keys), pairwise(moved, keys),
                    time.process_time() - cpu)
