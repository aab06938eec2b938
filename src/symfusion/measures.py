"""Measures between models: Euclidean distance (whole and per module type) and functional deviation."""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Mapping

import torch

from symfusion.arch import ModelLayout
from symfusion.families import family_spec, token_limit


BLOCK = 2**20          # elements per float64 block: 8 MiB, reused by the allocator (a whole embedding table
                       # in float64 would be fresh pages from the kernel at every call)


def float64_blocks(*tensors: torch.Tensor):
    """The flattened tensors (of one size) side by side, BLOCK elements at a time, in float64."""
    flat = [t.reshape(-1) for t in tensors]
    for start in range(0, flat[0].numel(), BLOCK):
        yield [f[start:start + BLOCK].double() for f in flat]


@torch.no_grad()
def squared_difference(x: torch.Tensor, y: torch.Tensor) -> float:
    """|x - y|^2 in float64, summed block by block over the flattened tensors.

    Each block is widened into one reused float64 buffer, differenced and squared in place, then summed: the same
    roundings and the same reduction as (x.double() - y.double()).pow(2).sum() per block, so the same bits, without a
    float64 copy of either tensor (issue 56: the copies cost more than the matching)."""
    fx, fy = x.reshape(-1), y.reshape(-1)
    n, total = fx.numel(), 0.0
    buffer = torch.empty(min(n, BLOCK), dtype=torch.float64)
    for start in range(0, n, BLOCK):
        d = buffer[:min(BLOCK, n - start)]
        d.copy_(fx[start:start + BLOCK])        # float32 -> float64 is exact
        d.sub_(fy[start:start + BLOCK])         # float64(x) - float64(y), rounded once in float64
        d.mul_(d)                               # pow(2) is this product, rounded once
        total += d.sum().item()
    return total


@torch.no_grad()
def distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], layout: ModelLayout | None = None) -> dict:
    """Euclidean distance over all shared floating-point tensors of equal shape (task heads of different
    label counts are left out), plus one entry per module type."""
    if layout is not None:                     # GPT-2: module types are known on the (out, in) views
        a, b = layout.canonical(a), layout.canonical(b)
    squared: dict[str, float] = defaultdict(float)
    for key, tensor in a.items():
        if key not in b or not tensor.is_floating_point() or b[key].shape != tensor.shape:
            continue
        part = squared_difference(tensor, b[key])
        squared["total"] += part
        if layout is not None:
            squared[layout.module_type(key)] += part
    return {name: math.sqrt(value) for name, value in squared.items()}


def tied_names(model: torch.nn.Module) -> dict[str, str]:
    """Each parameter name under which a module holds a tensor it already holds under an earlier name (tied
    weights: the output embedding of a tied decoder) -> that earlier name."""
    first, ties = {}, {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if id(parameter) in first:
            ties[name] = first[id(parameter)]
        else:
            first[id(parameter)] = name
    return ties


def compared_keys(order, source_keys, anchor_keys, source_ties: Mapping[str, str],
                  anchor_ties: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """The parameters of a pair, each counted once, in `order` (the source's state-dict order): name -> (the
    source's key, the anchor's key) of the tensors compared. A name tied in both models is another name's tensor
    in both: left out; a name tied in one model only compares that model's tied tensor with the other's own (a
    tied anchor's embedding against an untied source's output head); a name one model lacks is left out."""
    source_keys, anchor_keys, pairs = set(source_keys), set(anchor_keys), {}
    for key in order:
        if key in pairs or (key in source_ties and key in anchor_ties):
            continue
        s = key if key in source_keys else source_ties.get(key)
        a = key if key in anchor_keys else anchor_ties.get(key)
        if s in source_keys and a in anchor_keys:
            pairs[key] = (s, a)
    return pairs


class SquaredDistances:
    """|source - anchor|^2 per compared tensor (float64, block by block), added in any order (a folder's layers one
    at a time) and summed in the pair's order, so the result does not depend on the order the tensors came in."""

    def __init__(self, pairs: Mapping[str, tuple[str, str]], layout: ModelLayout | None = None):
        self.pairs, self.layout, self.parts = pairs, layout, {}

    def add(self, source: Mapping[str, torch.Tensor], anchor: Mapping[str, torch.Tensor]) -> None:
        """The parts of every compared key whose two tensors are given (canonical views, under their own keys)."""
        for key, (s, a) in self.pairs.items():
            if s in source and a in anchor and source[s].is_floating_point() and source[s].shape == anchor[a].shape:
                self.parts[key] = squared_difference(source[s], anchor[a])

    def distances(self) -> dict:
        """{"total": the distance, then one entry per module type}, summed in the pair's order."""
        squared: dict[str, float] = defaultdict(float)
        for key in self.pairs:
            if key in self.parts:
                squared["total"] += self.parts[key]
                if self.layout is not None:
                    squared[self.layout.module_type(key)] += self.parts[key]
        return {name: math.sqrt(value) for name, value in squared.items()}


@torch.no_grad()
def parameter_distance(source: torch.nn.Module, anchor: torch.nn.Module, layout: ModelLayout) -> dict:
    """The Euclidean distance between two models' parameters (tied tensors once, see compared_keys; tensors of
    different shapes, such as task heads of other label counts, left out), total and per module type."""
    a = layout.canonical(source.state_dict())
    b = layout.canonical(anchor.state_dict())
    squared = SquaredDistances(compared_keys(list(a), a, b, tied_names(source), tied_names(anchor)), layout)
    squared.add(a, b)
    return squared.distances()


def distance_fields(before: Mapping[str, float], after: Mapping[str, float]) -> dict:
    """A match report's distances: the totals, and the distances by module type ("total" among them)."""
    return {"distance_before": before.get("total", 0.0), "distance_after": after.get("total", 0.0),
            "distance_before_by_module": dict(before), "distance_after_by_module": dict(after)}


def probe_inputs(config, batch_size: int = 2, seq_len: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic random inputs for a model family: token ids (with padding) or pixels; at most the model's
    token_limit tokens per sequence (probe_length)."""
    gen = torch.Generator().manual_seed(seed)
    if family_spec(config).inputs == "pixels":
        shape = (batch_size, config.num_channels, config.image_size, config.image_size)
        return {"pixel_values": torch.randn(shape, generator=gen)}
    seq_len = probe_length(config, seq_len)
    input_ids = torch.randint(0, config.vocab_size, (batch_size, seq_len), generator=gen)
    attention_mask = torch.ones(batch_size, seq_len, dtype=torch.long)
    attention_mask[-1, seq_len // 2:] = 0                      # one padded row exercises masking
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def probe_length(config, seq_len: int) -> int:
    """The tokens per probe sequence: `seq_len`, at most what the model holds (families.token_limit)."""
    limit = token_limit(config)
    return min(int(seq_len), limit) if limit is not None else int(seq_len)


def model_outputs(model: torch.nn.Module, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The model's main output on probe inputs: logits if it has a head, else hidden states."""
    model.eval()
    with torch.no_grad():
        out = model(**inputs)
    tensor = getattr(out, "logits", None)
    if tensor is None:
        tensor = out.last_hidden_state
    if "attention_mask" in inputs and tensor.dim() == 3:       # padded positions are not outputs
        tensor = tensor[inputs["attention_mask"].bool()]
    return tensor


def max_output_change(model_a: torch.nn.Module, model_b: torch.nn.Module, inputs: Mapping[str, torch.Tensor]) -> float:
    """max |f_a(x) - f_b(x)| over probe inputs x."""
    return (model_outputs(model_a, inputs) - model_outputs(model_b, inputs)).abs().max().item()
