"""Provenance fields every result JSON carries: git commit, package versions, machine."""
from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

PACKAGES = ("symfusion", "torch", "transformers", "safetensors", "numpy", "scipy", "pot", "hydra-core")


def git_state(cwd: str | Path | None = None) -> dict:
    cwd = cwd or Path(__file__).resolve().parent
    def git(*args):
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}
    if commit.returncode != 0:
        return {"commit": None, "dirty": None}
    return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}


def package_versions() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The CPU's vendor, family, model and name ("GenuineIntel family 6 model 167: Intel(R) Xeon(R) Processor"), from
    the first processor of /proc/cpuinfo; None where there is none. The vendor matters: MKL computes otherwise on
    Intel and AMD CPUs, capped or not (docs/reproduce.md#determinism)."""
    fields = {}
    try:
        with open(cpuinfo) as handle:
            for line in handle:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return None
    if "vendor_id" not in fields:
        return None
    return (f"{fields['vendor_id']} family {fields.get('cpu family', '?')} model {fields.get('model', '?')}: "
            f"{fields.get('model name', '?')}")


def machine() -> dict:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu": cpu_model(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),   # torch's CPU kernels: AVX2 in a portable run
        "mkl_cbwr": os.environ.get("MKL_CBWR"),     # COMPATIBLE in a run portable across vendors
    }


def provenance(config: dict | None = None, seed: int | None = None) -> dict:
    return {"config": config, "seed": seed, "git": git_state(), "packages": package_versions(), "machine": machine()}
