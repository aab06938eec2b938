"""Loss barriers: loss and accuracy along the linear path theta(alpha) = alpha*A + (1-alpha)*B."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Mapping

import torch
from omegaconf import OmegaConf

from symfusion.errors import SymfusionError


def alpha_grid(points: int = 11) -> list[float]:
    """Evenly spaced alphas from 0 (model B) to 1 (model A), endpoints included."""
    if points < 2:
        raise ValueError("an interpolation path needs at least 2 points")
    return [i / (points - 1) for i in range(points)]


def interpolate(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], alpha: float) -> dict:
    """alpha*a + (1-alpha)*b for floating tensors; integer buffers are taken from a."""
    return {k: (alpha * v + (1 - alpha) * b[k]) if v.is_floating_point() else v for k, v in a.items()}


def barrier_height(alphas: list[float], losses: list[float]) -> float:
    """max over alpha of loss(alpha) minus the straight line between the end losses."""
    loss_b, loss_a = losses[0], losses[-1]
    return max(loss - (alpha * loss_a + (1 - alpha) * loss_b) for alpha, loss in zip(alphas, losses))


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
    for alpha in alphas:
        model.load_state_dict(interpolate(anchor, source, alpha))
        rows.append({"alpha": alpha, **evaluate(model.eval())})
    losses = [row["loss"] for row in rows]
    return {"path": rows, "barrier": barrier_height(alphas, losses)}


def run_barrier(anchor: str, source: str, task, output: str, points: int = 11, split: str = "test",
                resolved_config: dict | None = None, examples: int | None = None) -> dict:
    """The barrier stage: loss path between an anchor folder and a (matched) source folder, as JSON."""
    from symfusion.merge import load_models, matching_of
    from symfusion.modelio import write_json_atomic
    from symfusion.provenance import provenance
    from symfusion.tasks import evaluate_split

    if not output:
        raise SymfusionError("output=FILE.json is required")
    anchor_model, source_model = load_models([anchor, source])
    anchor_state = {k: v.detach().clone() for k, v in anchor_model.state_dict().items()}
    source_state = {k: v.detach().clone() for k, v in source_model.state_dict().items()}
    start = time.perf_counter()
    if examples:   # a fixed leading subset of the split: 11 points x 4 paths x 10,000 images is slow on a laptop
        plain = OmegaConf.to_container(task, resolve=True)        # Hydra's configs are struct: no new keys
        plain["limit"] = {**(plain.get("limit") or {}), split: int(examples)}
        task = OmegaConf.create(plain)
    result = loss_path(source_model, anchor_state, source_state, lambda m: evaluate_split(m, task, split), points)
    report = {
        "anchor": anchor, "source": source, "matching": matching_of(Path(source)), "task": task.name,
        "split": split, "examples": examples, **result, "seconds": time.perf_counter() - start,
        "provenance": provenance(resolved_config),
    }
    write_json_atomic(report, output)
    return report
