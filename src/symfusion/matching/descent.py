"""The coordinate descent of whole-group matching: discrete block parts by block solves, continuous parts to a fixed point.

Both models are folded and canonical (stream.py); the distance is D(R, B) = |B R fs - fa| over R in the residual
group and the block transforms B (head permutations, Q/K and V/O rotations, scales, FFN permutations). With the
discrete parts of B fixed (head and FFN permutations applied to fs), only the attention tensors A move with the
continuous parts, so for an orthogonal R (or a signed permutation)
    D^2 = |X|^2 + |Y|^2 - 2 <R, M_rest> - 2 <|R|, G_rest> + sum over layers |B_l R A_s,l - A_a,l|^2
(X, Y: every other tensor; M_rest, G_rest: their cross products, residual.py) and the descent runs in two loops:
- inner (continuous, float64): R <- argmax <R, M(B)> + <|R|, G(B)> (exact), then each layer's rotations and scales
  re-solved at R (kept where closer), until R moves by at most TOL (largest entry); the R sequence is
  Anderson-accelerated (orthogonal groups), an accelerated step kept only where it lowers D;
- outer (discrete): the full block solves at the inner loop's R (heads, rotations, scales, FFN permutation), each
  layer keeping the closer of its new and its inner transform. When no layer's discrete parts change, (R, B) is a
  fixed point of the whole alternation: converged. Otherwise the inner loop runs again from the new parts.
D never rises; the descent also stops after MAX_OUTER block solves (then converged is false).

A pair (StatePair here, sharded_whole's streamed folders) gives the folded canonical tensors by part: `outside`
(source, anchor) and `layer(i)`; `weights` scales each tensor before matching (weighted_pair).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import numpy as np
import torch

from symfusion.arch import ModelLayout
from symfusion.errors import SymfusionError
from symfusion.families import FAMILIES
from symfusion.matching.compose import MatchConfig, StageClock, match_attention_layers, match_blocks
from symfusion.matching.joint import head_objective, qk_norms, vo_norms
from symfusion.matching.permutation import ffn_cross, max_assignment
from symfusion.matching.rescale import best_scales
from symfusion.matching.residual import project_to_group, residual_cross, solve_residual
from symfusion.matching.rotation import frobenius_inner, procrustes, qk_cross_parts, qk_procrustes, vo_cross_parts
from symfusion.measures import squared_difference
from symfusion.stream import StreamLayout, rotate_stream
from symfusion.symmetry import LayerTransform, apply_blocks

TOL = 1e-9             # the inner loop stops when R moves by at most this (largest entry, float64)
LOOSE = 1e-3           # ... and while the discrete parts may still change, at most this
MAX_INNER = 500        # continuous steps per inner loop
MAX_OUTER = 20         # block solves
ANDERSON = 5           # Anderson acceleration: past steps mixed
DISCRETE = ("head_perm", "ffn_perm")


def layer_prefix(layout: ModelLayout, index: int) -> str:
    """The state-dict prefix of layer `index` ("model.layers.3."), from its output map's key."""
    key = layout.layers[index].attention.output.weight
    return key[: key.index(f".{index}.") + len(f".{index}.")]


class StatePair:
    """Folded canonical source and anchor states split into the tensors of each layer and those outside them."""

    def __init__(self, fs: Mapping[str, torch.Tensor], fa: Mapping[str, torch.Tensor], layout: ModelLayout,
                 stream: StreamLayout, weights: Mapping[str, float] | None = None):
        self.layout, self.stream = layout, stream
        fs, fa = weighted(fs, weights), weighted(fa, weights)
        prefixes = [layer_prefix(layout, i) for i in range(layout.num_layers)]
        self._layers = [({k: v for k, v in fs.items() if k.startswith(p)}, {k: v for k, v in fa.items() if k.startswith(p)})
                        for p in prefixes]
        inside = {k for part, _ in self._layers for k in part}
        self.outside = ({k: v for k, v in fs.items() if k not in inside}, {k: v for k, v in fa.items() if k not in inside})

    def layer(self, i: int) -> tuple[dict, dict]:
        return self._layers[i]


def weighted(state: Mapping[str, torch.Tensor], weights: Mapping[str, float] | None) -> dict:
    """Each tensor times its weight (a symmetry commutes with a scalar per tensor: the weighted distance)."""
    if not weights:
        return dict(state)
    return {k: v * weights[k] if k in weights else v for k, v in state.items()}


def fan_in_weights(state: Mapping[str, torch.Tensor], layout: ModelLayout, stream: StreamLayout) -> dict[str, float]:
    """1 / sqrt(fan-in) for every map (canonical (out, in, ...): the product of its input dims), as Generalized LMC
    weighs its weight blocks; vectors and tables (embeddings, positions, class token) keep 1."""
    spec = FAMILIES[layout.family]
    weights = {}
    for key, tensor in state.items():
        if not tensor.is_floating_point() or tensor.dim() < 2 or _is_table(spec, key, layout):
            continue
        weights[key] = math.prod(tensor.shape[1:]) ** -0.5
    return weights


def _is_table(spec, key: str, layout: ModelLayout) -> bool:
    in_layers = any(key.startswith(layer_prefix(layout, i)) for i in range(layout.num_layers))
    if in_layers:
        return False
    try:
        return spec.stream_position_of(key) in ("embeddings", "class_token", "positions")
    except SymfusionError:      # keys the family places nowhere (task heads) are maps
        return False


# ---------------------------------------------------------------- the outer step: block solves

def discrete_parts(blocks: Mapping[int, LayerTransform]) -> dict:
    """The permutations of each layer's transform, as lists (None: identity)."""
    return {i: tuple(None if getattr(t, n) is None else getattr(t, n).tolist() for n in DISCRETE)
            for i, t in blocks.items()}


@dataclasses.dataclass
class FFNMargin:
    """What certifies a layer's FFN permutation at a later R without its cross product: the map R it was found
    at, the permutation (the row argmax of C, so optimal), the least gap between a row's largest and second
    largest entry, and the bound on |dC| per unit |dR|_2 (max_j |a_j| max_k |s_k| summed over the FFN's maps)."""

    r: torch.Tensor
    perm: torch.Tensor
    margin: float
    bound: float
    slack: float        # float32 rounding of C


def ffn_solve(moved: Mapping, fa: Mapping, ffn, r: torch.Tensor, memo: FFNMargin | None,
              source: Mapping) -> tuple[torch.Tensor, FFNMargin | None]:
    """The FFN permutation at R, skipping the cross product when `memo` certifies it: C(R) differs from the cross
    product it was found on by at most |R - memo.r|_2 * bound per entry, so while that stays under half the margin
    every row's argmax, a permutation and hence the optimum, stays (`source`: the unmoved source, whose neuron
    norms bound the change)."""
    if memo is not None:
        change = float(torch.linalg.matrix_norm(r - memo.r, ord=2))
        if 2 * (change * memo.bound + memo.slack) < memo.margin:
            return memo.perm, memo
    cross = ffn_cross(moved, fa, ffn)                                             # (ffn, ffn) float32
    perm = max_assignment(cross)
    if not torch.equal(torch.from_numpy(cross.argmax(axis=1)), perm):
        return perm, None                                                         # the solver ran: no certificate
    top = np.partition(cross, -2, axis=1)[:, -2:]                                 # (ffn, 2)
    maps = [(ffn.input.weight, 1), (ffn.output.weight, 0)] + ([(ffn.gate.weight, 1)] if ffn.gate else [])
    bound = sum(float(fa[k].double().norm(dim=dim).max() * source[k].double().norm(dim=dim).max()) for k, dim in maps)
    inner = sum(fa[k].shape[dim] for k, dim in maps)
    return perm, FFNMargin(r.clone(), perm, float((top[:, 1] - top[:, 0]).min()), bound, 4 * inner * 2.0 ** -24 * bound)


def block_pass(pair, r: torch.Tensor, config: MatchConfig, previous: Mapping[int, LayerTransform] | None,
               clock: StageClock, memos: dict | None = None) -> tuple[dict[int, LayerTransform], float]:
    """Each layer's block solve on R fs, kept only where closer than `previous` (the distance separates over
    layers once R is fixed); (the chosen transforms, D^2 with them). `memos` (layer -> FFNMargin) carries the
    certificates of FFN permutations between passes."""
    stream, layout = pair.stream, pair.layout
    src_out, anc_out = pair.outside
    squared = _squared(rotate_stream(src_out, stream, r), anc_out)
    certified = memos is not None and config.ffn == "permutation"
    attention_only = dataclasses.replace(config, ffn="none") if certified else config
    blocks = {}
    for i in range(layout.num_layers):
        fs, fa = pair.layer(i)
        moved = rotate_stream(fs, stream, r)
        found = match_blocks(moved, fa, layout, attention_only, layers=[i], clock=clock, canonical=True).transform.layers
        found = found.get(i, LayerTransform())
        if certified:
            with clock("ffn"):
                found.ffn_perm, memos[i] = ffn_solve(moved, fa, layout.layers[i].ffn, r, memos.get(i), fs)
        candidates = [found] + ([previous[i]] if previous is not None else [])
        distances = [_squared(apply_blocks(moved, layout, {i: c}), fa) for c in candidates]
        k = min(range(len(candidates)), key=distances.__getitem__)
        blocks[i] = candidates[k]
        squared += distances[k]
    return blocks, squared


def parts(pair):
    """(None, the tensors outside the layers), then (i, layer i's tensors), each as (source, anchor)."""
    yield (None, *pair.outside)
    for i in range(pair.layout.num_layers):
        yield (i, *pair.layer(i))


def paper_lower_bound(parts, layout: ModelLayout) -> float:
    """A lower bound on |B fs - fa| over every block transform B (R = I) from norms alone: the tensors no block moves
    exactly, each FFN by |x - y| >= ||x| - |y|| per neuron with the neurons' norms paired in sorted order (the
    least sum over permutations, by the rearrangement inequality), attention maps by 0. parts: (layer or None,
    source tensors, anchor tensors)."""
    squared = 0.0
    for i, fs, fa in parts:
        moved = set() if i is None else set(layout.layer_keys(i))
        squared += _squared(fs, {k: v for k, v in fa.items() if k not in moved})
        if i is not None:
            norms = [_neuron_norms(state, layout.layers[i].ffn) for state in (fs, fa)]
            squared += float(((norms[0].sort().values - norms[1].sort().values) ** 2).sum())
    return math.sqrt(squared)


def _neuron_norms(state: Mapping, ffn) -> torch.Tensor:
    """Each FFN neuron's norm over its input row (and bias), gate row (and bias) and output column, (ffn,) float64."""
    squared = state[ffn.output.weight].double().pow(2).sum(0)
    for proj in (ffn.input, ffn.gate) if ffn.gate else (ffn.input,):
        squared = squared + state[proj.weight].double().pow(2).sum(1)
        if proj.bias:
            squared = squared + state[proj.bias].double().pow(2)
    return squared.sqrt()


def distance_of(pair, r: torch.Tensor, blocks: Mapping[int, LayerTransform]) -> float:
    """D(R, B) = |B R fs - fa| over every part of the pair."""
    src_out, anc_out = pair.outside
    squared = _squared(rotate_stream(src_out, pair.stream, r), anc_out)
    for i in range(pair.layout.num_layers):
        fs, fa = pair.layer(i)
        moved = rotate_stream(fs, pair.stream, r)
        squared += _squared(apply_blocks(moved, pair.layout, {i: blocks[i]} if i in blocks else {}), fa)
    return math.sqrt(squared)


def _squared(state: Mapping[str, torch.Tensor], anchor: Mapping[str, torch.Tensor]) -> float:
    return math.fsum(squared_difference(state[k], t) for k, t in anchor.items() if t.is_floating_point())


# ---------------------------------------------------------------- the inner loop: continuous parts

@dataclasses.dataclass
class _Fixed:
    """What the inner loop holds with the discrete parts fixed: the attention tensors (float64, source with its
    heads permuted), the other tensors' cross products and squared norms, and tensors with two residual axes."""

    attention_source: dict
    attention_anchor: dict
    m: torch.Tensor
    g: torch.Tensor
    quadratic: tuple[dict, dict]
    constant: float     # sum of |x|^2 + |y|^2 over the tensors M and G hold, |x - y|^2 over those R does not move


def _fixed_parts(pair, blocks: Mapping[int, LayerTransform]) -> _Fixed:
    layout, stream = pair.layout, pair.stream
    d = stream.hidden
    m, g = torch.zeros(d, d, dtype=torch.float64), torch.zeros(d, d, dtype=torch.float64)
    constant, att_s, att_a, quad_s, quad_a = 0.0, {}, {}, {}, {}
    two_axes = {k for k, axes in stream.axes if len(axes) > 1}
    crossed = {k for k, _ in stream.axes if k not in stream.folded} - two_axes
    parts = [(None, *pair.outside)] + [(i, *pair.layer(i)) for i in range(layout.num_layers)]
    for i, fs, fa in parts:
        fs = dict(fs)
        if i is not None:
            t = blocks[i]
            fs = apply_blocks(fs, layout, {i: LayerTransform(head_perm=t.head_perm, ffn_perm=t.ffn_perm)})
            att = layout.layers[i].attention
            for k in att.qk_keys() + att.vo_keys():
                att_s[k], att_a[k] = fs.pop(k).double(), fa[k].double()
        for k in two_axes & set(fa):
            quad_s[k], quad_a[k] = fs.pop(k).double(), fa[k].double()
        fa = {k: v for k, v in fa.items() if k not in att_s and k not in quad_s and v.is_floating_point()}
        part_m, part_g = residual_cross(fs, fa, stream)
        m, g = m + part_m, g + part_g
        constant += math.fsum(x.double().pow(2).sum().item() + fs[k].double().pow(2).sum().item()
                              if k in crossed else squared_difference(fs[k], x) for k, x in fa.items())
    return _Fixed(att_s, att_a, m, g, (quad_s, quad_a), constant)


def _continuous_solve(fixed: _Fixed, pair, r: torch.Tensor, current: dict[int, LayerTransform], config: MatchConfig,
                      clock: StageClock, sweeps: int = 1) -> tuple[dict[int, LayerTransform], float, torch.Tensor, torch.Tensor]:
    """At R: the rotations and scales re-solved (kept where closer than `current`); (them, D^2, M, G)."""
    layout, stream = pair.layout, pair.stream
    moved = rotate_stream(fixed.attention_source, stream, r)
    if config.attention == "rotation" and not config.joint:
        chosen, squared = warm_attention(moved, fixed.attention_anchor, layout, current, config.rescale, clock, sweeps)
    else:
        chosen, squared = _attention_solve(moved, fixed.attention_anchor, layout, current, config, clock)
    with clock("residual"):
        m, g = residual_cross(apply_blocks(fixed.attention_source, layout, chosen), fixed.attention_anchor, stream)
        quad_s, quad_a = fixed.quadratic
        quad_m, quad_g = residual_cross(quad_s, quad_a, stream, current=r)
        m, g = m + fixed.m + quad_m, g + fixed.g + quad_g
        squared += fixed.constant - 2 * float((r * fixed.m).sum() + (r.abs() * fixed.g).sum())
        if quad_a:
            squared += _squared(rotate_stream(quad_s, stream, r), quad_a)
    return chosen, squared, m, g


def _attention_solve(moved: Mapping, anchor: Mapping, layout: ModelLayout, current: Mapping[int, LayerTransform],
                     config: MatchConfig, clock: StageClock) -> tuple[dict[int, LayerTransform], float]:
    """The configured attention solve of every layer at R, each layer kept where closer than `current`."""
    indices = list(range(layout.num_layers))
    found = match_attention_layers(moved, anchor, layout, indices, dataclasses.replace(config, heads=False), clock)
    chosen, squared = {}, 0.0
    for i in indices:
        att = layout.layers[i].attention
        keys = att.qk_keys() + att.vo_keys()
        part, target = {k: moved[k] for k in keys}, {k: anchor[k] for k in keys}
        candidates = [found[i]] + ([current[i]] if i in current else [])
        distances = [_squared(apply_blocks(part, layout, {i: c}), target) for c in candidates]
        k = min(range(len(candidates)), key=distances.__getitem__)
        chosen[i], squared = candidates[k], squared + distances[k]
    return chosen, squared


def warm_attention(source: Mapping, anchor: Mapping, layout: ModelLayout, current: Mapping[int, LayerTransform],
                   rescale: bool, clock: StageClock, sweeps: int = 1) -> tuple[dict[int, LayerTransform], float]:
    """One exact step per side and KV head from its current scale a (heads already permuted): the rotation
    argmax <R, a C_up + C_down / a>, then the scale for that rotation (eq. 12), each head keeping the closer of
    this and its current (rotation, scale) - block coordinate descent, so the inner loop converges to a joint
    optimum of rotations and scales (the first step from a = 1 is the paper's). Returns them and their squared
    distance f = A a^2 - 2 a <R, C_up> + D / a^2 - 2 <R, C_down> / a + const (matching/joint.py) summed."""
    heads, atts = layout.num_heads, [layer.attention for layer in layout.layers]
    kv, n = heads // atts[0].group, len(atts)
    found, squared = {i: LayerTransform() for i in range(n)}, 0.0
    sides = (("qk", qk_cross_parts, qk_norms, lambda c: qk_procrustes(c, atts[0])), ("vo", vo_cross_parts, vo_norms, procrustes))
    for side, cross_parts, norms, solver in sides:
        with clock(side):
            up, down = (torch.cat(c) for c in zip(*(cross_parts(source, anchor, att, heads) for att in atts)))
            norm_up, norm_down = (torch.cat(x) for x in zip(*(norms(source, att, heads) for att in atts)))
            const = torch.cat([sum(norms(anchor, att, heads)) for att in atts])
            a_now = torch.cat([_part(current.get(i), f"a_{side}", kv, None) for i in range(n)])
            r_now = torch.cat([_part(current.get(i), f"r_{side}", kv, up.shape[-1]) for i in range(n)])
            a_new = a_now
            for _ in range(sweeps if rescale else 1):
                r_new = solver(a_new[:, None, None] * up + down / a_new[:, None, None])  # (layers * kv, d, d)
                a_new = best_scales(norm_up, frobenius_inner(r_new, up), norm_down, frobenius_inner(r_new, down)) \
                    if rescale else torch.ones_like(a_now)
            f_new = head_objective(r_new, a_new, norm_up, norm_down, up, down, const)
            f_now = head_objective(r_now, a_now, norm_up, norm_down, up, down, const)
            keep = f_now < f_new
            r_new, a_new = torch.where(keep[:, None, None], r_now, r_new), torch.where(keep, a_now, a_new)
            squared += float(torch.minimum(f_now, f_new).sum())
        for i, (r_i, a_i) in enumerate(zip(r_new.split(kv), a_new.split(kv))):
            setattr(found[i], f"r_{side}", r_i.clone())
            setattr(found[i], f"a_{side}", a_i.clone() if rescale else None)
    return found, squared


def _part(t: LayerTransform | None, name: str, kv: int, d: int | None) -> torch.Tensor:
    """A layer's scales (kv,) or rotations (kv, d, d) in float64, ones or identities where it has none."""
    value = None if t is None else getattr(t, name)
    if value is not None:
        return value.to(torch.float64)
    return torch.ones(kv, dtype=torch.float64) if d is None else torch.eye(d, dtype=torch.float64).expand(kv, d, d)


def continuous(pair, group: str, r: torch.Tensor | None, blocks: Mapping[int, LayerTransform], config: MatchConfig,
               clock: StageClock, tol: float = TOL) -> tuple[torch.Tensor, dict[int, LayerTransform], float, dict]:
    """The inner loop from `blocks` (r: the map they were solved at, None when it was no group element):
    (R, blocks with their continuous parts at the fixed point, D, info)."""
    fixed = _fixed_parts(pair, blocks)
    continuous_parts = {i: dataclasses.replace(t, head_perm=None, ffn_perm=None) for i, t in blocks.items()}
    if r is None:                                   # the first R from the blocks found at a start outside the group
        with clock("residual"):
            m, g = residual_cross(apply_blocks(fixed.attention_source, pair.layout, continuous_parts),
                                  fixed.attention_anchor, pair.stream)
            r = solve_residual(m + fixed.m, group, g + fixed.g)
    current, squared, m, g = _continuous_solve(fixed, pair, r, continuous_parts, config, clock)
    accelerated, steps, converged, trace = 0, 0, False, []
    xs, fs_ = [], []
    while steps < MAX_INNER:
        with clock("residual"):
            plain = solve_residual(m, group, g)
        step = (plain - r).abs().max().item()
        trace.append((step, math.sqrt(max(squared, 0.0))))
        if step <= tol:
            converged = True
            break
        steps += 1
        candidate = None
        if ANDERSON and group.startswith("orthogonal"):
            xs, fs_ = (xs + [r.flatten()])[-(ANDERSON + 1):], (fs_ + [(plain - r).flatten()])[-(ANDERSON + 1):]
            if len(xs) > 1:
                candidate = project_to_group(_anderson(xs, fs_).reshape(r.shape), group)
        taken = None
        if candidate is not None:
            found = _continuous_solve(fixed, pair, candidate, current, config, clock)
            if found[1] < squared:
                taken, r_next = found, candidate
                accelerated += 1
            else:
                xs, fs_ = [], []
        if taken is None:
            taken, r_next = _continuous_solve(fixed, pair, plain, current, config, clock), plain
        current, squared, m, g = taken
        r = r_next
    found = {i: dataclasses.replace(current[i], head_perm=blocks[i].head_perm, ffn_perm=blocks[i].ffn_perm)
             for i in blocks}
    return r, found, math.sqrt(max(squared, 0.0)), {"steps": steps, "accelerated": accelerated, "converged": converged, "trace": trace}


def _anderson(xs: list[torch.Tensor], fs: list[torch.Tensor]) -> torch.Tensor:
    """Anderson's mixing of the plain steps g_k = x_k + f_k: the combination whose residual is least squares."""
    f = torch.stack(fs, 1)
    g = torch.stack([x + s for x, s in zip(xs, fs)], 1)
    df, dg = f[:, 1:] - f[:, :-1], g[:, 1:] - g[:, :-1]
    gamma = torch.linalg.lstsq(df, f[:, -1:]).solution
    return (g[:, -1:] - dg @ gamma)[:, 0]


# ---------------------------------------------------------------- the descent

def descend(pair, group: str, r0: torch.Tensor, in_group: bool, config: MatchConfig,
            clock: StageClock) -> tuple[torch.Tensor, dict[int, LayerTransform], float, dict]:
    """The descent from the map r0 (in_group: whether r0 is a group element; a soft start is not):
    (R, blocks, folded distance, info)."""
    config, memos = config.blocks(), {}
    with clock("blocks"):
        blocks, _ = block_pass(pair, r0, config, None, clock, memos)
    r, history, inner, converged, solves, tol = (r0 if in_group else None), [], [], False, 1, LOOSE
    for outer in range(MAX_OUTER):
        r, blocks, dist, info = continuous(pair, group, r, blocks, config, clock, tol)
        history.append(dist)
        inner.append(info)
        if outer == MAX_OUTER - 1:
            break
        with clock("blocks"):
            found, _ = block_pass(pair, r, config, blocks, clock, memos)
        solves += 1
        if discrete_parts(found) == discrete_parts(blocks):
            if tol == TOL:
                converged = True
                break
            tol = TOL                    # the discrete parts hold at the loose point: now to the fixed point
            continue
        blocks = found
    return r, blocks, history[-1], {"descent": history, "inner": inner, "converged": converged,
                                    "block_solves": solves}
