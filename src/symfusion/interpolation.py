"""Linear interpolation between models: the path theta(alpha) = alpha*A + (1-alpha)*B, mixtures over the simplex of k models, and their loss barriers."""
from __future__ import annotations

import itertools
from typing import Callable, Mapping, Sequence

import torch

from symfusion.errors import SymfusionError, steps


def alpha_grid(points: int = 11) -> list[float]:
    """Evenly spaced alphas from 0 (model B) to 1 (model A), endpoints included."""
    if points < 2:
        raise SymfusionError(f"points={points}: an interpolation path needs at least 2 points")
    return [i / (points - 1) for i in range(points)]


def interpolate(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], alpha: float) -> dict:
    """alpha*a + (1-alpha)*b for floating tensors; integer buffers are taken from a."""
    return {k: (alpha * v + (1 - alpha) * b[k]) if v.is_floating_point() else v for k, v in a.items()}


def barrier_height(alphas: list[float], losses: list[float]) -> float:
    """max over alpha of loss(alpha) minus the straight line between the end losses (Frankle et al.'s barrier)."""
    loss_b, loss_a = losses[0], losses[-1]
    return max(loss - (alpha * loss_a + (1 - alpha) * loss_b) for alpha, loss in zip(alphas, losses))


def barrier_range(losses: list[float]) -> float:
    """max minus min of the loss along the path: the paper's loss barrier ("the range of loss value along
    the interpolation path", Section 5)."""
    return max(losses) - min(losses)


@torch.no_grad()
def loss_path(
    model: torch.nn.Module,
    anchor: Mapping[str, torch.Tensor],
    source: Mapping[str, torch.Tensor],
    evaluate: Callable[[torch.nn.Module], dict],
    points: int = 11,
) -> dict:
    """Evaluate the model at every alpha (alpha=1 is the anchor A, alpha=0 the source B)."""
    alphas = alpha_grid(points)
    rows = []
    for alpha in steps(alphas, "path points", "point"):
        model.load_state_dict(interpolate(anchor, source, alpha))
        rows.append({"alpha": alpha, **evaluate(model.eval())})
    losses = [row["loss"] for row in rows]
    return {"path": rows, "barrier": barrier_range(losses), "barrier_linear": barrier_height(alphas, losses)}


def simplex_grid(k: int, n: int = 4) -> list[tuple[float, ...]]:
    """The points w of the k-simplex with w_i = c_i / n (integers c_i summing to n) and at least two nonzero (the
    vertices are the end models themselves), then the centroid (1/k, ..., 1/k) unless it is among them."""
    if k < 2 or n < 1:
        raise SymfusionError(f"a simplex grid needs k >= 2 models and a step 1/n with n >= 1, got k={k}, n={n}")
    points = [tuple(c / n for c in combo) for combo in itertools.product(range(n + 1), repeat=k)
              if sum(combo) == n and sum(c > 0 for c in combo) >= 2]
    centroid = tuple(1 / k for _ in range(k))
    on_grid = any(max(abs(a - b) for a, b in zip(p, centroid)) <= 1e-12 for p in points)
    return points + ([] if on_grid else [centroid])


def mixture(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]) -> dict:
    """sum_i w_i state_i for floating tensors (the merge at the simplex point w); integer buffers from the first."""
    return {k: sum(w * s[k] for w, s in zip(weights, states)) if v.is_floating_point() else v
            for k, v in states[0].items()}


def simplex_barrier(points: Sequence[Sequence[float]], losses: Sequence[float], end_losses: Sequence[float]) -> float:
    """max over the points w of loss(sum_i w_i X_i) - sum_i w_i loss(X_i): the loss of the mixture above the mixture
    of the end models' losses (at k = 2 and points on the segment: barrier_height)."""
    return max(loss - sum(w * e for w, e in zip(point, end_losses)) for point, loss in zip(points, losses))


@torch.no_grad()
def simplex_losses(model: torch.nn.Module, states: Sequence[Mapping[str, torch.Tensor]],
                   evaluate: Callable[[torch.nn.Module], dict], points: Sequence[Sequence[float]]) -> list[dict]:
    """evaluate(model) with the weights of each mixture sum_i w_i states_i, one dict per point (w: its weights)."""
    rows = []
    for point in steps(list(points), "simplex points", "point"):
        model.load_state_dict(mixture(states, point))
        rows.append({"weights": list(point), **evaluate(model.eval())})
    return rows
