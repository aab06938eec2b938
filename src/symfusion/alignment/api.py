"""symfusion.align(): move a source model onto an anchor model from Python, given nn.Modules or model folders.

    matched, report = symfusion.align(source, anchor, matching="rotation")

- Two nn.Modules (transformers models of one supported family): `matched` is a new module (the
  source is left as it is) that computes the source's function, checked on probe inputs.
- Two save_pretrained folders: output=DIR is required; the matched folder is written atomically,
  keeping the source's shard layout, index, key names and dtypes, so transformers, mergekit or FusionBench
  read it as a normal folder; `matched` is the output path. Block matchings go layer by layer from
  memory-mapped shards (alignment/sharded.py: any model size, each block checked, and the whole model's outputs when
  it is small); the whole-group variants likewise (alignment/sharded_whole.py) unless the pair fits in memory
  (in_memory=None: both under alignment.checks.WHOLE_MODEL_CHECK_BYTES in float32), where they run as for two
  nn.Modules (alignment/loaded.py); the variants that run the models load both (on `data`, or refine=synthetic on its own
  inputs).
symfusion-match is this function on folders. The report is one format for every entry (a folder's match.json):
the matching, the parameters' distance before and after (total and by module type; tied tensors once), the
functional check, seconds per stage and the transform (a symmetry.Transform; folders also get
transform.safetensors).
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch

from symfusion.errors import NOTES, SymfusionError, library_call
from symfusion.alignment.checks import WHOLE_MODEL_CHECK_BYTES
from symfusion.alignment.loaded import match_folders_in_memory, match_modules
from symfusion.io.modelio import write_json
from symfusion.io.outputs import folder_marker, safe_output
from symfusion.io.provenance import provenance
from symfusion.alignment.sharded import ShardedFolder, match_folders
from symfusion.alignment.sharded_whole import match_folders_whole
from symfusion.matching import MatchConfig, matching_config
from symfusion.presets import preset_names

# A matched folder (of align() or symfusion-match): it holds a match report.
MATCHED_FOLDER = folder_marker("match.json", ("distance_after",))
WRITER = "symfusion-match / align()"


def align(source, anchor, matching: MatchConfig | str = "rotation", output: str | Path | None = None,
          layers=None, last_layers: int | None = None, max_relative_output_change: float = 1e-3,
          data: list[dict] | None = None, in_memory: bool | None = None, record: dict | None = None,
          progress: bool | None = None):
    """Move `source` onto `anchor` by a function-preserving symmetry; returns (matched, report).

    source, anchor: two nn.Modules, or two save_pretrained folders (then output=DIR is required).
    matching: a matching preset (symfusion/presets/matching/: rotation, rotation_no_rescale, attn_only, ffn_only,
    git_rebasin, rotation_heads, full_symmetry, full_symmetry_learned, full_symmetry_synthetic (no data), ...) or
    a MatchConfig. layers / last_layers: match only some layers. data: batches of model inputs (with labels) for
    the variants that read activations or the loss (full_symmetry_learned), refused by the others. in_memory
    (folders, whole-group variants): True loads both models, False streams their layers, None loads them when they
    are small. record: more fields for the report (a command's provenance, where its data came from). progress: a bar
    with the time left on stderr per layer and per descent pass (None: on when stderr is a terminal, or as
    SYMFUSION_PROGRESS says; progress never changes the result).
    """
    config, layers = _check_arguments(source, anchor, matching, output, layers, last_layers, max_relative_output_change,
                                      data, in_memory, record, progress)
    if config.needs_data and not data:
        raise SymfusionError("this matching reads the models' activations or loss: give data=[batches of model inputs, "
                             "with labels]")
    if data and not config.needs_data:      # it would be unread, and the report would say it was given
        raise SymfusionError(f"this matching {config.reads}, no data: leave data out, or choose one that reads it "
                             "(full_symmetry_learned)")
    name = matching if isinstance(matching, str) else preset_of(config)
    with library_call(progress):
        return _align(source, anchor, config, name, output, layers, last_layers, max_relative_output_change, data,
                      in_memory, record)


def _align(source, anchor, config: MatchConfig, name, output, layers, last_layers, tolerance: float, data, in_memory,
           record):
    """align() once its arguments are checked."""
    if isinstance(source, torch.nn.Module):
        noted = len(NOTES)
        with _as_given(source, anchor):
            matched, transform, fields = match_modules(source, anchor, config, layers, last_layers, tolerance, data)
        return matched, {**report_of(name, config, fields, transform, data, NOTES[noted:]), **(record or {}),
                         "transform": transform}
    return _align_folders(Path(source), Path(anchor), output, config, name, layers, last_layers, tolerance, data,
                          in_memory, record)


def _check_arguments(source, anchor, matching, output, layers, last_layers, tolerance, data, in_memory,
                     record, progress) -> tuple:
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
    if in_memory is not None and not isinstance(in_memory, bool):
        refuse("in_memory", in_memory, "True, False or None")
    if record is not None and not (isinstance(record, Mapping) and all(isinstance(k, str) for k in record)):
        refuse("record", record, "a dict of report fields (str keys) or None")
    if progress is not None and not isinstance(progress, bool):
        refuse("progress", progress, "True, False or None")
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


def preset_of(config: MatchConfig) -> str | None:
    """The name of the matching preset that is this configuration, if one is."""
    return next((n for n in preset_names("matching") if matching_config(n) == config), None)


def _scale_summary(transform) -> dict:
    """How far the rescaling moved away from 1, over all heads (a is usually close to 1)."""
    scales = [s for t in transform.layers.values() for s in (t.a_qk, t.a_vo) if s is not None]
    if not scales:
        return {}
    flat = torch.cat(scales)
    return {"min": flat.min().item(), "max": flat.max().item(), "mean_abs_log": flat.abs().log().abs().mean().item()}


def report_of(name: str | None, config: MatchConfig, fields: dict, transform, data, notes=()) -> dict:
    """The match report, one format for modules and folders (a folder's match.json adds where it was written);
    notes: the config differences matching proceeded with (families.FUNCTION_FIELDS), each once."""
    return {"matching": name, "matching_config": config.as_report(), "family": fields.pop("family"),
            "layers": fields.pop("layers"), **fields, "scales": _scale_summary(transform),
            "data": None if not data else {"batches": len(data)}, "notes": list(dict.fromkeys(notes))}


def _fits_in_memory(source: Path, anchor: Path) -> bool:
    return all(sum(t.numel() * 4 for t in ShardedFolder(p).meta_state().values()) <= WHOLE_MODEL_CHECK_BYTES
               for p in (source, anchor))


def _align_folders(source: Path, anchor: Path, output, config: MatchConfig, name, layers, last_layers,
                   tolerance: float, data, in_memory, record):
    for role, path in (("source", source), ("anchor", anchor)):
        if not path.is_dir():
            raise SymfusionError(f"{role}={path}: no such directory")
    if not output:
        raise SymfusionError("align() of two folders needs output=DIR (where the matched folder is written)")
    if config.residual != "none" and (layers is not None or last_layers is not None):
        raise SymfusionError(f"matching.residual={config.residual} moves the residual stream of every layer: "
                             "it matches the whole model (drop layers= / last_layers=)")
    if config.untie and in_memory is False:
        raise SymfusionError("matching.untie=true builds the untied models in memory: leave in_memory unset (or True)")
    start, noted = time.perf_counter(), len(NOTES)
    # a new folder, or a previous matched folder; never an input
    with safe_output(output, WRITER, MATCHED_FOLDER, inputs=[source, anchor], is_dir=True) as claim:
        with claim.writing() as tmp:
            if config.runs_models or config.untie or (config.residual != "none" and (
                    in_memory or (in_memory is None and _fits_in_memory(source, anchor)))):
                transform, fields = match_folders_in_memory(source, anchor, output, config, layers, last_layers,
                                                            tolerance, data, tmp=tmp)
            elif config.residual == "none":
                transform, fields = match_folders(source, anchor, output, config, layers=layers,
                                                  last_layers=last_layers, max_relative_output_change=tolerance, tmp=tmp)
            else:
                transform, fields = match_folders_whole(source, anchor, output, config,
                                                        max_relative_output_change=tolerance, tmp=tmp)
            saving = time.perf_counter()
            transform.save(tmp / "transform.safetensors")
            stages = fields.setdefault("seconds_by_stage", {})       # every stage a user waits for, writing included
            stages["write"] = stages.get("write", 0.0) + time.perf_counter() - saving
            report = {"source": str(source), "anchor": str(anchor), "output": str(output),
                      **report_of(name, config, fields, transform, data, NOTES[noted:]),
                      "seconds": time.perf_counter() - start, "provenance": provenance(None), **(record or {})}
            write_json(report, tmp / "match.json")
    report["transform"] = transform
    return Path(output), report
