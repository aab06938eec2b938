"""Linear interpolation between two models: the path theta(alpha) = alpha*A + (1-alpha)*B and its loss barriers."""
from __future__ import annotations

from typing import Callable, Mapping

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
