"""Simple fusion: the plain average of every floating-point parameter (Wortsman et al. 2022)."""
from __future__ import annotations

import torch

from symfusion.fusion.options import FusionMethod


def average_states(states: list[dict], weights: list[float] | None = None) -> dict:
    """Weighted average of floating tensors; integer buffers are taken from the first state."""
    weights = weights or [1.0 / len(states)] * len(states)
    merged = {}
    for key, tensor in states[0].items():
        if not tensor.is_floating_point():
            merged[key] = tensor.clone()
            continue
        total = sum(w * s[key].double() for w, s in zip(weights, states))
        merged[key] = total.to(tensor.dtype)
    return merged


@torch.no_grad()
def _fuse(models: list, batches=None) -> dict:
    """theta = mean_i theta_i over all parameters and floating buffers."""
    return average_states([m.state_dict() for m in models])


# As the reference's vanilla_fusion_old (vit-fusion/otfusion/ot_utils.py).
METHOD = FusionMethod("simple", _fuse, "parameter average", reads_data=False, label="Simple")
merge = METHOD.merge
