"""Folders matched over the whole symmetry group (matching.residual): the coordinate descent streamed over memory-mapped layers.

matching/whole.py alternates block solves and a residual solve on whole state dicts; a 7B pair does not fit
in memory, so here the descent of matching/descent.py reads the folders through a pair that gives the folded
tensors of one layer at a time from the shards (and those outside the layers, read once): every block solve
is one pass over the layers, every continuous step of the inner loop one pass over the attention maps. The
start (matching/starts.py), the paper's block matching as a candidate and the choice are matching/whole.py's,
whose maths this streams (the result equals it: tests/library/test_residual_folders.py). The writing pass folds, moves and
unfolds each layer with the gains closest to the anchor (gauge_gains), applies its block transform and checks
the block on the moved stream (block'(R h) = R block(h)); the whole model's logits are checked when it is small.
Cost: each block solve reads both models once and repeats every layer's block solves.
"""
from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Mapping

import torch

from symfusion.arch import ModelLayout
from symfusion.errors import SymfusionError, steps
from symfusion.matching import MatchConfig
from symfusion.matching.compose import StageClock, match_blocks
from symfusion.matching.descent import descend
from symfusion.matching.pairs import distance_of, paper_lower_bound, parts
from symfusion.matching.residual import gauge_gains, residual_group
from symfusion.matching.starts import first_map, untouched_cross
from symfusion.matching.whole import CHOICE_TOL, choose, summary
from symfusion.alignment.checks import BlockCheck, check_whole_model, stored_in, tolerance_for
from symfusion.alignment.sharded import (ShardedFolder, distance_pairs, finish_folder, layer_prefix, open_pair,
                                         open_writers)
from symfusion.measures import SquaredDistances, distance_fields
from symfusion.stream import (StreamLayout, comparable, fold_norms, foldable, rotate_stream, stream_layout,
                              unfold_norms)
from symfusion.symmetry import LayerTransform, ResidualMap, Transform, apply_blocks


class _Pair:
    """Source and anchor folders read as canonical, folded float32 states: per layer, and the tensors outside them."""

    def __init__(self, src: ShardedFolder, anc: ShardedFolder, layout: ModelLayout, stream: StreamLayout):
        self.src, self.anc, self.layout, self.stream, self.cache = src, anc, layout, stream, {}
        in_layers = {k for i in range(layout.num_layers) for k in self.layer_keys(i)}
        self.outside_keys = [k for k in src.weight_map if k not in in_layers]
        self.outside: tuple[dict, dict] = ({}, {})    # read once the stream's folds are settled (start)

    def start(self, stream: StreamLayout) -> None:
        """Settle the stream layout (its foldable norms) and read the tensors outside the layers."""
        self.stream = stream
        self.outside = self._read(self.outside_keys)

    def layer_keys(self, i: int) -> list[str]:
        prefix = layer_prefix(self.layout, i)
        return list(dict.fromkeys(self.layout.stored_keys(self.layout.layer_keys(i))
                                  + [k for k in self.src.weight_map if k.startswith(prefix)]))

    def anchor_part(self, keys: list[str], source: dict) -> dict:
        """The anchor's stored tensors of `keys` that have a counterpart of their shape in `source` (stored); a name
        the anchor ties (a tied anchor's lm_head: the folder stores its embedding once) reads the tensor it is."""
        found = self.anc.read([k for k in keys if k in self.anc.weight_map or k in self.anc.ties], torch.float32)
        return comparable(source, found)

    def _read(self, keys: list[str]) -> tuple[dict, dict]:
        source = self.src.read(keys, torch.float32)
        states = []
        for stored in (source, self.anchor_part(keys, source)):
            canonical = self.layout.canonical(stored)
            folds = tuple(f for f in self.stream.folds if f.gain in canonical)
            states.append(fold_norms(canonical, folds))
        return states[0], states[1]

    def layer(self, i: int) -> tuple[dict, dict]:
        """(folded source, folded anchor) canonical tensors of layer i."""
        return self._read(self.layer_keys(i))


def _paper(pair: _Pair, config: MatchConfig, clock: StageClock) -> dict[int, LayerTransform]:
    """The block matching alone (for the paper's encoders, the paper's), solved on the models as they are: the
    descent's first candidate."""
    blocks = {}
    for i in steps(range(pair.layout.num_layers), "block matching", "layer"):
        keys = pair.layer_keys(i)
        raw = [folder.read(keys, torch.float32) for folder in (pair.src, pair.anc)]
        blocks[i] = match_blocks(*raw, pair.layout, config, layers=[i], clock=clock).transform.layers.get(i, LayerTransform())
    return blocks


def _descent(pair: _Pair, config: MatchConfig, group: str, clock: StageClock) -> tuple[torch.Tensor, dict, dict]:
    """(residual map, blocks per layer, info) of matching/whole.py's descent and choice on the streamed pair."""
    eye = torch.eye(pair.stream.hidden, dtype=torch.float64)
    with clock("residual"):
        r0, in_group = first_map(*untouched_cross(pair), group)
    r, blocks, dist, info = descend(pair, group, r0, in_group, config, clock)
    runs = [{"start": "weights", "folded_distance": dist, "r": r, "blocks": blocks, **info}]
    paper: dict = {}

    def paper_blocks() -> dict:
        if "blocks" not in paper:
            paper["blocks"] = _paper(pair, dataclasses.replace(config.blocks(), heads=None), clock)
        return paper["blocks"]

    bound = paper_lower_bound(parts(pair), pair.layout)
    candidates = runs
    if dist >= bound * (1 - CHOICE_TOL):
        paper["distance"] = distance_of(pair, eye, paper_blocks())
        candidates = [{"start": "paper", "folded_distance": paper["distance"], "r": eye, "blocks": paper_blocks()}] + runs
    best = choose(candidates)
    chosen = "paper" if best["start"] == "paper" else "descent"
    r, blocks = best["r"], best["blocks"]
    if chosen != "paper":
        stored = _stored_distance(pair, r, blocks)
        if stored >= paper_lower_bound(_raw_parts(pair), pair.layout) and stored >= _stored_distance(pair, eye, paper_blocks()):
            r, blocks, chosen = eye, paper_blocks(), "paper, closer as stored"
    return r, blocks, {"group": group, "residual_solve": "weights",
                       "folded_distance_blocks_only": paper.get("distance"), "paper_lower_bound": bound,
                       "folded_distance": best["folded_distance"], "chosen": chosen, "start": best["start"],
                       "folds": len(pair.stream.folds), "tied_final_norm": pair.stream.tied_final,
                       **summary(runs, best)}


def _raw_parts(pair: _Pair):
    """The source's and the anchor's canonical tensors as stored (not folded), by part, as descent.parts gives them."""
    for i in [None] + list(range(pair.layout.num_layers)):
        keys = pair.outside_keys if i is None else pair.layer_keys(i)
        source = pair.src.read(keys, torch.float32)
        yield i, pair.layout.canonical(source), pair.layout.canonical(pair.anchor_part(keys, source))


def match_folders_whole(source: str | Path, anchor: str | Path, output: str | Path, config: MatchConfig,
                        max_relative_output_change: float = 1e-3, whole_model_check: bool | None = None,
                        tmp: Path | None = None) -> tuple[Transform, dict]:
    """Match the source folder onto the anchor folder over the whole group, streaming layers; write the matched
    folder into `tmp` (or `output`); returns (transform, report). Memory: a few layers and the outside tensors."""
    if config.runs_models:
        raise SymfusionError("matching.residual_solve=activations, matching.refine=loss and refine=synthetic run the "
                             "models: load them and call align() on the modules (with data=... where it reads data), "
                             "or use symfusion-match")
    src, anc, src_meta, layout = open_pair(source, anchor)
    stream = stream_layout(layout, src_meta, tied=bool(getattr(src.config, "tie_word_embeddings", False)))
    pair = _Pair(src, anc, layout, stream)
    norms = [k for f in stream.folds for k in (f.gain, f.bias) if k]               # preconditions: norms to fold
    source_norms = src.read(norms, torch.float32)
    stream, kind = foldable(stream, config.residual, [source_norms, pair.anchor_part(norms, source_norms)])
    pair.start(stream)
    group = residual_group(stream, kind, layout.family)
    clock, start = StageClock(), time.perf_counter()
    r, blocks, info = _descent(pair, config, group, clock)
    target = Path(tmp or output)
    tolerance = tolerance_for({t.dtype for t in src_meta.values() if t.is_floating_point()}, max_relative_output_change)
    writers = open_writers(src, src_meta, target)
    checker, deviations = BlockCheck(src.config, skeleton=src.skeleton, read=src.read, keys=src.weight_map), {}
    pairs = distance_pairs(src, anc, layout)
    before, after = SquaredDistances(pairs, layout), SquaredDistances(pairs, layout)
    gains = {}
    for i, keys, stored_source, anchor_part, moved, part_gains in steps(_moved_parts(pair, r, blocks), "writing layers",
                                                                        "part", pair.layout.num_layers + 1):
        gains.update(part_gains)
        stored = {k: stored_in(moved[k], src_meta[k].dtype, k) for k in keys}
        tied_elsewhere = [a for s, a in pairs.values() if s in stored_source and a not in anchor_part]
        anchors = layout.canonical({**anchor_part, **anc.read(tied_elsewhere, torch.float32)})
        before.add(layout.canonical(stored_source), anchors)
        after.add(layout.canonical(stored), anchors)
        if i is not None:
            deviations[i] = checker.deviation(layer_prefix(layout, i), stored_source, stored, r)
            if not deviations[i] <= tolerance:                                   # NaN fails too
                raise SymfusionError(f"layer {i}: the matched block changes the source block's output by "
                                     f"{deviations[i]:.3g} relative (> {tolerance:.3g}); not writing {output}. "
                                     "Report this as a bug")
        for key in keys:
            writers[src.weight_map[key]].write(key, stored[key])
    finish_folder(src, writers, target)
    transform = Transform(layers={i: t for i, t in blocks.items() if not t.is_identity()}, residual=ResidualMap(r, gains))
    report = {"family": layout.family, "layers": list(range(layout.num_layers)), "shards": sorted(writers),
              **distance_fields(before.distances(), after.distances()), "seconds": time.perf_counter() - start,
              "block_relative_output_change": {str(i): d for i, d in deviations.items()},
              "max_block_relative_output_change": max(deviations.values(), default=0.0), "tolerance": tolerance,
              "seconds_by_stage": {**clock.seconds, "total": time.perf_counter() - start}, "residual": info}
    check_whole_model(src, src_meta, target, output, tolerance, whole_model_check, report)
    return transform, report


def _moved_parts(pair: _Pair, r: torch.Tensor, blocks: dict):
    """Per part (the tensors outside the layers, then each layer): (layer index or None, its stored keys, the
    source's part as stored, the anchor's, the moved part as stored in float32, its norms' gains)."""
    for i in [None] + list(range(pair.layout.num_layers)):
        keys = pair.outside_keys if i is None else pair.layer_keys(i)
        stored_source = pair.src.read(keys, torch.float32)
        anchor_part = pair.anchor_part(keys, stored_source)
        moved, gains = _move(stored_source, anchor_part, pair.layout, pair.stream, r, {} if i is None else {i: blocks[i]})
        yield i, keys, stored_source, anchor_part, moved, gains


def _stored_distance(pair: _Pair, r: torch.Tensor, blocks: dict) -> float:
    """|T(source) - anchor| as stored, for the candidate (r, blocks), in one pass over the layers."""
    return math.sqrt(sum((moved[k].double() - t.double()).pow(2).sum().item()
                         for *_, anchor_part, moved, _ in _moved_parts(pair, r, blocks) for k, t in anchor_part.items()))


def _move(stored: Mapping, anchor_stored: Mapping, layout: ModelLayout, stream: StreamLayout, r: torch.Tensor,
          blocks: dict) -> tuple[dict, dict]:
    """One part of the source (stored keys) folded, moved by r, its blocks applied, unfolded with the gains closest
    to the same part of the anchor; (the part in the stored form, those gains). A norm and its readers lie in one
    part (a layer, or the tensors outside the layers)."""
    canonical = layout.canonical(stored)
    folds = tuple(f for f in stream.folds if f.gain in canonical)
    moved = apply_blocks(rotate_stream(fold_norms(canonical, folds), dataclasses.replace(stream, folds=folds), r),
                         layout, blocks)
    gains = gauge_gains(moved, layout.canonical(anchor_stored), folds)
    moved = unfold_norms(moved, folds, gains)
    return (layout.stored_form(moved) if layout.stored else moved), gains
