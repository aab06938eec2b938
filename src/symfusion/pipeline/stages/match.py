"""The match stage (symfusion-match): align() on two model folders, the library's one matching path, with the command's provenance and, for the data-driven variants, its task's batches."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from symfusion.alignment.api import align
from symfusion.errors import note
from symfusion.io.folder import weight_map
from symfusion.io.modelio import load_config, model_class, skeleton_of
from symfusion.io.provenance import provenance
from symfusion.matching import MatchConfig, matching_config
from symfusion.pipeline.command import PATH, Command, choice, command, integer, listing, number, option, text
from symfusion.pipeline.config import check_data_options
from symfusion.pipeline.stages.common import match_config, require_folder, resolved, task_of


def run_match(source: str, anchor: str, output: str, matching: MatchConfig, matching_name: str, layers=None,
              last_layers=None, max_relative_output_change: float = 1e-3, resolved_config: dict | None = None,
              data_task=None, data_batches: int | None = None, data_split: str | None = None) -> dict:
    """Match `source` onto `anchor` and write `output` (the matched folder, match.json, transform.safetensors) as
    align() does; returns the report. data_task: the task whose statistic batches (data_batches of its data_split:
    train or validation, never test; None: symfusion-match's defaults, Match below) a data-driven matching
    reads (matching.needs_data), checked against the source model first."""
    data_batches = Match.data_batches if data_batches is None else data_batches
    data_split = Match.data_split if data_split is None else data_split
    source_dir, anchor_dir = require_folder(source, "source"), require_folder(anchor, "anchor")
    data, origin = task_data(data_task, [source_dir], data_batches, data_split)
    _, report = align(source_dir, anchor_dir, matching, output, layers=layers, last_layers=last_layers,
                      max_relative_output_change=max_relative_output_change, data=data,
                      record={"matching": matching_name, "data": origin, "provenance": provenance(resolved_config)})
    return report


def task_data(data_task, folders: list[Path], batches: int, split: str) -> tuple[list | None, dict | None]:
    """(data_task's statistic batches: `batches` of its `split`, read for the first folder's model; where they came
    from, for the report), each folder's model checked against the task first (one error line); (None, None) for no
    task."""
    if data_task is None:
        return None, None
    for folder in folders:
        config = load_config(folder)            # the model its tensors are (modelio.model_class), on the meta device
        data_task.check_model(skeleton_of(config, folder, model_class(config, weight_map(folder)[0])), str(folder))
    data = data_task.statistic_batches(batches, folders[0], split)
    return data, {"task": data_task.name, "split": split, "batches": len(data)}


# The data options of a command that reads a task's batches for a data-driven matching (symfusion-match,
# symfusion-align-many): option(*DATA_TASK) ...
DATA_TASK = (text(optional=True), "the task whose statistic batches a matching that reads activations or the loss "
             "reads (matching.residual_solve=activations, matching.refine=loss)")
# The learned refinement takes one batch per step: 200 distinct train batches lower the mini ViTs' learned
# barrier against 16 validation batches (reused) over 3 pairs, at the same cost (docs/matching.md).
DATA_BATCHES = (integer(1), "how many batches of the task's fusion_batch_size examples (a smaller split gives what "
                "it has)", 200)
DATA_SPLIT = (choice("validation", "train"), "which split they come from (never test)", "train")
# The functional check's tolerance of a command that writes moved models (symfusion-match, symfusion-align-many).
MAX_RELATIVE_OUTPUT_CHANGE = (number(0, strict_low=True), "refuse a moved model whose outputs differ from its source's "
                              "by more than this, relative to the largest output magnitude (a symmetry must not change "
                              "the function)", 1.0e-3)


@command("match")
@dataclass(frozen=True)
class Match(Command):
    """symfusion-match source=DIR anchor=DIR output=DIR matching=NAME [layers=[..] | last_layers=K]"""
    # the matching preset (presets/matching/); the profile, where the checkout has one, sizes the data_task
    groups = {"matching": "rotation", "optional profile": "mini"}
    library = True          # the library's command: `pip install symfusion` has it, no checkout needed
    source: str = option(PATH, "save_pretrained folder of the model that is moved")
    anchor: str = option(PATH, "save_pretrained folder of the model that stays fixed")
    output: str = option(PATH, "DIR written atomically: matched model, match.json, transform.safetensors")
    layers: list[int] | None = option(listing(integer(0), optional=True),
                                      "explicit layer indices to match, e.g. [0,5]; null: all")
    last_layers: int | None = option(integer(0, optional=True), "or: match only the last K layers")
    max_relative_output_change: float = option(*MAX_RELATIVE_OUTPUT_CHANGE)
    data_task: str | None = option(*DATA_TASK)
    data_batches: int = option(*DATA_BATCHES)
    data_split: str = option(*DATA_SPLIT)

    def check(self, cfg, given: set[str]) -> None:
        check_data_options(cfg, match_config(cfg), given)

    def run(self, cfg) -> None:
        name, matching = cfg.matching.name, match_config(cfg)
        if matching_config(name) != matching:
            note(f"note: matching={name} overridden to {matching}")
        report = run_match(
            source=self.source, anchor=self.anchor, output=self.output, matching=matching, matching_name=name,
            layers=self.layers, last_layers=self.last_layers,
            max_relative_output_change=self.max_relative_output_change, resolved_config=resolved(cfg),
            data_task=task_of(cfg, self.data_task) if matching.needs_data else None, data_batches=self.data_batches,
            data_split=self.data_split)
        check = report.get("relative_output_change", report.get("max_block_relative_output_change"))
        print(f"matched {report['source']} onto {report['anchor']} ({name}): distance "
              f"{report['distance_before']:.4f} -> {report['distance_after']:.4f}, "
              f"relative output change {check:.2e}, {report['seconds']:.2f}s -> {report['output']}")
