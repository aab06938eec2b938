"""The data stage: check a task's source and record its fixed, seeded splits (sizes, checksums) as JSON."""
from __future__ import annotations

from dataclasses import dataclass

from symfusion.io.modelio import write_json
from symfusion.io.outputs import file_marker, safe_output
from symfusion.io.provenance import provenance
from symfusion.pipeline.command import PATH, Command, command, option
from symfusion.pipeline.stages.common import resolved, task_of

DATA_MARKER = file_marker(("splits", "split_seed"))


def run_data(task, output: str, resolved_config: dict | None = None) -> dict:
    """The manifest of a task object's splits plus provenance, written to `output`."""
    with safe_output(output, "symfusion-data", DATA_MARKER) as claim:
        manifest = task.manifest()
        manifest["provenance"] = provenance(resolved_config)
        with claim.writing() as tmp:
            write_json(manifest, tmp)
    return manifest


@command("data")
@dataclass(frozen=True)
class Data(Command):
    """symfusion-data task=NAME output=FILE.json"""
    groups = {"task": "fashion_mnist", "profile": "mini"}      # the profile sizes text tasks (smoke shrinks them)
    output: str = option(PATH, "FILE.json: the task's manifest (its fixed splits and their sizes)")

    def run(self, cfg) -> None:
        manifest = run_data(task_of(cfg), self.output, resolved(cfg))
        sizes = ", ".join(f"{k} {v['size']}" for k, v in manifest["splits"].items())
        print(f"data {cfg.task.name}: {sizes} -> {self.output}")
