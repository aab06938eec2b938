"""Multi-model matching: k models moved towards each other (generalised Procrustes), anchor kept fixed.

Appendix D's open problem: with k > 2 models, matching every model onto one anchor
(`match_many`) depends on the anchor. Here the transforms T_0..T_{k-1} minimise the sum of
pairwise squared distances sum_{i<j} |T_i(theta_i) - T_j(theta_j)|^2 by block coordinate
descent: model m is matched (rotation per head, rescaling, FFN permutation: any MatchConfig)
onto the mean of the other k-1 moved models, which is an exact minimisation over T_m of the
pairwise sum for rotations and permutations, because
    sum_{j != m} |X_m - X_j|^2 = (k-1) |X_m - mean_{j != m} X_j|^2 + terms without X_m.
A candidate replaces the current T_m only for the heads (and the FFN) where it is closer to
that mean, so the objective never increases. Layers are independent and solved one by one.
The anchor's scales stay 1 (rescaling is not an isometry); at the end every T_m is composed
with T_0^{-1}, a rotation/permutation applied to all models alike, which leaves the pairwise
distances unchanged and the anchor untouched.

Composition convention (matching symmetry.py): applying t1 then t2 is one transform with
R = R1 R2, a = a1 a2 and perm = perm1[perm2].
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

import torch

from symfusion.arch import ModelLayout, resolve_layers
from symfusion.errors import SymfusionError
from symfusion.matching.compose import MULTI_CHOICES, MatchConfig, StageClock, match_layer, matching_config
from symfusion.matching.models import match_many
from symfusion.measures import distance, float64_blocks
from symfusion.symmetry import LayerTransform, Transform, apply_transform

METHODS = MULTI_CHOICES


# ---------------------------------------------------------------- group operations

def _product(x, y, combine):
    """combine(x, y) with None as the identity."""
    if x is None:
        return y
    if y is None:
        return x
    return combine(x, y)


def compose_layer(t1: LayerTransform, t2: LayerTransform) -> LayerTransform:
    """The one LayerTransform equal to applying t1, then t2."""
    matmul = lambda x, y: x @ y.to(x.dtype)  # noqa: E731   (H, d, d) batched
    scale = lambda x, y: x * y.to(x.dtype)   # noqa: E731   (H,)
    return LayerTransform(
        r_qk=_product(t1.r_qk, t2.r_qk, matmul),
        a_qk=_product(t1.a_qk, t2.a_qk, scale),
        r_vo=_product(t1.r_vo, t2.r_vo, matmul),
        a_vo=_product(t1.a_vo, t2.a_vo, scale),
        ffn_perm=_product(t1.ffn_perm, t2.ffn_perm, lambda p1, p2: p1[p2]),
    )


def invert_layer(t: LayerTransform) -> LayerTransform:
    """The inverse: applying t, then invert_layer(t), is the identity."""
    def maybe(x, fn):
        return None if x is None else fn(x)
    return LayerTransform(
        r_qk=maybe(t.r_qk, lambda r: r.transpose(1, 2).contiguous()),
        a_qk=maybe(t.a_qk, torch.reciprocal),
        r_vo=maybe(t.r_vo, lambda r: r.transpose(1, 2).contiguous()),
        a_vo=maybe(t.a_vo, torch.reciprocal),
        ffn_perm=maybe(t.ffn_perm, torch.argsort),
    )


def compose(t1: Transform, t2: Transform) -> Transform:
    """Applying t1, then t2, as one Transform (layers missing from one side are identity there)."""
    identity = LayerTransform()
    layers = sorted(set(t1.layers) | set(t2.layers))
    return Transform({i: compose_layer(t1.layers.get(i, identity), t2.layers.get(i, identity)) for i in layers})


def invert(t: Transform) -> Transform:
    return Transform({i: invert_layer(layer) for i, layer in t.layers.items()})


def dense_layer(t: LayerTransform | None, heads: int, head_dim: int, ffn_size: int) -> LayerTransform:
    """t with every None part replaced by its identity (eye, ones, arange), float64."""
    t = t or LayerTransform()
    eye = torch.eye(head_dim, dtype=torch.float64).expand(heads, head_dim, head_dim)
    ones = torch.ones(heads, dtype=torch.float64)

    def fill(x, default):
        return default.clone() if x is None else x.to(default.dtype)
    return LayerTransform(
        r_qk=fill(t.r_qk, eye), a_qk=fill(t.a_qk, ones), r_vo=fill(t.r_vo, eye), a_vo=fill(t.a_vo, ones),
        ffn_perm=fill(t.ffn_perm, torch.arange(ffn_size)),
    )


def sparse_layer(t: LayerTransform, config: MatchConfig) -> LayerTransform:
    """Only the parts `config` matches (as match_models returns them); the rest None."""
    rotates, permutes = config.attention != "none", config.ffn != "none"
    return LayerTransform(
        r_qk=t.r_qk if rotates else None, a_qk=t.a_qk if config.rescale else None,
        r_vo=t.r_vo if rotates else None, a_vo=t.a_vo if config.rescale else None,
        ffn_perm=t.ffn_perm if permutes else None,
    )


# ---------------------------------------------------------------- objective pieces

def layer_keys(layout: ModelLayout, index: int) -> list[str]:
    """The state-dict keys one layer's transform moves (QK maps, V, O weight, FFN in and out)."""
    layer = layout.layers[index]
    return layer.attention.qk_keys() + layer.attention.vo_keys() + layer.ffn.keys()


def pairwise_sq(states: list[Mapping], keys=None) -> float:
    """sum_{i<j} |X_i - X_j|^2 over `keys` (default: every floating tensor), as k sum_i |X_i - mean|^2."""
    keys = keys if keys is not None else [k for k, v in states[0].items() if v.is_floating_point()]
    total = 0.0
    for key in keys:
        for block in float64_blocks(*(s[key] for s in states)):
            stack = torch.stack(block)                                   # (k, block)
            total += len(states) * (stack - stack.mean(dim=0)).pow(2).sum().item()
    return total


def pairwise_distances(states: list[Mapping]) -> list[float]:
    """|X_i - X_j| over every floating tensor, for i < j in order (0,1), (0,2), ..., (k-2,k-1)."""
    return [distance(states[i], states[j])["total"] for i in range(len(states)) for j in range(i + 1, len(states))]


def part_costs(moved: Mapping, target: Mapping, layout: ModelLayout, index: int) -> dict[str, torch.Tensor]:
    """|moved - target|^2 per part: qk (H,), vo (H,) per head; ffn (1,)."""
    att, ffn, heads = layout.layers[index].attention, layout.layers[index].ffn, layout.num_heads

    def sq(key) -> torch.Tensor:
        return (moved[key] - target[key]).double().pow(2)
    qk = sum(sq(k).reshape(heads, -1).sum(dim=1) for k in att.qk_keys())
    vo = sum(sq(k).reshape(heads, -1).sum(dim=1) for k in att.value.keys())
    out = sq(att.output.weight)
    vo = vo + out.reshape(out.shape[0], heads, -1).sum(dim=(0, 2))
    return {"qk": qk, "vo": vo, "ffn": sum(sq(k).sum() for k in ffn.keys()).reshape(1)}


def select_layer(current: LayerTransform, candidate: LayerTransform, better: dict) -> LayerTransform:
    """Per head (and for the FFN as a whole) the candidate where better[part] is True. Dense inputs."""
    def pick(part, cur, cand):                         # better[part]: (H,) bool, broadcast over (H, d, d)
        return torch.where(better[part].reshape(-1, *([1] * (cur.dim() - 1))), cand, cur)
    return LayerTransform(
        r_qk=pick("qk", current.r_qk, candidate.r_qk), a_qk=pick("qk", current.a_qk, candidate.a_qk),
        r_vo=pick("vo", current.r_vo, candidate.r_vo), a_vo=pick("vo", current.a_vo, candidate.a_vo),
        ffn_perm=candidate.ffn_perm if bool(better["ffn"]) else current.ffn_perm,
    )


# ---------------------------------------------------------------- one layer, all models

@dataclass
class _LayerProblem:
    """One layer of k models, in float64: the original tensors and the current dense transforms."""

    layout: ModelLayout
    index: int
    views: list[dict]                 # per model: key -> float64 tensor (this layer's keys only)
    transforms: list[LayerTransform]  # per model: dense

    def moved(self, m: int) -> dict:
        return apply_transform(self.views[m], self.layout, Transform({self.index: self.transforms[m]}))

    def mean_of_others(self, moved: list[dict], m: int) -> dict:
        others = [x for j, x in enumerate(moved) if j != m]
        return {key: sum(x[key] for x in others) / len(others) for key in moved[m]}


def _update_model(problem: _LayerProblem, moved: list[dict], m: int, config: MatchConfig, clock) -> None:
    """Match model m onto the mean of the others; keep the candidate where it is closer."""
    target = problem.mean_of_others(moved, m)
    layout, index = problem.layout, problem.index
    found = match_layer(problem.views[m], target, layout, index, config, clock)
    candidate = dense_layer(found, layout.num_heads, layout.head_dim, layout.ffn_size)
    trial = apply_transform(problem.views[m], layout, Transform({index: candidate}))
    cost_now, cost_new = part_costs(moved[m], target, layout, index), part_costs(trial, target, layout, index)
    better = {part: cost_new[part] < cost_now[part] for part in cost_now}
    problem.transforms[m] = select_layer(problem.transforms[m], candidate, better)
    moved[m] = problem.moved(m)


def refine_layer(problem: _LayerProblem, config: MatchConfig, max_iter: int, tol: float, clock) -> list[float]:
    """Sweep over the models until the layer's pairwise sum stops decreasing; keeps the best sweep.

    Returns the objective after initialisation and after each sweep (as computed, not clipped).
    """
    anchor_config = replace(config, rescale=False, joint=False)   # the anchor's scales stay 1
    moved = [problem.moved(m) for m in range(len(problem.views))]
    history = [pairwise_sq(moved)]
    best, best_value = list(problem.transforms), history[0]
    for _ in range(max_iter):
        for m in range(len(moved)):
            _update_model(problem, moved, m, anchor_config if m == 0 else config, clock)
        history.append(pairwise_sq(moved))
        if history[-1] < best_value:
            best, best_value = list(problem.transforms), history[-1]
        if history[-2] - history[-1] <= tol * abs(history[-2]):
            break
    problem.transforms = best
    return history


# ---------------------------------------------------------------- public API

@dataclass
class GroupMatchResult:
    transforms: list[Transform]               # one per model; models[0] (the anchor) gets the identity
    info: dict = field(default_factory=dict)  # iterations, objective per iteration, pairwise sums before/after


def _check_inputs(states: list, method: str) -> None:
    if len(states) < 2:
        raise SymfusionError(f"multi-model matching needs at least 2 models, got {len(states)}")
    if method not in METHODS:
        raise SymfusionError(f"unknown multi-model matching method {method!r}; choose one of {', '.join(METHODS)}")


def _barycenter(states, layout, config, indices, max_iter, tol, clock):
    """Anchor matching, then per-layer refinement; returns (transforms, per-layer histories)."""
    initial = match_many(states[1:], states[0], layout, config, layers=indices)
    starts = [Transform()] + [r.transform for r in initial]
    heads, d, ffn = layout.num_heads, layout.head_dim, layout.ffn_size
    transforms, histories = [Transform() for _ in states], {}
    for index in indices:
        keys = layer_keys(layout, index)
        views = [{k: s[k].double() for k in keys} for s in states]
        dense = [dense_layer(t.layers.get(index), heads, d, ffn) for t in starts]
        problem = _LayerProblem(layout, index, views, dense)
        histories[index] = refine_layer(problem, config, max_iter, tol, clock)
        back = invert_layer(problem.transforms[0])
        for m in range(1, len(states)):
            layer = sparse_layer(compose_layer(problem.transforms[m], back), config)
            if not layer.is_identity():
                transforms[m].layers[index] = layer
    return transforms, histories


def _summed_history(histories: dict[int, list[float]]) -> list[float]:
    """Per-iteration objective of the whole model: layers that stopped early keep their last value."""
    if not histories:
        return [0.0]
    length = max(len(h) for h in histories.values())
    return [sum(h[min(t, len(h) - 1)] for h in histories.values()) for t in range(length)]


@torch.no_grad()
def match_group(
    states: list[Mapping[str, torch.Tensor]],
    layout: ModelLayout,
    config: MatchConfig | str = "rotation",
    method: str = "anchor",
    max_iter: int = 50,
    tol: float = 1e-10,
    layers=None,
    last_layers: int | None = None,
) -> GroupMatchResult:
    """Transforms moving k models (states[0] = anchor, left unchanged) close to each other.

    method="anchor": every model matched onto states[0] (exactly `match_many`).
    method="barycenter": then alternately every model onto the mean of the others.
    """
    _check_inputs(states, method)
    if method == "barycenter":        # its group operations (compose, invert) know no head permutations
        layout.require_encoder("barycentric group matching")
    config = matching_config(config) if isinstance(config, str) else config
    indices = resolve_layers(layout.num_layers, layers, last_layers)
    clock = StageClock()
    if method == "anchor":
        results = match_many(states[1:], states[0], layout, config, layers=indices)
        transforms = [Transform()] + [r.transform for r in results]
        histories = {}
    else:
        transforms, histories = _barycenter(states, layout, config, indices, max_iter, tol, clock)
    moved = [apply_transform(s, layout, t) for s, t in zip(states, transforms)]
    keys = [k for i in indices for k in layer_keys(layout, i)]
    objective = _summed_history(histories) if histories else [pairwise_sq(moved, keys)]
    info = {
        "method": method, "k": len(states), "layers": indices,
        "iterations": max((len(h) - 1 for h in histories.values()), default=0),
        "iterations_by_layer": {i: len(h) - 1 for i, h in histories.items()},
        "objective": objective,                          # matched tensors only; [0] = anchor matching
        "pairwise_sq_before": pairwise_sq(states), "pairwise_sq_after": pairwise_sq(moved),
        "pairwise_distance_sum_before": sum(pairwise_distances(states)),
        "pairwise_distance_sum_after": sum(pairwise_distances(moved)),
        "seconds_by_stage": dict(clock.seconds),
    }
    return GroupMatchResult(transforms=transforms, info=info)
