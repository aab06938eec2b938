"""mergekit as a merge client: the simple (linear) merge of model folders done by mergekit's own `mergekit-yaml` CLI.

symfusion-merge ... methods=[simple] client=mergekit runs it instead of symfusion's own average: mergekit reads the
folders as symfusion wrote them (absolute paths, offline, no model card, no tokenizer copy), its merged folder is
loaded back and evaluated as symfusion's merges are, and the report records how far its weights are from
symfusion's simple merge of the same models (float32: within float32 rounding). mergekit is the `merge` extra
(pip install 'symfusion[merge]'); without it this is one `error:` line.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from symfusion.errors import SymfusionError
from symfusion.fusion import merge_models
from symfusion.io.modelio import load_model

CLIENTS = ("symfusion", "mergekit")
MERGEKIT_CLI = "mergekit-yaml"
MERGEKIT_METHODS = {"simple": "linear"}        # symfusion's method -> the mergekit merge_method that computes it
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def mergekit_cli() -> str:
    """The mergekit-yaml executable: beside this Python (its environment's bin), else on PATH; or one error line."""
    beside = Path(sys.executable).parent / MERGEKIT_CLI
    found = str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which(MERGEKIT_CLI)
    if not found:
        raise SymfusionError(f"client=mergekit: {MERGEKIT_CLI} is not installed (beside {sys.executable} nor on PATH); "
                             "pip install 'symfusion[merge]' (scripts/setup.sh does), or merge with client=symfusion")
    return found


def check_client(client: str, methods: list[str]) -> None:
    """A known client, and for mergekit only the methods it computes as symfusion does."""
    if client not in CLIENTS:
        raise SymfusionError(f"client={client!r}; choose one of {', '.join(CLIENTS)}")
    if client == "mergekit":
        other = [m for m in methods if m not in MERGEKIT_METHODS]
        if other:
            raise SymfusionError(f"client=mergekit merges {', '.join(MERGEKIT_METHODS)} only, not {other[0]}; give "
                                 "methods=[simple] (or merge by symfusion, client=symfusion)")


def mergekit_config(method: str, models: list[str]) -> dict:
    """mergekit's YAML (as JSON) of an equal-weight merge of `models` in float32, by absolute paths."""
    weight = 1.0 / len(models)
    return {"merge_method": MERGEKIT_METHODS[method], "dtype": "float32",
            "models": [{"model": str(Path(m).resolve()), "parameters": {"weight": weight}} for m in models]}


def merge_by_mergekit(method: str, models: list[str], loaded: list[torch.nn.Module]) -> tuple[torch.nn.Module, dict]:
    """(the merged model as mergekit wrote it, on the CPU; the part of the merge report about mergekit) of the model
    folders `models` (anchor first; `loaded`: the same models, for the comparison with symfusion's merge)."""
    cli = mergekit_cli()
    config = mergekit_config(method, models)
    with tempfile.TemporaryDirectory(prefix="symfusion-mergekit-") as scratch:
        config_file, output = Path(scratch) / "merge.yml", Path(scratch) / "merged"
        config_file.write_text(json.dumps(config, indent=2))          # YAML is a superset of JSON
        command = [cli, str(config_file), str(output), "--no-write-model-card", "--no-copy-tokenizer"]
        start = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **OFFLINE})
        except OSError as error:
            raise SymfusionError(f"client=mergekit: cannot run {cli} ({error.strerror})") from error
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            last = next((line for line in reversed(done.stderr.splitlines()) if line.strip()), "no output")
            raise SymfusionError(f"client=mergekit: {MERGEKIT_CLI} failed (exit {done.returncode}): {last.strip()}")
        merged = load_model(output)
    expected = merge_models(method, [m.to("cpu") for m in loaded])
    state = merged.state_dict()
    if set(state) != set(expected):
        raise SymfusionError(f"client=mergekit: its merged model has other tensors than {models[0]}; "
                             "mergekit read the folders differently")
    differences = {k: (state[k] - v).abs() for k, v in expected.items() if v.numel()}
    worst = max(float(d.max()) for d in differences.values())
    rounding = torch.finfo(torch.float32).eps         # one float32 ulp, relative: what the two may differ by
    within = all(bool((d <= rounding * expected[k].abs()).all()) for k, d in differences.items())
    report = {"client": "mergekit", "seconds": seconds,
              "mergekit": {"command": [MERGEKIT_CLI, "CONFIG", "OUTPUT", *command[3:]], "config": config,
                           "max_abs_difference_vs_symfusion": worst,
                           "within_float32_rounding_of_symfusion": within}}
    return merged, report
