"""symfusion.align(): move a source model onto an anchor model from Python, given nn.Modules or model folders.

    matched, report = symfusion.align(source, anchor, matching="rotation")

- Two nn.Modules (transformers models of one supported family): `matched` is a new module (the
  source is left as it is) that computes the source's function, checked on probe inputs.
- Two save_pretrained folders: output=DIR is required; the matched folder is written atomically,
  layer by layer from memory-mapped shards (sharded.match_folders), keeping the source's shard
  layout and index, so transformers, mergekit or FusionBench read it as a normal folder; each
  block is checked, and the whole model's logits when it is small. `matched` is the output path.
The report holds the distances before and after (total and by module type), the functional
check, seconds per stage and the transform (a symmetry.Transform; folders also get
transform.safetensors and match.json).
"""
from __future__ import annotations

import copy
import math
import time
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch

from symfusion.arch import check_finite, check_same_layout, layout_of
from symfusion.families import check_compatible
from symfusion.errors import NOTES, SymfusionError, as_symfusion_error
from symfusion.matching import MatchConfig, MatchData, match_models, matching_config
from symfusion.measures import distance, model_outputs, probe_inputs
from symfusion.modelio import write_json
from symfusion.outputs import folder_marker, safe_output
from symfusion.provenance import provenance
from symfusion.sharded import match_folders, tolerance_for
from symfusion.sharded_whole import match_folders_whole
from symfusion.symmetry import apply_transform


# A matched folder (of align() or symfusion-match): it holds a match report.
MATCHED_FOLDER = folder_marker("match.json", ("distance_after",))


def align(source, anchor, matching: MatchConfig | str = "rotation", output: str | Path | None = None,
          layers=None, last_layers: int | None = None, max_relative_output_change: float = 1e-3,
          data: list[dict] | None = None):
    """Move `source` onto `anchor` by a function-preserving symmetry; returns (matched, report).

    source, anchor: two nn.Modules, or two save_pretrained folders (then output=DIR is required).
    matching: a matching variant of conf/matching/ (rotation, rotation_no_rescale, attn_only, ffn_only,
    git_rebasin, rotation_heads, full_symmetry, full_symmetry_learned, ...) or a MatchConfig. layers /
    last_layers: match only some layers. data: batches of model inputs (with labels) for the variants that read
    activations or the loss (full_symmetry_learned; modules only).
    """
    config, layers = _check_arguments(source, anchor, matching, output, layers, last_layers, max_relative_output_change,
                                      data)
    if config.needs_data and not data:
        raise SymfusionError("this matching reads the models' activations or loss: give data=[batches of model inputs, "
                             "with labels]")
    try:
        if isinstance(source, torch.nn.Module):
            with _as_given(source, anchor):
                return _align_modules(source, anchor, config, layers, last_layers, max_relative_output_change, data)
        return _align_folders(Path(source), Path(anchor), output, config, layers, last_layers,
                              max_relative_output_change)
    except Exception as error:          # noqa: BLE001 - the system's errors (no space left, ...) become one line
        translated = as_symfusion_error(error)
        if translated is None or translated is error:
            raise
        raise translated from error


def _check_arguments(source, anchor, matching, output, layers, last_layers, tolerance, data) -> tuple:
    """align()'s arguments, each of its type (one SymfusionError line naming the first that is not); (the
    MatchConfig, the layer indices as a list or None)."""
    def refuse(name: str, value, wanted: str):
        raise SymfusionError(f"align(): {name} must be {wanted}, got {type(value).__name__} {str(value)[:60]!r}")
    folder, module = (str, Path), torch.nn.Module
    if not (isinstance(source, module) and isinstance(anchor, module)
            or isinstance(source, folder) and isinstance(anchor, folder)):
        raise SymfusionError(f"align(): source and anchor must be two nn.Modules or two model folders, got "
                             f"{type(source).__name__} and {type(anchor).__name__}")
    if not isinstance(matching, (str, MatchConfig)):
        refuse("matching", matching, "the name of a matching variant or a MatchConfig")
    if output is not None and not isinstance(output, folder):
        refuse("output", output, "a folder path (str or Path) or None")
    if layers is not None:
        listed = list(layers) if isinstance(layers, Iterable) and not isinstance(layers, (str, bytes, Mapping)) else None
        if listed is None or not all(_is_index(i) for i in listed):
            refuse("layers", layers, "a list of layer indices (integers >= 0) or None")
        layers = listed
    if last_layers is not None and not _is_index(last_layers):
        refuse("last_layers", last_layers, "an integer >= 0 or None")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not math.isfinite(tolerance) \
            or tolerance <= 0:
        refuse("max_relative_output_change", tolerance, "a finite number > 0")
    if data is not None and (not isinstance(data, (list, tuple)) or not all(isinstance(b, Mapping) for b in data)):
        refuse("data", data, "a list of batches (dicts of model inputs) or None")
    if data is not None and not isinstance(source, module):
        refuse("data", data, "None for model folders (data-driven matching reads loaded modules)")
    return (matching_config(matching) if isinstance(matching, str) else matching), layers


def _is_index(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@contextmanager
def _as_given(*modules: torch.nn.Module):
    """The caller's modules come back as they went in: every submodule's train/eval mode and every parameter's
    requires_grad (align() runs them in eval mode, under no_grad, and never writes their weights)."""
    modes = [(m, m.training) for module in modules for m in module.modules()]
    grads = [(p, p.requires_grad) for module in modules for p in module.parameters()]
    try:
        with torch.no_grad():
            yield
    finally:
        for m, training in modes:
            m.training = training
        for p, requires_grad in grads:
            p.requires_grad_(requires_grad)


def _align_modules(source, anchor, config: MatchConfig, layers, last_layers, tolerance: float, data=None):
    notes = check_compatible(source.config, anchor.config)
    dtypes = {p.dtype for p in source.parameters() if p.is_floating_point()}
    # rotate in at least float32: half-precision weights are moved in float32 and rounded once when stored
    state = {k: v.float() if v.is_floating_point() and v.dtype in (torch.float16, torch.bfloat16) else v
             for k, v in source.state_dict().items()}
    anchor_state = anchor.state_dict()
    check_finite(state, "source model")
    check_finite(anchor_state, "anchor model")
    layout = layout_of(source.config, state)
    check_same_layout(layout, layout_of(anchor.config, anchor_state))
    start = time.perf_counter()
    match_data = MatchData(copy.deepcopy(source).float(), list(data)) if data else None
    result = match_models(state, anchor_state, layout, config, layers=layers, last_layers=last_layers, data=match_data,
                          tied=_tied(source))
    moved = apply_transform(state, layout, result.transform)
    seconds = time.perf_counter() - start
    matched = copy.deepcopy(source)
    matched.load_state_dict(moved)                    # cast back to the source's dtypes
    stored = matched.state_dict()
    inputs = probe_inputs(source.config)
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].to(next(source.parameters()).dtype)
    before = model_outputs(source, inputs)
    change = ((model_outputs(matched, inputs) - before).abs().max() / before.abs().max().clamp_min(1e-30)).item()
    limit = tolerance_for(dtypes, tolerance)
    if not change <= limit:                                   # NaN fails too
        raise SymfusionError(f"the matched model changes the source's outputs by {change:.3g} relative (> {limit:.3g}); "
                             "report this as a bug")
    before_dist, after_dist = distance(source.state_dict(), anchor_state, layout), distance(stored, anchor_state, layout)
    report = {
        "family": layout.family, "matching_config": asdict(config),
        "layers": sorted(result.transform.layers), "distance_before": before_dist["total"],
        "distance_after": after_dist["total"], "distance_before_by_module": before_dist,
        "distance_after_by_module": after_dist, "relative_output_change": change, "tolerance": limit,
        "seconds": seconds, "seconds_by_stage": result.seconds, "transform": result.transform,
        "residual": result.residual, "notes": notes,
    }
    return matched.eval(), report


def _tied(model: torch.nn.Module) -> bool:
    """Whether the module's output embeddings are its input embeddings (one parameter)."""
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    weight = getattr(head, "weight", None)
    return weight is not None and weight is getattr(embeddings, "weight", None)


def _align_folders(source: Path, anchor: Path, output, config: MatchConfig, layers, last_layers, tolerance: float):
    for name, path in (("source", source), ("anchor", anchor)):
        if not path.is_dir():
            raise SymfusionError(f"{name}={path}: no such directory")
    if not output:
        raise SymfusionError("align() of two folders needs output=DIR (where the matched folder is written)")
    start, noted = time.perf_counter(), len(NOTES)
    # the same rules as symfusion-match: a new folder, or a previous matched folder; never an input
    with safe_output(output, "symfusion.align", MATCHED_FOLDER, inputs=[source, anchor], is_dir=True) as claim:
        with claim.writing() as tmp:
            if config.residual == "none":
                transform, report = match_folders(source, anchor, output, config, layers=layers, last_layers=last_layers,
                                                  max_relative_output_change=tolerance, tmp=tmp)
            elif layers is not None or last_layers is not None:
                raise SymfusionError(f"matching.residual={config.residual} moves the residual stream of every layer: "
                                     "it matches the whole model (drop layers= / last_layers=)")
            else:
                transform, report = match_folders_whole(source, anchor, output, config,
                                                        max_relative_output_change=tolerance, tmp=tmp)
            report.update({"source": str(source), "anchor": str(anchor), "output": str(output),
                           "matching_config": asdict(config), "seconds": time.perf_counter() - start,
                           "notes": list(dict.fromkeys(NOTES[noted:])), "provenance": provenance(None)})
            transform.save(tmp / "transform.safetensors")
            write_json(report, tmp / "match.json")
    report["transform"] = transform
    return Path(output), report
