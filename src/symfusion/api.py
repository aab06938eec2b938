"""symfusion.align(): move a source model onto an anchor model from Python, given nn.Modules or model folders.

    matched, report = symfusion.align(source, anchor, matching="rotation")

- Two nn.Modules (transformers models of one supported family): `matched` is a new module (the
  source is left as it is) that computes the source's function, checked on probe inputs.
- Two save_pretrained folders: output=DIR is required; the matched folder is written atomically,
  keeping the source's shard layout, index, key names and dtypes, so transformers, mergekit or FusionBench
  read it as a normal folder; `matched` is the output path. Block matchings go layer by layer from
  memory-mapped shards (io/sharded.py: any model size, each block checked, and the whole model's outputs when
  it is small); the whole-group variants likewise (io/sharded_whole.py) unless the pair fits in memory
  (in_memory=None: both under io.checks.WHOLE_MODEL_CHECK_BYTES in float32), where they run as for two
  nn.Modules (io/loaded.py); the data-driven variants load both models (they run them on `data`).
symfusion-match is this function on folders. The report is one format for every entry (a folder's match.json):
the matching, the parameters' distance before and after (total and by module type; tied tensors once), the
functional check, seconds per stage and the transform (a symmetry.Transform; folders also get
transform.safetensors).
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from symfusion.errors import SymfusionError, as_symfusion_error
from symfusion.io.checks import WHOLE_MODEL_CHECK_BYTES
from symfusion.io.loaded import match_folders_in_memory, match_modules
from symfusion.io.modelio import write_json
from symfusion.io.outputs import folder_marker, safe_output
from symfusion.io.provenance import provenance
from symfusion.io.sharded import ShardedFolder, match_folders
from symfusion.io.sharded_whole import match_folders_whole
from symfusion.matching import MatchConfig, matching_config
from symfusion.presets import preset_names

# A matched folder (of align() or symfusion-match): it holds a match report.
MATCHED_FOLDER = folder_marker("match.json", ("distance_after",))
WRITER = "symfusion-match / align()"


def align(source, anchor, matching: MatchConfig | str = "rotation", output: str | Path | None = None,
          layers=None, last_layers: int | None = None, max_relative_output_change: float = 1e-3,
          data: list[dict] | None = None, in_memory: bool | None = None, record: dict | None = None):
    """Move `source` onto `anchor` by a function-preserving symmetry; returns (matched, report).

    source, anchor: two nn.Modules, or two save_pretrained folders (then output=DIR is required).
    matching: a matching preset (symfusion/presets/matching/: rotation, rotation_no_rescale, attn_only, ffn_only,
    git_rebasin, rotation_heads, full_symmetry, full_symmetry_learned, ...) or a MatchConfig. layers /
    last_layers: match only some layers. data: batches of model inputs (with labels) for the variants that read
    activations or the loss (full_symmetry_learned). in_memory (folders, whole-group variants): True loads both
    models, False streams their layers, None loads them when they are small. record: more fields for the report
    (a command's provenance, where its data came from).
    """
    config = matching_config(matching) if isinstance(matching, str) else matching
    if not isinstance(config, MatchConfig):
        raise SymfusionError(f"matching= takes a preset name or a MatchConfig, got {type(matching).__name__}")
    if config.needs_data and not data:
        raise SymfusionError("this matching reads the models' activations or loss: give data=[batches of model inputs, "
                             "with labels]")
    name = matching if isinstance(matching, str) else preset_of(config)
    try:
        if isinstance(source, torch.nn.Module) and isinstance(anchor, torch.nn.Module):
            matched, transform, fields = match_modules(source, anchor, config, layers, last_layers,
                                                       max_relative_output_change, data)
            return matched, {**report_of(name, config, fields, transform, data), **(record or {}),
                             "transform": transform}
        if isinstance(source, (str, Path)) and isinstance(anchor, (str, Path)):
            return _align_folders(Path(source), Path(anchor), output, config, name, layers, last_layers,
                                  max_relative_output_change, data, in_memory, record)
    except Exception as error:          # noqa: BLE001 - the system's errors (no space left, ...) become one line
        translated = as_symfusion_error(error)
        if translated is None or translated is error:
            raise
        raise translated from error
    raise SymfusionError(
        f"align() takes two nn.Modules or two model folders, got {type(source).__name__} and {type(anchor).__name__}"
    )


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


def report_of(name: str | None, config: MatchConfig, fields: dict, transform, data) -> dict:
    """The match report, one format for modules and folders (a folder's match.json adds where it was written)."""
    return {"matching": name, "matching_config": config.as_report(), "family": fields.pop("family"),
            "layers": fields.pop("layers"), **fields, "scales": _scale_summary(transform),
            "data": None if not data else {"batches": len(data)}}


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
    start = time.perf_counter()
    # a new folder, or a previous matched folder; never an input
    with safe_output(output, WRITER, MATCHED_FOLDER, inputs=[source, anchor], is_dir=True) as claim:
        with claim.writing() as tmp:
            if config.needs_data or (config.residual != "none" and (
                    in_memory or (in_memory is None and _fits_in_memory(source, anchor)))):
                transform, fields = match_folders_in_memory(source, anchor, output, config, layers, last_layers,
                                                            tolerance, data, tmp=tmp)
            elif config.residual == "none":
                transform, fields = match_folders(source, anchor, output, config, layers=layers,
                                                  last_layers=last_layers, max_relative_output_change=tolerance, tmp=tmp)
            else:
                transform, fields = match_folders_whole(source, anchor, output, config,
                                                        max_relative_output_change=tolerance, tmp=tmp)
            report = {"source": str(source), "anchor": str(anchor), "output": str(output),
                      **report_of(name, config, fields, transform, data), "seconds": time.perf_counter() - start,
                      "provenance": provenance(None), **(record or {})}
            transform.save(tmp / "transform.safetensors")
            write_json(report, tmp / "match.json")
    report["transform"] = transform
    return Path(output), report
