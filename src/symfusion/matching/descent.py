"""The coordinate descent of whole-group matching: discrete block parts by block solves, continuous parts to a fixed point.

Both models are folded and canonical (stream.py); the distance is D(R, B) = |B R fs - fa| over R in the residual
group and the block transforms B (head permutations, Q/K and V/O rotations, scales, FFN permutations), measured
over a pair (matching/pairs.py). The descent alternates
- the block solves at R (heads, rotations, scales, FFN permutation; matching/compose.py), a layer taking its new
  transform only where it changes a discrete part and is closer;
- the inner loop (matching/continuous.py): R and the continuous parts to a fixed point (to TOL) with the discrete
  parts fixed. (Every loop runs to TOL: stopping loose, at 1e-3, while the discrete parts might still change, let
  a 1e-7 rounding of the source stop the loop an iteration earlier or later, 6e-3 away in R, and flip near-tied
  FFN neurons in the next block solve.)
When a block solve at the inner loop's fixed point changes no discrete part, (R, B) is a fixed point of the whole
alternation: converged. An inner loop stopped by its step cap (MAX_INNER) is no fixed point: where the block solve
then changes nothing, the next inner loop goes on from its R. D never rises; the descent also stops after
MAX_OUTER block solves (converged: false).
A block solve reuses a layer's FFN permutation (and, for multi-head attention, its head permutation) without
forming its cross products when R has moved too little to change it: the previous solve's row-argmax margin
exceeds twice the largest change |dR|_2 can cause (Margin) - an exact shortcut. And an inner loop that converges
without a step leaves R where the last block solve found the discrete parts, so that solve, repeated at the same R,
would return them again: the descent stops there, converged, without repeating it (another exact shortcut).
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np
import torch

from symfusion.errors import steps
from symfusion.matching.compose import MatchConfig, StageClock, match_attention_layers, match_layer_ffn
from symfusion.matching.heads import head_scores, pair_crosses, rotation_values
from symfusion.matching.continuous import TOL, continuous
from symfusion.matching.pairs import squared_distance
from symfusion.matching.starts import completed_start
from symfusion.matching.permutation import ffn_cross, max_assignment
from symfusion.stream import rotate_stream
from symfusion.symmetry import LayerTransform, apply_blocks, permute_heads

MAX_OUTER = 20         # block solves
DISCRETE = ("head_perm", "ffn_perm")


def discrete_parts(blocks: Mapping[int, LayerTransform]) -> dict:
    """The permutations of each layer's transform, as lists (None: identity)."""
    return {i: tuple(None if getattr(t, n) is None else getattr(t, n).tolist() for n in DISCRETE)
            for i, t in blocks.items()}


@dataclasses.dataclass
class Margin:
    """What certifies an assignment at a later R without its score matrix: the map R it was found at, the
    assignment (each row's argmax, so optimal), the least gap between a row's largest and second largest score,
    the bound on a score's change per unit |dR|_2, and the float32 rounding of the scores."""

    r: torch.Tensor
    perm: torch.Tensor | None
    margin: float
    bound: float
    slack: float = 0.0

    def holds(self, r: torch.Tensor, norms: dict) -> bool:
        """Whether every score at r is within half the margin of its value at self.r (then every row's argmax,
        hence the assignment, stays); `norms` caches |r - self.r|_2 by the map self.r."""
        key = id(self.r)
        if key not in norms:
            norms[key] = float(torch.linalg.matrix_norm(r - self.r, ord=2))
        return 2 * (norms[key] * self.bound + self.slack) < self.margin


def greedy_margin(scores: np.ndarray, perm: torch.Tensor) -> float | None:
    """The least gap between a row's largest and second largest score when the rows' argmax is `perm` (a
    permutation, hence the optimal assignment), else None."""
    if scores.shape[1] < 2 or not torch.equal(torch.from_numpy(scores.argmax(axis=1)), perm):
        return None
    top = np.partition(scores, -2, axis=1)[:, -2:]
    return float((top[:, 1] - top[:, 0]).min())


def ffn_solve(moved: Mapping, fa: Mapping, ffn, r: torch.Tensor, source: Mapping) -> tuple[torch.Tensor, Margin | None]:
    """The FFN permutation at R (paper eq. 7) and its certificate: C(R) changes by at most
    |dR|_2 (|a_in,j| |s_in,k| + |a_out,j| |s_out,k| (+ gate)) per entry (`source`: the unmoved source)."""
    cross = ffn_cross(moved, fa, ffn)                                             # (ffn, ffn) float32
    perm = max_assignment(cross)
    margin = greedy_margin(cross, perm)
    if margin is None:
        return perm, None
    maps = [(ffn.input.weight, 1), (ffn.output.weight, 0)] + ([(ffn.gate.weight, 1)] if ffn.gate else [])
    bound = sum(float(fa[k].double().norm(dim=dim).max() * source[k].double().norm(dim=dim).max()) for k, dim in maps)
    inner = sum(fa[k].shape[dim] for k, dim in maps)
    return perm, Margin(r, perm, margin, bound, 4 * inner * 2.0 ** -24 * bound)


def head_solve(moved: Mapping, fa: Mapping, att, heads: int, r: torch.Tensor,
               source: Mapping) -> tuple[torch.Tensor | None, Margin | None]:
    """Multi-head attention: the head permutation at R (heads.py, exact) and its certificate: a pair's value
    (nuclear norms or RoPE plane values of its Q/K and V/O cross products) changes by at most
    sqrt(d) |dC|_F <= sqrt(d) |dR|_2 sum over maps |W_s^h|_F |W_a^h'|_F."""
    c = pair_crosses(moved, fa, att, heads)
    scores = head_scores(c, rotation_values(att)).T.contiguous().numpy()         # (H_anchor, H_source)
    perm = max_assignment(scores)
    margin = greedy_margin(scores, perm)
    head_perm = None if torch.equal(perm, torch.arange(heads)) else perm
    if margin is None:
        return head_perm, None
    norms = [_head_norms(state, att, heads) for state in (source, fa)]            # (maps, H) each
    bound = (moved[att.value.weight].shape[0] // heads) ** 0.5 * float((norms[0].T @ norms[1]).max())
    return head_perm, Margin(r, head_perm, margin, bound, 4 * r.shape[0] * 2.0 ** -24 * bound)


def _head_norms(state: Mapping, att, heads: int) -> torch.Tensor:
    """Per head, the Frobenius norm of its rows of each reading map (biases included) and columns of the output map."""
    rows = [p for p in att.query_like + att.key_like + (att.value,)]
    norms = [(state[p.weight].double().reshape(heads, -1).pow(2).sum(1)
              + (state[p.bias].double().reshape(heads, -1).pow(2).sum(1) if p.bias else 0)).sqrt() for p in rows]
    output = state[att.output.weight].double()
    norms.append(output.reshape(output.shape[0], heads, -1).pow(2).sum((0, 2)).sqrt())
    return torch.stack(norms)


def block_pass(pair, r: torch.Tensor, config: MatchConfig, previous: Mapping[int, LayerTransform] | None,
               clock: StageClock, memos: dict | None = None) -> dict[int, LayerTransform]:
    """Each layer's block solve at R. The FFN permutation is the exact optimum at R; the attention part (heads,
    rotations, scales) replaces `previous` (the inner loop's transforms, at R) only where its head permutation
    differs and it is closer: with the same heads the inner loop's joint rotations and scales are at least as
    close as the solve's rotation-then-scale. `memos` (layer, part) -> Margin keeps certified permutations
    without their cross products."""
    stream, layout, memos, norms = pair.stream, pair.layout, {} if memos is None else memos, {}
    certify_ffn = config.ffn == "permutation"
    certify_heads = (config.permutes_heads(layout) and config.attention == "rotation" and layout.layers[0].attention.group == 1
                     and not config.joint)
    blocks = {}
    for i in steps(range(layout.num_layers), "block solves", "layer"):
        att, before = layout.layers[i].attention, None if previous is None else previous[i]
        ffn_memo, head_memo = memos.get((i, "ffn")), memos.get((i, "heads"))
        ffn_held = certify_ffn and ffn_memo is not None and ffn_memo.holds(r, norms)
        heads_held = certify_heads and head_memo is not None and head_memo.holds(r, norms)
        if before is not None and ffn_held and (heads_held or not config.permutes_heads(layout)):
            blocks[i] = before
            continue
        fs, fa = pair.layer(i)
        ffn_keys = frozenset() if config.ffn != "none" else frozenset(layout.layers[i].ffn.keys())
        moved = rotate_stream(fs, stream, r, skip=ffn_keys)            # the FFN maps only where they are solved
        if certify_heads:
            with clock("heads"):
                head_perm, memos[(i, "heads")] = (head_memo.perm, head_memo) if heads_held else \
                    head_solve(moved, fa, att, layout.num_heads, r, fs)
            if before is not None and _same(head_perm, before.head_perm):
                found = before
            else:
                permuted = dict(moved)
                if head_perm is not None:
                    permute_heads(permuted, att, head_perm)
                found = match_attention_layers(permuted, fa, layout, [i], dataclasses.replace(config, heads=False), clock)[i]
                found.head_perm = head_perm
        else:
            found = match_attention_layers(moved, fa, layout, [i], config, clock)[i]
        if before is not None and found is not before and not _same(found.head_perm, before.head_perm):
            keys = att.qk_keys() + att.vo_keys()
            part, target = {k: moved[k] for k in keys}, {k: fa[k] for k in keys}
            new, old = (squared_distance(apply_blocks(part, layout, {i: dataclasses.replace(t, ffn_perm=None)}), target)
                        for t in (found, before))
            found = found if new < old else before
        elif before is not None:
            found = before
        t = dataclasses.replace(found, ffn_perm=None)
        with clock("ffn"):
            if certify_ffn:
                t.ffn_perm, memos[(i, "ffn")] = (ffn_memo.perm, ffn_memo) if ffn_held else \
                    ffn_solve(moved, fa, layout.layers[i].ffn, r, fs)
            else:
                t.ffn_perm = match_layer_ffn(moved, fa, layout, i, config, StageClock())
        blocks[i] = t
    return blocks


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


def descend(pair, group: str, r0: torch.Tensor, in_group: bool, config: MatchConfig,
            clock: StageClock) -> tuple[torch.Tensor, dict[int, LayerTransform], float, dict]:
    """The descent from the map r0 (in_group: whether r0 is a group element; a soft start is not):
    (R, blocks, folded distance, info)."""
    config, memos, cache = config.blocks(), {}, {}
    if not in_group:            # a regularised start: completed by the attention blocks solved at it (starts.py)
        with clock("blocks"):
            attention = block_pass(pair, r0, dataclasses.replace(config, ffn="none"), None, clock)
        with clock("residual"):
            r0, in_group = completed_start(pair, group, attention), True
    with clock("blocks"):
        blocks = block_pass(pair, r0, config, None, clock, memos)
    r, history, inner, converged, solves = r0, [], [], False, 1
    for outer in steps(range(MAX_OUTER), "descent passes", "pass"):
        r, blocks, dist, info = continuous(pair, group, r, blocks, config, clock, TOL, cache)
        history.append(dist)
        inner.append(info)
        if outer == MAX_OUTER - 1:
            break
        if info["converged"] and info["steps"] == 0:     # R unmoved: the block solve at R is the one that gave these
            converged = True
            break
        with clock("blocks"):
            found = block_pass(pair, r, config, blocks, clock, memos)
        solves += 1
        if discrete_parts(found) == discrete_parts(blocks):
            if info["converged"]:
                converged = True
                break
            continue            # the same permutations, the inner loop at its cap: it goes on from R
        blocks = found
    return r, blocks, history[-1], {"descent": history, "inner": inner, "converged": converged,
                                    "block_solves": solves}
