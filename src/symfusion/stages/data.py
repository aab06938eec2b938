"""The data stage: check a task's source and record its fixed, seeded splits (sizes, checksums) as JSON."""
from __future__ import annotations

from symfusion.errors import SymfusionError
from symfusion.modelio import write_json_atomic
from symfusion.provenance import provenance


def run_data(task, output: str, resolved_config: dict | None = None) -> dict:
    """The manifest of a task object's splits plus provenance, written to `output`."""
    if not output:
        raise SymfusionError("output=FILE.json is required")
    manifest = task.manifest()
    manifest["provenance"] = provenance(resolved_config)
    write_json_atomic(manifest, output)
    return manifest
