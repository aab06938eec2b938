"""The align-many stage (symfusion-align-many): align_many() on k model folders, written as k standard folders in one shared basis and many.json, with the command's provenance and, for the learned k-way refinement, its task's batches.

DIR receives, atomically, model_0 .. model_{k-1} (each a standard folder in its source's layout and dtypes, with
transform.safetensors) and many.json (the report); a previous output of this command is replaced, anything else is
refused. A plain average of the k folders' weights (mergekit's linear merge) is then the centroid merge.
"""
from __future__ import annotations

from dataclasses import dataclass

from symfusion.errors import note
from symfusion.io.provenance import provenance
from symfusion.many import align_many, k_way_matching
from symfusion.matching import matching_config
from symfusion.matching.universe import MAX_ROUNDS
from symfusion.pipeline.command import PATH, Command, command, integer, listing, option, text
from symfusion.pipeline.config import check_data_options
from symfusion.pipeline.stages.common import match_config, require_folder, resolved, task_of
from symfusion.pipeline.stages.match import (DATA_BATCHES, DATA_SPLIT, DATA_TASK, MAX_RELATIVE_OUTPUT_CHANGE,
                                              task_data)


@command("align-many")
@dataclass(frozen=True)
class AlignMany(Command):
    """symfusion-align-many models=[DIR,DIR,...] output=DIR [matching=NAME] [max_rounds=N] [data_task=TASK]"""
    # the matching preset (presets/matching/); the profile, where the checkout has one, sizes the data_task
    groups = {"matching": "full_symmetry", "optional profile": "mini"}
    library = True          # the library's command: `pip install symfusion` has it, no checkout needed
    models: list[str] = option(listing(text(), 2), "k >= 2 model folders of one family and shapes (save_pretrained, "
                               "safetensors); all k move to one shared basis")
    output: str = option(PATH, "DIR written atomically: model_0 .. model_{k-1} (each with transform.safetensors) and "
                         "many.json")
    max_rounds: int = option(integer(0), "rounds of the alternation after the data-free start (each k pairwise "
                             "solves)", MAX_ROUNDS)
    max_relative_output_change: float = option(*MAX_RELATIVE_OUTPUT_CHANGE)
    data_task: str | None = option(*DATA_TASK)
    data_batches: int = option(*DATA_BATCHES)
    data_split: str = option(*DATA_SPLIT)

    def check(self, cfg, given: set[str]) -> None:
        matching = match_config(cfg)
        k_way_matching(matching, cfg.matching.name)           # what no data makes possible, first
        check_data_options(cfg, matching, given)

    def run(self, cfg) -> None:
        name, matching = cfg.matching.name, match_config(cfg)
        if matching_config(name) != matching:
            note(f"note: matching={name} overridden to {matching}")
        folders = [require_folder(m, f"models[{i}]") for i, m in enumerate(self.models)]
        data_task = task_of(cfg, self.data_task) if matching.needs_data else None
        data, origin = task_data(data_task, folders, self.data_batches, self.data_split)
        written, report = align_many([str(f) for f in folders], matching=matching, output=self.output,
                                     max_relative_output_change=self.max_relative_output_change,
                                     max_rounds=self.max_rounds, data=data,
                                     record={"matching": name, "data": origin, "provenance": provenance(resolved(cfg))})
        objective, refine = report["objective"], report.get("refine")
        learned = f"; refined on {refine['inputs'].split(' (')[0]}: centroid loss " \
                  f"{refine['centroid_loss_before']:.4g} -> {refine['centroid_loss_after']:.4g}, kept {refine['kept']}" \
            if refine else ""
        print(f"wrote {len(written)} aligned folders to {self.output} ({name}; J {objective[0]:.6g} -> "
              f"{objective[-1]:.6g} in {len(report['rounds'])} rounds, {report['stop']}{learned}; "
              f"{report['seconds_total']:.1f} s in all)")
