"""Matching models held in memory: two nn.Modules, or two model folders loaded whole and the matched one written in the source folder's layout.

align() on nn.Modules matches here; so does align() on folders where the whole models are needed or cheap:
the variants that run the models (residual_solve=activations, refine=loss on data, refine=synthetic on inputs it
makes) and the whole-group variants of a pair that fits in memory (there the in-memory descent of matching/whole.py
is exact, where the streamed one of sharded_whole.py agrees with it to rounding). The maths is one call of match_models; what is
reported is the same for both entries: the parameters' distance before and after (measures.parameter_distance:
tied tensors once), the relative change of the outputs on probe inputs (as stored: dtype rounding included).
"""
from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from symfusion.arch import check_finite, check_same_layout, layout_of, resolve_layers
from symfusion.errors import SymfusionError
from symfusion.families import check_compatible, family_spec
from symfusion.alignment.checks import check_outputs_finite, tolerance_for
from symfusion.io.modelio import copy_auxiliary_files, load_config, load_model
from symfusion.io.batches import check_batches
from symfusion.alignment.rewrite import as_stored, plan_like, write_like
from symfusion.io.untie import is_tied, untie_pair
from symfusion.matching import MatchConfig, MatchData, match_models
from symfusion.matching.compose import StageClock
from symfusion.measures import distance_fields, model_outputs, parameter_distance, probe_inputs
from symfusion.symmetry import apply_transform


def output_change(model: torch.nn.Module, other: torch.nn.Module) -> float:
    """max |f_other(x) - f(x)| / max |f(x)| on probe inputs (measures.probe_inputs, in the model's dtype); a source
    whose own outputs are not finite is refused in one line naming its largest weight (checks.check_outputs_finite)."""
    inputs = probe_inputs(model.config)
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].to(next(model.parameters()).dtype)
    before = model_outputs(model, inputs)
    if not bool(torch.isfinite(before).all()):
        largest = {k: v.detach().abs().max().item() for k, v in model.state_dict().items()
                   if v.is_floating_point() and v.numel()}
        key = max(largest, key=largest.get)
        check_outputs_finite(before, "the source model", detail=f" (the largest, {largest[key]:.3g}, in {key!r})")
    return ((model_outputs(other, inputs) - before).abs().max() / before.abs().max().clamp_min(1e-30)).item()


def _match(source: torch.nn.Module, anchor: torch.nn.Module, config: MatchConfig, layers, last_layers, data):
    """(layout, match result, the moved source state in at least float32, seconds) of two loaded models."""
    check_compatible(source.config, anchor.config)
    # rotate in at least float32: half-precision weights are moved in float32 and rounded once when stored
    state = {k: v.float() if v.is_floating_point() and v.dtype in (torch.float16, torch.bfloat16) else v
             for k, v in source.state_dict().items()}
    anchor_state = anchor.state_dict()
    check_finite(state, "source model")
    check_finite(anchor_state, "anchor model")
    layout = layout_of(source.config, state)
    check_same_layout(layout, layout_of(anchor.config, anchor_state))
    start = time.perf_counter()
    if data:
        check_batches(data, source)            # ids and labels the model reads, before it runs (one line)
    match_data = MatchData(copy.deepcopy(source).float(), list(data or [])) if data or config.runs_models else None
    result = match_models(state, anchor_state, layout, config, layers=layers, last_layers=last_layers, data=match_data,
                          tied=is_tied(source))
    moved = apply_transform(state, layout, result.transform)
    return layout, result, moved, time.perf_counter() - start


def match_modules(source: torch.nn.Module, anchor: torch.nn.Module, config: MatchConfig, layers, last_layers,
                  tolerance: float, data=None) -> tuple[torch.nn.Module, object, dict]:
    """(the matched copy of `source`, the transform, report fields); the source is left as it is (matching.untie:
    the matched copy is untied, io/untie.py)."""
    start, clock = time.perf_counter(), StageClock()
    if config.untie:
        source, anchor = untie_pair(source, anchor)
    dtypes = {p.dtype for p in source.parameters() if p.is_floating_point()}
    with clock("solve"):
        layout, result, moved, _ = _match(source, anchor, config, layers, last_layers, data)
    with clock("copy"):
        kept = {k: v.dtype for k, v in source.state_dict().items()}
        matched = holding(source, as_stored(moved, kept))   # cast back to the source's dtypes (each in its range)
    with clock("check"):
        change, limit = output_change(source, matched), tolerance_for(dtypes, tolerance)
    if not change <= limit:                                   # NaN fails too
        raise SymfusionError(f"the matched model changes the source's outputs by {change:.3g} relative (> {limit:.3g}); "
                             "report this as a bug")
    with clock("distances"):
        distances = distance_fields(parameter_distance(source, anchor, layout), parameter_distance(matched, anchor, layout))
    return matched.eval(), result.transform, {
        "family": layout.family, "layers": resolve_layers(layout.num_layers, layers, last_layers), **distances,
        "relative_output_change": change, "tolerance": limit, "seconds": time.perf_counter() - start,
        "seconds_by_stage": dict(clock.seconds), "solve_seconds_by_stage": result.seconds, "residual": result.residual}


def holding(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """A copy of `model` whose parameters and buffers are `state`'s tensors, as model.load_state_dict(state) on a deep
    copy would leave them (a tied parameter: its last name's tensor), without copying the model's weights first; a
    tensor that shares the model's memory is cloned, so the copy never writes the original."""
    own = {t.untyped_storage().data_ptr() for t in itertools.chain(model.parameters(), model.buffers())}

    def fresh(tensor: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        if tuple(tensor.shape) != tuple(like.shape):
            raise SymfusionError(f"the moved state's tensor of shape {tuple(tensor.shape)} does not fit "
                                 f"{tuple(like.shape)}; report this as a bug")
        tensor = tensor.detach().to(like.dtype)
        return tensor.clone() if tensor.untyped_storage().data_ptr() in own else tensor.contiguous()
    memo = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if name in state:
            memo[id(parameter)] = torch.nn.Parameter(fresh(state[name], parameter), parameter.requires_grad)
    for name, buffer in model.named_buffers(remove_duplicate=False):
        if name in state:
            memo[id(buffer)] = fresh(state[name], buffer)
    return copy.deepcopy(model, memo)


def check_same_body(model, other, path, other_path) -> None:
    """Refuse (one line) two folders whose body tensors (embeddings, layers) differ in shape; task heads may."""
    state, others = model.state_dict(), other.state_dict()
    for key in family_spec(model.config).body_keys(state):
        if key not in others or others[key].shape != state[key].shape:
            found = tuple(others[key].shape) if key in others else "missing"
            raise SymfusionError(f"{path} and {other_path} differ in {key!r} ({tuple(state[key].shape)} vs {found}); "
                                 "they are not models of one architecture")


def match_folders_in_memory(source: Path, anchor: Path, output, config: MatchConfig, layers, last_layers,
                            tolerance: float, data=None, tmp: Path | None = None):
    """Match two folders loaded whole; write the matched folder into `tmp` (or `output`) with the source's shards,
    index, dtypes and config (where each moved tensor has its own entry in the source's files; save_pretrained
    otherwise); returns (transform, report fields). The outputs are checked on the weights as written."""
    start, clock = time.perf_counter(), StageClock()
    with clock("load"):
        check_compatible(load_config(source), load_config(anchor), str(source), str(anchor))
        model, anchor_model = load_model(source), load_model(anchor)         # each checked finite
        check_same_body(model, anchor_model, source, anchor)
    if config.untie:                  # written untied: save_pretrained (the source's files have no lm_head to fill)
        model, anchor_model = untie_pair(model, anchor_model)
    with clock("solve"):
        layout, result, moved, _ = _match(model, anchor_model, config, layers, last_layers, data)
    with clock("copy"):
        file_state, dtypes = plan_like(model, model.state_dict(), moved, source)
        stored = as_stored(moved, dtypes)
        limit = tolerance_for({d for d in dtypes.values() if d.is_floating_point}, tolerance)
        matched = holding(model, stored)
    with clock("check"):
        change = output_change(model, matched)
    if not change <= limit:                                   # NaN fails too
        raise SymfusionError(f"the matched model changes the source's outputs by {change:.3g} relative "
                             f"(> {limit:.3g}); not writing {output}. Report this as a bug")
    with clock("write"):
        target = Path(tmp or output)
        target.mkdir(parents=True, exist_ok=True)
        if file_state is not None:
            write_like(source, file_state, target)
        else:
            matched.save_pretrained(str(target), safe_serialization=True)
            copy_auxiliary_files(source, target)
    with clock("distances"):
        distances = distance_fields(parameter_distance(model, anchor_model, layout),
                                    parameter_distance(matched, anchor_model, layout))
    return result.transform, {
        "family": layout.family, "layers": resolve_layers(layout.num_layers, layers, last_layers), **distances,
        "relative_output_change": change, "tolerance": limit, "seconds": time.perf_counter() - start,
        "seconds_by_stage": dict(clock.seconds), "solve_seconds_by_stage": result.seconds, "residual": result.residual}
