"""Rescaling matching of attention heads after rotation: the quartic of paper eq. (12).

For one head, with the source already rotated, the scale a (query-like/value side times a,
key-like/output side divided by a) minimises
    f(a) = A a^2 - 2 B a + D / a^2 - 2 E / a            (eq. 11 up to a constant)
with A = |Q_1|^2, B = <Q_1, Q_2>, D = |K_1|^2, E = <K_1, K_2> (biases included).
f'(a) = 0  <=>  A a^4 - B a^3 + E a - D = 0                (eq. 12)
We take every real nonzero root, keep the one with the lowest f, and fall back to a = 1
when no real root exists or a side is all zeros. Roots of all heads are found at once as
eigenvalues of the 4x4 companion matrices.
"""
from __future__ import annotations

import numpy as np
import torch

from symfusion.errors import SymfusionError

# A root counts as real when its imaginary part is this small relative to its modulus.
REAL_ROOT_TOL = 1e-7


def rescale_objective(a: np.ndarray, A, B, D, E) -> np.ndarray:
    """f(a) of eq. (11) without its constant term; broadcasts over heads and candidates."""
    return A * a**2 - 2 * B * a + D / a**2 - 2 * E / a


def quartic_roots(A: np.ndarray, B: np.ndarray, D: np.ndarray, E: np.ndarray) -> np.ndarray:
    """Complex roots of A a^4 - B a^3 + 0 a^2 + E a - D per head: (H,) each -> (H, 4)."""
    heads = A.shape[0]
    companion = np.zeros((heads, 4, 4))
    companion[:, 1:, :3] = np.eye(3)                # sub-diagonal ones
    # monic a^4 + c3 a^3 + c2 a^2 + c1 a + c0 with c3=-B/A, c2=0, c1=E/A, c0=-D/A
    companion[:, 0, 0] = B / A
    companion[:, 0, 2] = -E / A
    companion[:, 0, 3] = D / A
    return np.linalg.eigvals(companion)


def best_scales(A, B, D, E) -> torch.Tensor:
    """The per-head scale a minimising eq. (11) over the real roots of eq. (12), (H,) float64."""
    A, B, D, E = (np.asarray(x, dtype=np.float64) for x in (A, B, D, E))
    if not all(np.isfinite(x).all() for x in (A, B, D, E)):
        raise SymfusionError("the heads' squared norms overflow float32: the model's weights (or its norm gains folded "
                             "into the maps that read them) are too large to match; retrain or re-export that model")
    degenerate = (A <= 0) | (D <= 0)
    safe_A, safe_D = np.where(degenerate, 1.0, A), np.where(degenerate, 1.0, D)
    roots = quartic_roots(safe_A, B, safe_D, E)                       # (H, 4) complex
    is_real = np.abs(roots.imag) <= REAL_ROOT_TOL * np.maximum(np.abs(roots), 1.0)
    candidates = np.where(is_real & (np.abs(roots.real) > 0), roots.real, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = rescale_objective(candidates, safe_A[:, None], B[:, None], safe_D[:, None], E[:, None])
    values = np.where(np.isnan(values), np.inf, values)
    choice = candidates[np.arange(len(A)), values.argmin(axis=1)]
    no_root = ~np.isfinite(values).any(axis=1)
    scales = np.where(degenerate | no_root, 1.0, choice)
    return torch.from_numpy(scales)


def squared_norms(tensors_by_head: list[torch.Tensor]) -> torch.Tensor:
    """Sum of per-head squared norms over a list of (H, ...) tensors -> (H,) float64."""
    def per_head(t: torch.Tensor) -> torch.Tensor:
        flat = t.reshape(t.shape[0], -1)
        flat = flat.to(torch.promote_types(flat.dtype, torch.float32))
        return torch.linalg.vector_norm(flat, dim=1).to(torch.float64).pow(2)
    return sum(per_head(t) for t in tensors_by_head)
