"""The whole symmetry group: whole heads, the per-block symmetries and the residual stream, by coordinate descent.

The residual map R couples every layer (it moves the input columns of every map reading the stream and the
output rows of every map writing it), while each block's symmetries (heads, Q/K and V/O rotations, scales,
FFN permutation) act on that block's head and neuron axes only; the two commute. With both models in the
folded gauge (stream.py: every pre-norm's gain folded into its readers), the squared distance is
    D(R, B) = | B R fold(source) - fold(anchor) |^2
and matching/descent.py alternates the block solves of matching/compose.py with the exact residual solve of
matching/residual.py (and the heads' continuous parts, matching/continuous.py) to a fixed point, from the first
map of matching/starts.py (the regularised polar factor of the untouched tensors' cross product, or of the
activations after the embeddings, completed by the attention blocks solved at it). D never rises along the
descent. The paper's own block matching, without a residual map, is a candidate too, so the result is never
farther from the anchor (in the folded gauge) than it: it is solved unless a lower bound on its distance from
norms alone already exceeds the descent's (matching/pairs.py). Candidates whose distances agree to CHOICE_TOL are
tied and the first listed wins.
The source is finally unfolded with the gains closest to the anchor as stored (matching/residual.py,
gauge_gains), and the paper's block matching is taken instead when it is closer as stored: where norms hold
gains near zero, the folded gauge prices their coordinates near zero too, and a small rotation that mixes them
with live ones (cheap when folded) grows by 1/gain once unfolded (two close models, a fine-tune and its base,
show it).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Mapping

import torch

from symfusion.arch import ModelLayout
from symfusion.errors import SymfusionError
from symfusion.matching.compose import MatchConfig, MatchResult, StageClock, match_blocks
from symfusion.matching.continuous import MAX_INNER, TOL
from symfusion.matching.descent import MAX_OUTER, descend
from symfusion.matching.pairs import StatePair, distance_of, paper_lower_bound, parts
from symfusion.matching.learned import refine_by_loss
from symfusion.matching.synthetic import SyntheticBatches, check_inputs, inputs_of
from symfusion.matching.residual import gauge_gains, residual_group
from symfusion.matching.starts import SOFT, activation_start, first_map, untouched_cross
from symfusion.measures import distance
from symfusion.stream import StreamLayout, comparable, fold_norms, foldable, rotate_stream, stream_layout
from symfusion.symmetry import ResidualMap, Transform, apply_blocks, apply_transform

CHOICE_TOL = 1e-9       # candidates whose folded distances agree to this (relative) are tied: the first listed wins


@dataclass
class MatchData:
    """What data-driven residual matching reads: a module of the models' architecture (its own weights are never
    used) and batches of its inputs, with labels where the loss is read (matching.refine=loss; refine=synthetic
    makes its own and reads only the module)."""

    model: torch.nn.Module
    batches: list[dict]


def folded_distance(state: Mapping[str, torch.Tensor], anchor: Mapping[str, torch.Tensor]) -> float:
    """|state - anchor| over the anchor's floating tensors (both canonical and folded)."""
    return math.fsum(((state[k].double() - t.double()) ** 2).sum().item() for k, t in anchor.items()
                     if t.is_floating_point()) ** 0.5


def unfolded(fs: Mapping, anchor: Mapping, layout: ModelLayout, stream: StreamLayout, r: torch.Tensor,
             blocks: Transform) -> Transform:
    """The whole transform of a candidate (r, blocks) found in the folded gauge: unfolded with the gains closest to
    the anchor as stored (gauge_gains); fs: the folded canonical source."""
    gains = gauge_gains(apply_blocks(rotate_stream(fs, stream, r), layout, blocks.layers), layout.canonical(anchor),
                        stream.folds)
    return Transform(layers={i: t for i, t in blocks.layers.items() if not t.is_identity()},
                     residual=ResidualMap(r, gains))


def stored_distance(source: Mapping, anchor: Mapping, layout: ModelLayout, transform: Transform) -> float:
    """|T(source) - anchor| as stored: what the match reports, and what a merge of the stored weights sees."""
    return distance(apply_transform(source, layout, transform), anchor, layout)["total"]


def choose(candidates: list[dict]) -> dict:
    """The candidate of least folded distance; distances within CHOICE_TOL (relative) of it tie, and the first
    listed of the tied wins (a deterministic choice that last-bit differences between distances cannot flip)."""
    least = min(c["folded_distance"] for c in candidates)
    return next(c for c in candidates if c["folded_distance"] <= least * (1 + CHOICE_TOL))


def starts(pair: StatePair, group: str, config: MatchConfig, source, anchor, stream: StreamLayout,
           data: "MatchData | None") -> list[tuple[str, torch.Tensor, bool]]:
    """The descent's first maps: (name, map, whether it is a group element)."""
    if config.residual_solve == "activations":
        return [("activations", *activation_start(data.model, data.batches, source, anchor, stream, group))]
    return [("weights", *first_map(*untouched_cross(pair), group))]


@torch.no_grad()
def match_whole(source: Mapping[str, torch.Tensor], anchor: Mapping[str, torch.Tensor], layout: ModelLayout,
                config: MatchConfig, data: MatchData | None = None, tied: bool | None = None) -> MatchResult:
    """The transform (blocks and a residual map) moving `source` onto `anchor`, whole state dicts of one layout."""
    if config.needs_data and data is None:
        raise SymfusionError("matching.residual_solve=activations and matching.refine=loss read the models' activations "
                             "or loss: give data (symfusion-match task=NAME, or align(..., data=...))")
    if config.runs_models and data is None:
        raise SymfusionError("matching.refine=synthetic runs the models on inputs it makes: match loaded models "
                             "(align() on modules or folders, symfusion-match)")
    if config.refine == "synthetic":
        check_inputs(data.model)                                 # before the descent, not after it
    ends = (anchor, source)                                      # the end models as given (they write synthetic text)
    clock = StageClock()
    stream = stream_layout(layout, source, tied)
    anchor = comparable(source, anchor)                          # preconditions: heads of other sizes, norms to fold
    stream, kind = foldable(stream, config.residual, [layout.canonical(source), layout.canonical(anchor)])
    group = residual_group(stream, kind, layout.family)
    fs = fold_norms(layout.canonical(source), stream.folds)
    fa = fold_norms(layout.canonical(anchor), stream.folds)
    fa.pop(stream.tied_copy, None)                       # the embeddings count once in every distance and product
    pair = StatePair(fs, fa, layout, stream)

    with clock("residual"):
        first = starts(pair, group, config, source, anchor, stream, data)
    runs = []
    for name, r0, in_group in first:
        r, blocks, dist, info = descend(pair, group, r0, in_group, config, clock)
        runs.append({"start": name, "folded_distance": dist, "r": r, "blocks": Transform(blocks), **info})
    # the block matching alone (for the paper's encoders, the paper's), no residual map: a candidate unless a lower
    # bound on its distance already exceeds the descent's (then it cannot be chosen, and is not solved)
    eye, paper = torch.eye(stream.hidden, dtype=torch.float64), {}

    def paper_blocks() -> Transform:
        if "blocks" not in paper:
            paper["blocks"] = match_blocks(source, anchor, layout, dataclasses.replace(config.blocks(), heads=None),
                                           clock=clock).transform
        return paper["blocks"]

    bound = paper_lower_bound(parts(pair), layout)
    candidates = runs
    if choose(runs)["folded_distance"] >= bound * (1 - CHOICE_TOL):
        paper["distance"] = distance_of(pair, eye, paper_blocks().layers)
        candidates = [{"start": "paper", "folded_distance": paper["distance"], "r": eye, "blocks": paper_blocks()}] + runs
    best = choose(candidates)
    chosen = "paper" if best["start"] == "paper" else "descent"
    r, blocks = best["r"], best["blocks"]
    transform = unfolded(fs, anchor, layout, stream, r, blocks)
    if chosen != "paper":          # as stored, the same: the paper's candidate only where its bound allows
        stored = stored_distance(source, anchor, layout, transform)
        as_stored = StatePair(layout.canonical(source), layout.canonical(anchor), layout, stream)
        if stored >= paper_lower_bound(parts(as_stored), layout):
            paper_transform = unfolded(fs, anchor, layout, stream, eye, paper_blocks())
            if stored >= stored_distance(source, anchor, layout, paper_transform):
                r, blocks, chosen, transform = eye, paper_blocks(), "paper, closer as stored", paper_transform
    info = {"group": group, "residual_solve": config.residual_solve,
            "folded_distance_blocks_only": paper.get("distance"), "paper_lower_bound": bound,
            "folded_distance": best["folded_distance"], "chosen": chosen, "start": best["start"],
            "folds": len(stream.folds), "tied_final_norm": stream.tied_final, **summary(runs, best)}
    if config.refine != "none":
        settings = config.refine_settings(layout)
        batches = data.batches if config.refine == "loss" else SyntheticBatches(data.model, ends, settings.steps)
        with clock("refine"):
            r, blocks, gains, info["refine"] = refine_by_loss(fs, fa, anchor, layout, stream, r, blocks, data.model,
                                                              batches, settings)
        info["refine"]["inputs"] = inputs_of(batches)
        info["folded_distance_refined"] = folded_distance(apply_blocks(rotate_stream(fs, stream, r), layout,
                                                                       blocks.layers), fa)
        transform = unfolded(fs, anchor, layout, stream, r, blocks) if gains is None else \
            Transform(layers={i: t for i, t in blocks.layers.items() if not t.is_identity()},
                      residual=ResidualMap(r, gains))                   # the unfolding gains it learned
    return MatchResult(transform=transform, seconds=dict(clock.seconds), residual=info)


def summary(runs: list[dict], best: dict) -> dict:
    """What match.json records of the descent: the chosen run's history and stop, every start, their spread."""
    distances = [c["folded_distance"] for c in runs]
    return {"descent": best.get("descent", []), "converged": best.get("converged", True),
            "stop": {"tol": TOL, "max_inner": MAX_INNER, "max_outer": MAX_OUTER, "soft": SOFT},
            "starts": [{"start": c["start"], "folded_distance": c["folded_distance"], "converged": c["converged"],
                        "block_solves": c["block_solves"], "inner_steps": [i["steps"] for i in c["inner"]]}
                       for c in runs],
            "spread": max(distances) - min(distances) if distances else 0.0}
