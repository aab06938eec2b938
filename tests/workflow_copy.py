"""A scratch copy of the workflow for tests that change a profile, a preset or the registry: conf/ and the library's
presets copied, workflow/ and the rest of src/symfusion linked.

Snakemake runs in the copy's folder (its .snakemake/ stays there); the stage commands come from this Python's
environment. `stderr_lines` drops Snakemake's own notice that it reads workflow/profiles/default.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PROFILE_NOTICE = "Using workflow specific profile"


def scratch_workflow(folder: Path) -> Path:
    """folder/{conf and src/symfusion/presets (copies), workflow and every other entry of src/symfusion -> the
    repository's}; returns folder."""
    shutil.copytree(ROOT / "conf", folder / "conf")
    (folder / "workflow").symlink_to(ROOT / "workflow")
    package = folder / "src" / "symfusion"
    package.mkdir(parents=True)
    for entry in (ROOT / "src" / "symfusion").iterdir():
        if entry.name == "presets":
            shutil.copytree(entry, package / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
        elif entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    return folder


def edit_yaml(path: Path, change) -> None:
    """Rewrite a yaml file with `change(data)` applied (in the scratch copy)."""
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def snakemake(folder: Path, *args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """`snakemake ARGS` in `folder`, with this Python's environment (its bin/ first on PATH: symfusion-*)."""
    bin_dir = str(Path(sys.executable).parent)
    environment = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
                   "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=folder, capture_output=True, text=True,
                          timeout=timeout, env=environment)


def stderr_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.strip().splitlines() if line.strip() and not line.startswith(PROFILE_NOTICE)]


def dry_run_jobs(stdout: str) -> dict[str, list[dict]]:
    """rule -> its jobs' {output, input} (lists of paths) from `snakemake -n` output."""
    jobs = {}
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", stdout):
        found = re.match(r"(?:local)?rule (\w+):", block)
        if not found:
            continue
        fields = {key: [p for p in value.split(", ") if p]
                  for key, value in re.findall(r"^\s+(input|output): (.*)$", block, re.M)}
        jobs.setdefault(found.group(1), []).append({"input": fields.get("input", []), "output": fields.get("output", [])})
    return jobs
