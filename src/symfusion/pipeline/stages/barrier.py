"""The barrier stage: loss and accuracy along the linear path between an anchor and a (matched) source folder."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from symfusion.interpolation import loss_path
from symfusion.io.modelio import compute_device, write_json
from symfusion.io.outputs import file_marker, safe_output
from symfusion.io.provenance import provenance
from symfusion.pipeline.command import PATH, SPLIT, Command, command, integer, option
from symfusion.pipeline.stages.common import load_models, matching_of, resolved, task_of
from symfusion.pipeline.training import evaluation_precision

BARRIER_MARKER = file_marker(("path", "barrier"))


def run_barrier(anchor: str, source: str, task, output: str, points: int = 11, split: str = "test",
                resolved_config: dict | None = None, examples: int | None = None) -> dict:
    """The loss path between `anchor` and `source` on a task object's split, as JSON (`examples`: a seeded
    subset of the split; 11 points x 4 paths x 10,000 images is slow on a laptop)."""
    with safe_output(output, "symfusion-barrier", BARRIER_MARKER, inputs=[anchor, source]) as claim:
        anchor_model, source_model = load_models([anchor, source])
        anchor_state = {k: v.detach().clone() for k, v in anchor_model.state_dict().items()}
        source_state = {k: v.detach().clone() for k, v in source_model.state_dict().items()}
        device = compute_device()
        source_model.to(device)                 # the path's evaluations on the GPU when one is visible, in float32
        start = time.perf_counter()
        with evaluation_precision("auto", device):
            result = loss_path(source_model, anchor_state, source_state,
                               lambda m: task.evaluate(m, split, model_dir=source, examples=examples), points)
        report = {
            "anchor": anchor, "source": source, "matching": matching_of(Path(source)), "task": task.name,
            "split": split, "examples": examples, **result, "seconds": time.perf_counter() - start,
            "provenance": provenance(resolved_config),
        }
        with claim.writing() as tmp:
            write_json(report, tmp)
    return report


@command("barrier")
@dataclass(frozen=True)
class Barrier(Command):
    """symfusion-barrier task=NAME anchor=DIR source=DIR output=FILE.json [points=11]"""
    groups = {"task": "fashion_mnist", "profile": "mini"}    # the profile: where the task's data come from, its size
    anchor: str = option(PATH, "the model at alpha 0")
    source: str = option(PATH, "the model at alpha 1, usually a matched folder (symfusion-match's output)")
    output: str = option(PATH, "FILE.json: the loss along the path")
    points: int = option(integer(2), "points of the path, alphas 0 .. 1 evenly spaced", 11)
    split: str = option(SPLIT, "the split evaluated", "test")
    examples: int | None = option(integer(1, optional=True), "a seeded subset of N examples of the split; null: all")

    def run(self, cfg) -> None:
        report = run_barrier(self.anchor, self.source, task_of(cfg), self.output, self.points, self.split,
                             resolved(cfg), examples=self.examples)
        print(f"barrier {report['matching']}: {report['barrier']:.4f} -> {self.output}")
