"""The match stage (symfusion-match): align() on two model folders, the library's one matching path, with the command's provenance and, for the data-driven variants, its task's batches."""
from __future__ import annotations

from symfusion.alignment.api import align
from symfusion.io.folder import weight_map
from symfusion.io.modelio import load_config, model_class, skeleton_of
from symfusion.io.provenance import provenance
from symfusion.matching import MatchConfig
from symfusion.presets import match_option
from symfusion.pipeline.stages.common import require_folder


def run_match(source: str, anchor: str, output: str, matching: MatchConfig, matching_name: str, layers=None,
              last_layers=None, max_relative_output_change: float = 1e-3, resolved_config: dict | None = None,
              data_task=None, data_batches: int | None = None, data_split: str | None = None) -> dict:
    """Match `source` onto `anchor` and write `output` (the matched folder, match.json, transform.safetensors) as
    align() does; returns the report. data_task: the task whose statistic batches (data_batches of its data_split:
    train or validation, never test; None: symfusion-match's defaults, presets/match.yaml) a data-driven matching
    reads (matching.needs_data), checked against the source model first."""
    data_batches = match_option("data_batches") if data_batches is None else data_batches
    data_split = match_option("data_split") if data_split is None else data_split
    source_dir, anchor_dir = require_folder(source, "source"), require_folder(anchor, "anchor")
    data = origin = None
    if data_task is not None:
        config = load_config(source_dir)            # the model its tensors are (modelio.model_class), on the meta device
        data_task.check_model(skeleton_of(config, source_dir, model_class(config, weight_map(source_dir)[0])),
                              str(source_dir))
        data = data_task.statistic_batches(data_batches, source_dir, data_split)
        origin = {"task": data_task.name, "split": data_split, "batches": len(data)}
    _, report = align(source_dir, anchor_dir, matching, output, layers=layers, last_layers=last_layers,
                      max_relative_output_change=max_relative_output_change, data=data,
                      record={"matching": matching_name, "data": origin, "provenance": provenance(resolved_config)})
    return report
