"""The whole symmetry group: whole heads, the per-block symmetries and the residual stream, by coordinate descent.

The residual map R couples every layer (it moves the input columns of every map reading the stream and the
output rows of every map writing it), while each block's symmetries (heads, Q/K and V/O rotations, scales,
FFN permutation) act on that block's head and neuron axes only; the two commute. With both models in the
folded gauge (stream.py: every pre-norm's gain folded into its readers), the squared distance is
    D(R, B) = | B R fold(source) - fold(anchor) |^2,
and the descent alternates (as Git Re-Basin's weight matching does for its permutations)
    B <- the block solves of matching/compose.py on R fold(source)          (kept only if closer)
    R <- the residual solve of matching/residual.py with B fixed            (exact: D = const - 2 <R, M>)
so D never rises once the descent has started, and stops when it falls by less than REL_TOL. The start is
not R = I: with the blocks already fitted to the unmoved basis, the first residual solve would only
confirm it (measured: permutations stay at the identity). R starts instead from the terms no block solve
touches (embeddings, norms, writer biases, the head), or from the two models' residual activations after
the embeddings (residual_solve=activations). The paper's own block matching, without a residual map, is a
candidate too, so the result is never farther from the anchor (in the folded gauge) than it. The source
is finally unfolded with the gains closest to the anchor as stored (matching/residual.py, gauge_gains), and
the paper's block matching is taken instead when it is closer as stored: where norms hold gains near zero,
the folded gauge prices their coordinates near zero too, and a small rotation that mixes them with live ones
(cheap when folded) grows by 1/gain once unfolded (two close models, a fine-tune and its base, show it).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping

import torch
from torch.func import functional_call

from symfusion.arch import ModelLayout
from symfusion.errors import SymfusionError
from symfusion.matching.compose import MatchConfig, MatchResult, StageClock, match_blocks
from symfusion.matching.learned import refine_by_loss
from symfusion.matching.residual import (activation_cross, gauge_gains, residual_cross, residual_group,
                                         solve_residual)
from symfusion.measures import distance, squared_difference
from symfusion.stream import StreamLayout, fold_norms, rotate_stream, stream_layout
from symfusion.symmetry import LayerTransform, ResidualMap, Transform, apply_blocks, apply_transform

MAX_ITERATIONS = 50
REL_TOL = 1e-4          # stop when one alternation lowers the distance by less than this fraction


@dataclass
class MatchData:
    """What data-driven residual matching reads: a module of the models' architecture (its own weights are never
    used) and batches of its inputs, with labels where the loss is read (matching.refine=loss)."""

    model: torch.nn.Module
    batches: list[dict]


def folded_distance(state: Mapping[str, torch.Tensor], anchor: Mapping[str, torch.Tensor]) -> float:
    """|state - anchor| over the anchor's floating tensors (both canonical and folded)."""
    total = sum(squared_difference(state[k], t) for k, t in anchor.items() if t.is_floating_point())
    return total ** 0.5


def blockwise_best(moved: Mapping, fa: Mapping, layout: ModelLayout, found: Mapping[int, LayerTransform],
                   previous: Mapping[int, LayerTransform] | None) -> tuple[dict[int, LayerTransform], float]:
    """Per layer, the closer of its new and its previous block transform (the distance separates over layers once
    R is fixed); (the chosen transforms, the folded distance of the whole model with them)."""
    in_blocks = {k for i in range(layout.num_layers) for k in layout.layer_keys(i)}
    squared = sum(squared_difference(moved[k], t) for k, t in fa.items() if k not in in_blocks and t.is_floating_point())
    chosen = {}
    for i in range(layout.num_layers):
        keys = layout.layer_keys(i)
        part, target = {k: moved[k] for k in keys}, {k: fa[k] for k in keys}
        candidates = [found.get(i, LayerTransform())] + ([previous[i]] if previous is not None else [])
        distances = [folded_distance(apply_blocks(part, layout, {i: c}), target) for c in candidates]
        k = min(range(len(candidates)), key=distances.__getitem__)
        chosen[i] = candidates[k]
        squared += distances[k] ** 2
    return chosen, squared ** 0.5


def untouched_keys(stream: StreamLayout, layout: ModelLayout) -> set[str]:
    """The residual tensors no block solve moves: embeddings, norms, writer biases, head maps."""
    in_blocks = {k for i in range(layout.num_layers) for k in layout.layer_keys(i)}
    return {key for key, _ in stream.axes if key not in in_blocks}


def stream_states(model: torch.nn.Module, state: Mapping[str, torch.Tensor], batches: list[dict],
                  tied_copy: str | None = None) -> torch.Tensor:
    """The residual stream after the embeddings, (tokens, d), of `model` holding `state`; padding left out. A tied
    lm_head listed beside its embeddings (`tied_copy`) is left out: the module ties it to them itself."""
    state = {k: v for k, v in state.items() if k != tied_copy}
    found = []
    with torch.no_grad():
        for batch in batches:
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            hidden = functional_call(model, state, args=(), kwargs={**inputs, "output_hidden_states": True})
            states = hidden.hidden_states[0]                                      # (batch, tokens, d)
            if "attention_mask" in inputs:
                states = states[inputs["attention_mask"].bool()]
            found.append(states.reshape(-1, states.shape[-1]))
    return torch.cat(found)


def initial_map(fs: dict, fa: dict, source: Mapping, anchor: Mapping, layout: ModelLayout, stream: StreamLayout,
                group: str, config: MatchConfig, data: MatchData | None) -> torch.Tensor:
    """The descent's first residual map: from the untouched weights, or from the activations after the embeddings."""
    if config.residual_solve == "activations":
        states = [stream_states(data.model, s, data.batches, stream.tied_copy) for s in (anchor, source)]
        return solve_residual(activation_cross(*states, stream), group)
    m, g = residual_cross(fs, fa, stream, current=torch.eye(stream.hidden, dtype=torch.float64),
                          keys=untouched_keys(stream, layout))
    return solve_residual(m, group, g)


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


@torch.no_grad()
def match_whole(source: Mapping[str, torch.Tensor], anchor: Mapping[str, torch.Tensor], layout: ModelLayout,
                config: MatchConfig, data: MatchData | None = None, tied: bool | None = None) -> MatchResult:
    """The transform (blocks and a residual map) moving `source` onto `anchor`, whole state dicts of one layout."""
    if config.needs_data and data is None:
        raise SymfusionError("matching.residual_solve=activations and matching.refine=loss read the models' activations "
                             "or loss: give data (symfusion-match task=NAME, or align(..., data=...))")
    clock = StageClock()
    stream = stream_layout(layout, source, tied)
    group = residual_group(stream, config.residual, layout.family)
    fs = fold_norms(layout.canonical(source), stream.folds)
    fa = fold_norms(layout.canonical(anchor), stream.folds)
    fa.pop(stream.tied_copy, None)                       # the embeddings count once in every distance and product

    # candidate 0: the block matching alone (for the paper's encoders, the paper's matching), no residual map
    paper = match_blocks(source, anchor, layout, dataclasses.replace(config.blocks(), heads=None), clock=clock)
    eye = torch.eye(stream.hidden, dtype=torch.float64)
    best = (folded_distance(apply_blocks(fs, layout, paper.transform.layers), fa), eye, paper.transform, "paper")
    paper_candidate = unfolded(fs, anchor, layout, stream, eye, paper.transform)
    start = best[0]
    with clock("residual"):
        r = initial_map(fs, fa, source, anchor, layout, stream, group, config, data)
    blocks_config, history, previous = config.blocks(), [], None
    for _ in range(MAX_ITERATIONS):
        moved = rotate_stream(fs, stream, r)
        found = match_blocks(moved, fa, layout, blocks_config, clock=clock, canonical=True).transform.layers
        chosen, dist = blockwise_best(moved, fa, layout, found, previous)
        if history and dist >= history[-1]:
            break                                          # the residual step did not help: stay at the best
        history.append(dist)
        previous = chosen
        if dist < best[0]:
            best = (dist, r, Transform(chosen), "descent")
        if len(history) > 1 and history[-2] - history[-1] <= REL_TOL * history[-2]:
            break
        with clock("residual"):
            m, g = residual_cross(apply_blocks(fs, layout, previous), fa, stream, current=r)
            r = solve_residual(m, group, g)
    distance, r, blocks, chosen = best
    if chosen != "paper" and stored_distance(source, anchor, layout, paper_candidate) <= \
            stored_distance(source, anchor, layout, unfolded(fs, anchor, layout, stream, r, blocks)):
        r, blocks, chosen = eye, paper.transform, "paper, closer as stored"
    info = {"group": group, "residual_solve": config.residual_solve, "folded_distance_blocks_only": start,
            "descent": history, "folded_distance": distance, "chosen": chosen,
            "folds": len(stream.folds), "tied_final_norm": stream.tied_final}
    gains = None
    if config.refine == "loss":
        with clock("refine"):
            r, blocks, gains, info["refine"] = refine_by_loss(fs, fa, anchor, layout, stream, r, blocks, data.model,
                                                              data.batches, config.refine_settings())
        info["folded_distance_refined"] = folded_distance(apply_blocks(rotate_stream(fs, stream, r), layout,
                                                                       blocks.layers), fa)
    transform = unfolded(fs, anchor, layout, stream, r, blocks) if gains is None else \
        Transform(layers={i: t for i, t in blocks.layers.items() if not t.is_identity()}, residual=ResidualMap(r, gains))
    return MatchResult(transform=transform, seconds=dict(clock.seconds), residual=info)
