"""Optimal-transport fusion (Imfeld et al. 2024): align every source onto the anchor with transport maps, then average.

The three methods of the paper's Table 2, with the settings of the reference code (the authors'
vit-fusion/experiments/fuse_hf_vit_cifar10.yaml and fuse_pi_vit_cifar10.yaml, which drive the
vendored otfusion library):

- ot_acts:     maps from standardized activations (ot_acts.py), Sinkhorn with reg 0.08
               (ot_solver: sinkhorn, sinkhorn_reg: 0.08); 200 validation images (acts.num_samples),
               the CLS token plus the centre 6 x 6 patches (seq_filter: window_6), the CLS token
               only for the last layer's attention output and FFN;
- ot_acts_emd: the same with exact EMD plans (fuse_pi_vit_cifar10.yaml: ot_solver: emd);
- ot_wts:      maps from normalised weight rows without biases (ot_wts.py), Sinkhorn with reg 0.06;
               no data. The reference ships no wts config: this is fuse_hf_vit_cifar10.yaml with
               type: wts and the reg of its comment "optima 0.06 with wts and 0.08 with acts".

Common to all three: the ground cost is the Euclidean distance divided by its maximum
(transport.py); Q, K and V are each transported as full-width layers with their own maps (hidden
units may move across heads); the residual stream carries the maps of the blocks writing to it,
averaged with the residual path's (resid_policy: mean; ot_align.py). The fused model is the plain
average of the anchor and every aligned source (the reference fuses each source with the anchor
and averages the pairs, the same average).

LayerNorm, the softmax and GELU are equivariant only under permutations, so soft maps make the
aligned sources, hence the fused model, approximate: that is inherent to OT fusion. Under an
exact permutation plan (EMD on a planted permutation) the fusion is exact.
"""
from __future__ import annotations

import torch

from symfusion.arch import ModelLayout, check_same_layout, layout_of
from symfusion.families import check_compatible
from symfusion.errors import SymfusionError
from symfusion.fusion.common import batches_of, first_examples
from symfusion.fusion.options import FusionMethod, Option
from symfusion.fusion.ot_acts import TOKEN_RULE, activation_maps
from symfusion.fusion.ot_align import RESIDUAL_POLICIES, TransportMaps, align_state, residual_axes
from symfusion.fusion.ot_wts import weight_maps
from symfusion.fusion.simple import average_states
from symfusion.fusion.transport import COSTS


@torch.no_grad()
def _fuse_acts(models: list, batches: list, reg: float | None, cost: str, residual: str, tokens: str,
               last_layer_tokens: str | None, num_examples: int | None) -> dict:
    """OT fusion with maps from activations on the anchor's first `num_examples` examples."""
    layout, states = _setup(models)
    batches = first_examples(batches_of(batches, 0), num_examples)  # every model sees the anchor's inputs
    maps = activation_maps(models, layout, batches, reg, cost, tokens, last_layer_tokens or tokens)
    return _fuse(states, maps, layout, residual)


def _fuse_acts_emd(models: list, batches: list, **options) -> dict:
    return _fuse_acts(models, batches, reg=None, **options)


@torch.no_grad()
def _fuse_wts(models: list, batches, reg: float, cost: str, residual: str) -> dict:
    """OT fusion with maps from normalised weight rows (no data)."""
    layout, states = _setup(models)
    anchor = _float64(states[0])
    maps = [weight_maps(anchor, _float64(s), layout, reg, cost, residual) for s in states[1:]]
    return _fuse(states, maps, layout, residual)


def _setup(models: list) -> tuple[ModelLayout, list[dict]]:
    """Checks the models can be fused; returns the anchor's layout and all state dicts."""
    anchor = models[0]
    for i, model in enumerate(models[1:], start=1):
        check_compatible(model.config, anchor.config, f"model {i}", "the anchor (model 0)", use="merge")
    states = [m.state_dict() for m in models]
    layout = layout_of(anchor.config, states[0])
    layout.require_encoder("OT fusion")               # its transport maps know no KV groups, gates or RoPE planes
    for i, (model, state) in enumerate(zip(models[1:], states[1:]), start=1):
        check_same_layout(layout_of(model.config, state), layout)
        if set(state) != set(states[0]):
            extra = sorted(set(state) ^ set(states[0]))[0]
            raise SymfusionError(f"model {i} and the anchor have different tensors (e.g. {extra!r}); use one head type")
    residual_axes(layout, states[0])   # every tensor outside the layers is known (raises naming the first unknown)
    return layout, states


def _fuse(states: list[dict], maps: list[TransportMaps], layout: ModelLayout, residual: str) -> dict:
    aligned = [align_state(s, layout, m, residual) for s, m in zip(states[1:], maps)]
    return average_states([states[0]] + aligned)


def _float64(state: dict) -> dict:
    return {k: v.double() if v.is_floating_point() else v for k, v in state.items()}


# ---------------------------------------------------------------- declarations

def _reg(default: float) -> Option:
    return Option("reg", default, "entropic regularisation of Sinkhorn, relative to the max-normalised cost",
                  valid=lambda v: v > 0, rule="> 0 (ot_acts_emd gives exact transport)")


_COST = Option("cost", "euclidean", "ground cost between feature vectors (reference: not squared)",
               kind=str, choices=COSTS)
_RESIDUAL = Option("residual", "mean", "how the residual stream's map combines the residual path's and a "
                   "block's (the reference's resid_policy)", kind=str, choices=RESIDUAL_POLICIES)
_ACTS = (
    Option("num_examples", {"vit": 200, "default": None},
           "examples (the anchor's) whose activations give the maps (null: every example given)",
           kind=int, valid=lambda v: v >= 1, rule=">= 1", nullable=True),
    _COST,
    _RESIDUAL,
    Option("tokens", {"vit": "window_6", "default": "all"},
           "tokens whose activations count: all (text: non-padded), only_cls, window_<k> (ViT: CLS + centre k x k patches)",
           kind=str, valid=lambda v: TOKEN_RULE.fullmatch(v) is not None, rule="all, only_cls or window_<k>"),
    Option("last_layer_tokens", {"vit": "only_cls", "default": None},
           "tokens for the last layer's attention-output and FFN maps (null: as tokens)",
           kind=str, valid=lambda v: TOKEN_RULE.fullmatch(v) is not None, rule="all, only_cls or window_<k>",
           nullable=True),
)

# ot_acts' defaults: OT fusion on activations as the reference's vit-fusion/experiments/fuse_hf_vit_cifar10.yaml
# (Sinkhorn reg 0.08, Euclidean cost / max, resid_policy mean, 200 validation images, window_6 + CLS-only last
# layer, masks the reference applies on its 8x8 patch grid only; we centre them on any grid); text models (not in
# the reference): every non-padded token.
# ot_acts_emd: OT fusion on activations with exact EMD, as the reference's
# vit-fusion/experiments/fuse_pi_vit_cifar10.yaml (ot_solver: emd; otherwise as ot_acts); text models (not in the
# reference): every non-padded token.
# ot_wts: OT fusion on weights: the reference has no wts config file; this is its fuse_hf_vit_cifar10.yaml with
# type: wts (normalised rows without biases, Euclidean cost / max, resid_policy mean) and Sinkhorn reg 0.06 from
# that file's "optima 0.06 with wts" comment.
ACTS = FusionMethod("ot_acts", _fuse_acts, "OT fusion, Sinkhorn maps from standardized activations",
                    options=(_reg(0.08),) + _ACTS, reads_data=True, label="OT-ACTS")
ACTS_EMD = FusionMethod("ot_acts_emd", _fuse_acts_emd, "OT fusion, exact EMD maps from standardized activations",
                        options=_ACTS, reads_data=True, label="OT-ACTS-EMD")
WTS = FusionMethod("ot_wts", _fuse_wts, "OT fusion, Sinkhorn maps from normalised weight rows",
                   options=(_reg(0.06), _COST, _RESIDUAL), label="OT-WTS")
METHODS = (ACTS, ACTS_EMD, WTS)

merge_acts, merge_acts_emd, merge_wts = ACTS.merge, ACTS_EMD.merge, WTS.merge
