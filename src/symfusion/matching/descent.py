"""The coordinate descent of whole-group matching: discrete block parts by block solves, continuous parts to a fixed point.

Both models are folded and canonical (stream.py); the distance is D(R, B) = |B R fs - fa| over R in the residual
group and the block transforms B (head permutations, Q/K and V/O rotations, scales, FFN permutations), measured
over a pair (matching/pairs.py). The descent alternates
- the block solves at R (heads, rotations, scales, FFN permutation; matching/compose.py), a layer taking its new
  transform only where it changes a discrete part and is closer;
- the inner loop (matching/continuous.py): R and the continuous parts to a fixed point with the discrete parts fixed,
  first to LOOSE while the discrete parts may still change, then to TOL.
When a block solve at the inner loop's fixed point changes no discrete part, (R, B) is a fixed point of the whole
alternation: converged. D never rises; the descent also stops after MAX_OUTER block solves (converged: false).
A block solve reuses a layer's FFN permutation (and, for multi-head attention, its head permutation) without
forming its cross products when R has moved too little to change it: the previous solve's row-argmax margin
exceeds twice the largest change |dR|_2 can cause (FFNMargin) - an exact shortcut.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np
import torch

from symfusion.matching.compose import MatchConfig, StageClock, match_blocks
from symfusion.matching.continuous import TOL, continuous
from symfusion.matching.pairs import squared_distance
from symfusion.matching.permutation import ffn_cross, max_assignment
from symfusion.stream import rotate_stream
from symfusion.symmetry import LayerTransform, apply_blocks

LOOSE = 1e-3           # the inner loop's tolerance while the discrete parts may still change
MAX_OUTER = 20         # block solves
DISCRETE = ("head_perm", "ffn_perm")


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
               clock: StageClock, memos: dict | None = None) -> dict[int, LayerTransform]:
    """Each layer's block solve on R fs. Against `previous` (the inner loop's transforms, at R): a layer takes its
    new transform only where it changes a discrete part and is closer (the distance separates over layers once R
    is fixed; with the discrete parts unchanged, the inner loop's joint rotations and scales are at least as
    close as the solve's). `memos` (layer -> FFNMargin) carries the FFN permutations' certificates."""
    stream, layout = pair.stream, pair.layout
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
        if previous is None:
            blocks[i] = found
        elif discrete_parts({i: found}) == discrete_parts({i: previous[i]}):
            blocks[i] = previous[i]
        else:
            new, old = (squared_distance(apply_blocks(moved, layout, {i: t}), fa) for t in (found, previous[i]))
            blocks[i] = found if new < old else previous[i]
    return blocks


def descend(pair, group: str, r0: torch.Tensor, in_group: bool, config: MatchConfig,
            clock: StageClock) -> tuple[torch.Tensor, dict[int, LayerTransform], float, dict]:
    """The descent from the map r0 (in_group: whether r0 is a group element; a soft start is not):
    (R, blocks, folded distance, info)."""
    config, memos, cache = config.blocks(), {}, {}
    with clock("blocks"):
        blocks = block_pass(pair, r0, config, None, clock, memos)
    r, history, inner, converged, solves, tol = (r0 if in_group else None), [], [], False, 1, LOOSE
    for outer in range(MAX_OUTER):
        r, blocks, dist, info = continuous(pair, group, r, blocks, config, clock, tol, cache)
        history.append(dist)
        inner.append(info)
        if outer == MAX_OUTER - 1:
            break
        with clock("blocks"):
            found = block_pass(pair, r, config, blocks, clock, memos)
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
