"""The inner loop of whole-group matching: with the discrete block parts fixed, the continuous parts to a fixed point.

With the head and FFN permutations of the block transforms B applied to the folded source, only the attention
tensors A move with B's continuous parts (Q/K and V/O rotations, scales), so for an orthogonal R (or a signed
permutation)
    D^2 = |X|^2 + |Y|^2 - 2 <R, M_rest> - 2 <|R|, G_rest> + sum over layers |B_l R A_s,l - A_a,l|^2
(X, Y: every other tensor; M_rest, G_rest: their cross products, residual.py), and the loop alternates, in float64,
    R <- argmax <R, M(B)> + <|R|, G(B)>                                   (exact)
    each KV head's rotation <- argmax <Q, a C_up + C_down / a>, then its scale a for it (eq. 12)
                                                                          (exact block steps; kept where closer)
until R moves by at most TOL (largest entry): a fixed point of block coordinate descent on the joint objective
(or a step that no longer lowers D, where every head keeps its transform). The R sequence is Anderson-accelerated
(orthogonal groups, the last ANDERSON steps), an accelerated step kept only where it lowers D; D never rises.
(Riemannian L-BFGS on R, the heads solved at each R, took as many steps at ten times the cost per step.)
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import torch

from symfusion.arch import ModelLayout
from symfusion.matching.compose import MatchConfig, StageClock, match_attention_layers
from symfusion.matching.joint import head_objective, qk_norms, vo_norms
from symfusion.matching.pairs import squared_distance
from symfusion.matching.rescale import best_scales
from symfusion.matching.residual import project_to_group, residual_cross, solve_residual
from symfusion.matching.rotation import frobenius_inner, procrustes, qk_cross_parts, qk_procrustes, vo_cross_parts
from symfusion.measures import squared_difference
from symfusion.stream import rotate_stream
from symfusion.symmetry import LayerTransform, apply_blocks

TOL = 1e-9             # the loop stops when R moves by at most this (largest entry, float64)
MAX_INNER = 500        # steps per loop
ANDERSON = 5           # Anderson acceleration: past steps mixed


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


def _fixed_parts(pair, blocks: Mapping[int, LayerTransform], cache: dict) -> _Fixed:
    """The inner loop's fixed parts for these discrete parts; `cache` keeps each part's share for the last discrete
    parts it was formed with (the tensors outside the layers, and a layer whose permutations did not change, are
    not read again)."""
    layout, stream = pair.layout, pair.stream
    d = stream.hidden
    fixed = _Fixed({}, {}, torch.zeros(d, d, dtype=torch.float64), torch.zeros(d, d, dtype=torch.float64), ({}, {}), 0.0)
    for i in [None] + list(range(layout.num_layers)):
        key = None if i is None else tuple(None if x is None else tuple(x.tolist())
                                           for x in (blocks[i].head_perm, blocks[i].ffn_perm))
        if i is None:
            cache[i] = (key, outside_part(pair))
        elif i not in cache or cache[i][0] != key:
            cache[i] = (key, _fixed_part(pair, i, blocks.get(i)))
        part = cache[i][1]
        fixed.attention_source.update(part.attention_source)
        fixed.attention_anchor.update(part.attention_anchor)
        fixed.quadratic[0].update(part.quadratic[0])
        fixed.quadratic[1].update(part.quadratic[1])
        fixed.m, fixed.g, fixed.constant = fixed.m + part.m, fixed.g + part.g, fixed.constant + part.constant
    return fixed


def outside_part(pair) -> _Fixed:
    """The share of _Fixed of the tensors outside the layers, formed once per pair (pair.cache)."""
    if "outside" not in pair.cache:
        pair.cache["outside"] = _fixed_part(pair, None, None)
    return pair.cache["outside"]


def _fixed_part(pair, i: int | None, t: LayerTransform | None) -> _Fixed:
    """One part's share of _Fixed: layer i with its permutations applied (None: the tensors outside the layers)."""
    layout, stream = pair.layout, pair.stream
    two_axes = {k for k, axes in stream.axes if len(axes) > 1}
    crossed = {k for k, _ in stream.axes if k not in stream.folded} - two_axes
    att_s, att_a, quad_s, quad_a = {}, {}, {}, {}
    fs, fa = pair.outside if i is None else pair.layer(i)
    fs = dict(fs)
    if i is not None:
        fs = apply_blocks(fs, layout, {i: LayerTransform(head_perm=t.head_perm, ffn_perm=t.ffn_perm)})
        att = layout.layers[i].attention
        for k in att.qk_keys() + att.vo_keys():
            att_s[k], att_a[k] = fs.pop(k).double(), fa[k].double()
    for k in two_axes & set(fa):
        quad_s[k], quad_a[k] = fs.pop(k).double(), fa[k].double()
    fa = {k: v for k, v in fa.items() if k not in att_s and k not in quad_s and v.is_floating_point()}
    m, g = residual_cross(fs, fa, stream)
    constant = math.fsum(x.double().pow(2).sum().item() + fs[k].double().pow(2).sum().item()
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
            squared += squared_distance(rotate_stream(quad_s, stream, r), quad_a)
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
        distances = [squared_distance(apply_blocks(part, layout, {i: c}), target) for c in candidates]
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


def continuous(pair, group: str, r: torch.Tensor, blocks: Mapping[int, LayerTransform], config: MatchConfig,
               clock: StageClock, tol: float = TOL, cache: dict | None = None) -> tuple[torch.Tensor, dict[int, LayerTransform], float, dict]:
    """The inner loop from `blocks` solved at the group element r:
    (R, blocks with their continuous parts at the fixed point, D, info)."""
    fixed = _fixed_parts(pair, blocks, {} if cache is None else cache)
    continuous_parts = {i: dataclasses.replace(t, head_perm=None, ffn_perm=None) for i, t in blocks.items()}
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
    return r, found, math.sqrt(max(squared, 0.0)), {"steps": steps, "accelerated": accelerated, "converged": converged,
                                                    "trace": trace}


def _anderson(xs: list[torch.Tensor], fs: list[torch.Tensor]) -> torch.Tensor:
    """Anderson's mixing of the plain steps g_k = x_k + f_k: the combination whose residual is least squares."""
    f = torch.stack(fs, 1)
    g = torch.stack([x + s for x, s in zip(xs, fs)], 1)
    df, dg = f[:, 1:] - f[:, :-1], g[:, 1:] - g[:, :-1]
    # the normal equations (m x m, m <= ANDERSON): a tall lstsq (LAPACK's blocked QR) rounds differently with the
    # operands' memory placement, so the same input gave another fixed point; this GEMM and eigh do not
    gamma = torch.linalg.pinv(df.T @ df, hermitian=True) @ (df.T @ f[:, -1:])
    return (g[:, -1:] - dg @ gamma)[:, 0]


# ---------------------------------------------------------------- the descent

