"""The pair of models whole-group matching reads: folded canonical tensors by part, distances, a lower bound.

A pair (StatePair here; sharded_whole's streamed folders) gives the source's and the anchor's folded canonical
tensors by part: `outside` (the tensors outside the layers) and `layer(i)`; D(R, B) = |B R fs - fa| is measured
over the pair. (Weighing each tensor by 1 / sqrt(its size off the stream), as Generalized LMC's code does, or
each map by 1 / sqrt(its fan-in) was measured and not kept: benchmarks/bench_whole_ablation.py.)
"""
from __future__ import annotations

import math
from typing import Mapping

import torch

from symfusion.arch import ModelLayout
from symfusion.measures import squared_difference
from symfusion.stream import StreamLayout, rotate_stream
from symfusion.symmetry import LayerTransform, apply_blocks


def layer_prefix(layout: ModelLayout, index: int) -> str:
    """The state-dict prefix of layer `index` ("model.layers.3."), from its output map's key."""
    key = layout.layers[index].attention.output.weight
    return key[: key.index(f".{index}.") + len(f".{index}.")]


class StatePair:
    """Folded canonical source and anchor states split into the tensors of each layer and those outside them."""

    def __init__(self, fs: Mapping[str, torch.Tensor], fa: Mapping[str, torch.Tensor], layout: ModelLayout,
                 stream: StreamLayout):
        self.layout, self.stream, self.cache = layout, stream, {}
        prefixes = [layer_prefix(layout, i) for i in range(layout.num_layers)]
        self._layers = [({k: v for k, v in fs.items() if k.startswith(p)}, {k: v for k, v in fa.items() if k.startswith(p)})
                        for p in prefixes]
        inside = {k for part, _ in self._layers for k in part}
        self.outside = ({k: v for k, v in fs.items() if k not in inside}, {k: v for k, v in fa.items() if k not in inside})

    def layer(self, i: int) -> tuple[dict, dict]:
        return self._layers[i]


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
        squared += squared_distance(fs, {k: v for k, v in fa.items() if k not in moved})
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
    squared = squared_distance(rotate_stream(src_out, pair.stream, r), anc_out)
    for i in range(pair.layout.num_layers):
        fs, fa = pair.layer(i)
        moved = rotate_stream(fs, pair.stream, r)
        squared += squared_distance(apply_blocks(moved, pair.layout, {i: blocks[i]} if i in blocks else {}), fa)
    return math.sqrt(squared)


def squared_distance(state: Mapping[str, torch.Tensor], anchor: Mapping[str, torch.Tensor]) -> float:
    return math.fsum(squared_difference(state[k], t) for k, t in anchor.items() if t.is_floating_point())


# ---------------------------------------------------------------- the inner loop: continuous parts

