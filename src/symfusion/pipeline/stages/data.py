"""The data stage: check a task's source and record its fixed, seeded splits (sizes, checksums) as JSON."""
from __future__ import annotations

from symfusion.io.modelio import write_json
from symfusion.io.outputs import file_marker, safe_output
from symfusion.io.provenance import provenance

DATA_MARKER = file_marker(("splits", "split_seed"))


def run_data(task, output: str, resolved_config: dict | None = None) -> dict:
    """The manifest of a task object's splits plus provenance, written to `output`."""
    with safe_output(output, "symfusion-data", DATA_MARKER) as claim:
        manifest = task.manifest()
        manifest["provenance"] = provenance(resolved_config)
        with claim.writing() as tmp:
            write_json(manifest, tmp)
    return manifest
