"""Optimal transport between two models' neurons: the ground cost, the plan, and the soft alignment it gives.

Conventions are the reference's (Imfeld et al.'s otfusion_lib.fc_fusion and ground_metric.py, as
vendored in the authors' vit-fusion/otfusion/):

- the cost C (m source neurons x n anchor neurons) is the Euclidean distance between the neurons'
  feature vectors (squared only with cost=sqeuclidean; the reference's gnd_metric.squared: False),
  divided by its maximum (gnd_metric.norm: max);
- the plan T (m x n) solves min <T, C> with uniform marginals (1/m, 1/n), by POT's Sinkhorn with
  entropic regularisation `reg` (its 1,000 iterations) or by exact EMD (reg None);
- the alignment is P = m T^T (n x m): a source vector x (a row of W, a bias, a LayerNorm scale)
  is P x in the anchor's basis, so W -> P_out W P_in^T. For a permutation plan P is the
  permutation matrix. Sinkhorn's last update makes the rows of T (the source neurons) sum exactly
  to 1/m, so the columns of P sum to 1 and its rows approximately.
"""
from __future__ import annotations

import numpy as np
import torch

from symfusion.errors import SymfusionError

COSTS = ("euclidean", "sqeuclidean")


def ground_cost(source: torch.Tensor, anchor: torch.Tensor, cost: str) -> torch.Tensor:
    """Distances between feature rows, max-normalised: source (m, f), anchor (n, f) -> (m, n), float64."""
    distance = torch.cdist(source.double(), anchor.double())
    return normalized(distance.square() if cost == "sqeuclidean" else distance)


def normalized(cost: torch.Tensor) -> torch.Tensor:
    """C / max(C) (C unchanged when it is all zero)."""
    top = cost.max()
    return cost / top if top > 0 else cost


def alignment(cost: torch.Tensor, reg: float | None) -> torch.Tensor:
    """P = m T^T (anchor n x source m) from a cost (m x n); reg None means exact EMD."""
    import ot  # POT imports scikit-learn (~1.5 s): only merges that use OT pay for it

    m, n = cost.shape
    matrix = cost.detach().double().cpu().numpy()
    a, b = np.full(m, 1.0 / m), np.full(n, 1.0 / n)
    if reg is None:
        plan = ot.emd(a, b, matrix, numItermax=10_000_000)
    else:
        plan = ot.sinkhorn(a, b, matrix, reg, warn=False)
    if not (np.isfinite(plan).all() and (plan.sum(axis=0) > 0).all()):
        raise SymfusionError(f"Sinkhorn failed (reg={reg} is too small for this cost); increase the method's reg")
    return torch.from_numpy(m * plan.T).to(cost.device)
