"""The statistics stage: one model's per-model fusion statistics (Fisher F_i, Gram G_i), computed once for every merge that fuses it unmoved.

A merge of Fisher or RegMean computes a statistic for each model it fuses from that model's own
batches. An end model that several merges fuse as it is (the anchor of every matching, and every
model of the unmatched merges) would have the same statistic computed in each of them; this stage
computes it once and writes it as a safetensors file, which `symfusion-merge statistics=[FILE,..]`
reads instead.

A file holds each method's tensors under `<method>/<name>` and, in its metadata, the identity of
each statistic: a sha256 over the method, its statistic options (fusion/options.py), the precision,
and the digests of the model's weights and of the statistic batches. A merge uses a statistic for a
model only when it finds the identity it would compute itself; a given file that fits none of its
models is an error, so a stale or misplaced file cannot change a merge.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from symfusion.errors import SymfusionError
from symfusion.fusion import FUSION_METHODS, STAGE_KEYS, fusion_config, fusion_method
from symfusion.io.modelio import compute_device, load_model
from symfusion.io.outputs import safe_output
from symfusion.io.provenance import provenance
from symfusion.io.regular import is_regular
from symfusion.pipeline.command import PATH, PRECISION, Command, command, listing, mapping, option, text
from symfusion.pipeline.stages.common import fusion_batches, require_folder, resolved, task_of
from symfusion.pipeline.training import autocast, use_autocast

FORMAT = "symfusion-statistics/1"

# Methods that declare a per-model statistic (the others cannot use a precomputed one).
STATISTIC_METHODS = tuple(name for name, method in FUSION_METHODS.items() if method.statistic is not None)


def _digest_tensors(items, digest) -> None:
    """Feed (name, tensor) pairs into `digest`: name, dtype, shape and bytes of each."""
    for name, tensor in items:
        tensor = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")


def model_digest(model: torch.nn.Module) -> str:
    """sha256 of a model's state dict (names, dtypes, shapes and values, in name order)."""
    digest = hashlib.sha256()
    _digest_tensors(sorted(model.state_dict().items()), digest)
    return digest.hexdigest()


def batches_digest(batches: list[dict]) -> str:
    """sha256 of statistic batches (every tensor by key, in order; other values by their repr)."""
    digest = hashlib.sha256()
    for index, batch in enumerate(batches):
        digest.update(f"batch {index}|".encode())
        for key in sorted(batch):
            value = batch[key]
            if torch.is_tensor(value):
                _digest_tensors([(key, value)], digest)
            else:
                digest.update(f"{key}={value!r}|".encode())
    return digest.hexdigest()


def statistic_identity(method: str, fusion: dict, family: str | None, model_sha: str, batches_sha: str,
                       precision: str) -> str:
    """What a statistic was computed from, as one sha256: method, statistic options, precision (with the
    device type), model, data."""
    options = {k: v for k, v in fusion.items() if k not in STAGE_KEYS}
    settings = fusion_method(method).statistic_settings(options, family)
    record = {"method": method, "settings": settings, "precision": precision, "model": model_sha,
              "batches": batches_sha}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def _open_statistics(path: Path):
    """(an open safetensors handle, its metadata) of a statistics file, None when `path` is not one (a FIFO or a
    device is not opened: io/regular.py)."""
    if not is_regular(path):
        return None
    try:
        handle = safe_open(str(path), framework="pt")
        metadata = handle.metadata() or {}
    except Exception:  # noqa: BLE001 - not a safetensors file at all
        return None
    return (handle, metadata) if metadata.get("format") == FORMAT else None


def is_statistics_file(path: Path) -> bool:
    """A previous output of this stage: a safetensors file with this stage's format in its metadata."""
    return path.is_file() and not path.is_symlink() and _open_statistics(path) is not None


def recorded(metadata: dict, path: Path, keys: list[str]) -> dict[str, tuple[str, float]]:
    """method -> (identity, seconds) of a statistics file's metadata, each method with tensors in the file; a damaged
    record (not JSON, a key or a method's tensors missing, a time that is no number) is one error line."""
    try:
        statistics, seconds = json.loads(metadata["statistics"]), json.loads(metadata["seconds"])
        found = {method: (identity, float(seconds[method])) for method, identity in statistics.items()
                 if isinstance(identity, str) and any(k.startswith(f"{method}/") for k in keys)}
        if not statistics or len(found) != len(statistics):
            raise ValueError("a method without its identity or tensors")
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise SymfusionError(f"{path}: its metadata is damaged ({type(error).__name__}: {str(error)[:60]}); recompute "
                             "it with symfusion-statistics") from error
    return found


class StatisticFiles:
    """Statistics files given to a merge, looked up by identity; each file must serve some model."""

    def __init__(self, paths: list[str] | None):
        self.paths = [Path(p) for p in paths or []]
        self.identities: dict[str, tuple[Path, str, float]] = {}   # identity -> (file, method, seconds)
        self.handles: dict[Path, tuple] = {}                         # file -> (open handle, its tensor keys)
        self.used: set[Path] = set()
        for path in self.paths:
            if not path.is_file():
                raise SymfusionError(f"statistics file {path} does not exist")
            opened = _open_statistics(path)
            if opened is None:
                raise SymfusionError(f"{path} is not a statistics file of symfusion-statistics")
            handle, metadata = opened
            self.handles[path] = (handle, list(handle.keys()))
            for method, (identity, seconds) in recorded(metadata, path, self.handles[path][1]).items():
                self.identities[identity] = (path, method, seconds)

    def lookup(self, identity: str) -> tuple[dict, float] | None:
        """(the statistic with this identity as tensors by name, the seconds it took to compute), or None
        when no file holds it."""
        if identity not in self.identities:
            return None
        path, method, seconds = self.identities[identity]
        self.used.add(path)
        handle, keys = self.handles[path]
        prefix = f"{method}/"
        return {key[len(prefix):]: handle.get_tensor(key) for key in keys if key.startswith(prefix)}, seconds

    def check_all_used(self) -> None:
        """Raise naming a given file that served no model (other weights, data, options or precision)."""
        unused = [p for p in self.paths if p not in self.used]
        if unused:
            raise SymfusionError(f"statistics file {unused[0]} fits none of the models of this merge (computed from "
                                 "other weights, data, options or precision, or for methods this merge does not "
                                 "run); recompute it with symfusion-statistics or leave it out")


def run_statistics(model_dir: str, fusions: list[dict], task, output: str, resolved_config: dict | None = None,
                   precision: str = "auto") -> dict:
    """Compute each fusion's per-model statistic of `model_dir` on `task`'s statistic batches; write `output`.
    Methods without a per-model statistic (simple, the OT methods) are skipped; at least one must have one."""
    names = [fusion_method(f.get("name")).name for f in fusions]
    if not names or len(set(names)) != len(names):
        raise SymfusionError(f"methods={names}: give one or more distinct fusion methods")
    fusions = [f for f, name in zip(fusions, names) if name in STATISTIC_METHODS]
    methods = [name for name in names if name in STATISTIC_METHODS]
    if not methods:
        raise SymfusionError(f"none of methods={names} has a per-model statistic; "
                             f"statistics are computed for {', '.join(STATISTIC_METHODS)}")
    if not output or not str(output).endswith(".safetensors"):
        raise SymfusionError(f"output={output}: give a path ending in .safetensors")
    folder = require_folder(model_dir, "model_dir")
    with safe_output(output, "symfusion-statistics", is_statistics_file, inputs=[folder]) as claim:
        model = load_model(folder)
        task.check_model(model, f"model {folder}", folder)
        model = model.to(compute_device())
        device = next(model.parameters()).device
        model_sha, family = model_digest(model), model.config.model_type
        tensors, identities, seconds, batch_cache = {}, {}, {}, {}
        for fusion, method in zip(fusions, methods):
            if int(fusion.get("num_batches", 0)) < 1:
                raise SymfusionError(f"{method}: num_batches must be set (the statistic reads data)")
            batches = fusion_batches([str(folder)], [task], fusion, batch_cache)   # as the merge stage builds them
            options = {k: v for k, v in fusion.items() if k not in STAGE_KEYS}
            start = time.perf_counter()
            with autocast(device, use_autocast(precision, device)):      # as the merge stage computes it
                statistic = FUSION_METHODS[method].model_statistic(model, batches, **options)
            seconds[method] = time.perf_counter() - start
            seen = set()
            for name, tensor in statistic.items():
                tensor = tensor.detach().to("cpu").contiguous()
                if tensor.data_ptr() in seen:            # a tied parameter's alias: stored as its own copy
                    tensor = tensor.clone()
                seen.add(tensor.data_ptr())
                tensors[f"{method}/{name}"] = tensor
            identities[method] = statistic_identity(method, fusion, family, model_sha, batches_digest(batches),
                                                    f"{precision}@{device.type}")
        report = {"model": str(folder), "task": task.name, "methods": methods, "tensors": len(tensors),
                  "seconds": seconds, "provenance": provenance(resolved_config)}
        metadata = {"format": FORMAT, "statistics": json.dumps(identities), "seconds": json.dumps(seconds),
                    "report": json.dumps(report)}
        with claim.writing() as tmp:
            save_file(tensors, str(tmp), metadata=metadata)
    return report


@command("statistics")
@dataclass(frozen=True)
class Statistics(Command):
    """symfusion-statistics task=NAME model_dir=DIR methods=[fisher,regmean] output=FILE.safetensors
    [method_options={fisher: {num_batches: 2}}]: one model's Fisher / Gram statistics, for merges that fuse it unmoved"""
    groups = {"task": "fashion_mnist", "profile": "mini"}
    model_dir: str = option(PATH, "the model folder")
    methods: list[str] = option(listing(text(), 1), "presets/fusion/<name>.yaml each: methods with a per-model "
                                "statistic", ("fisher", "regmean"))
    method_options: dict | None = option(mapping(optional=True), "as symfusion-merge's: per method, on top of its "
                                         "preset and declared defaults")
    output: str = option(PATH, "FILE.safetensors")
    precision: str = option(PRECISION, "as the merges that read it: auto | bf16 | fp32", "auto")

    def run(self, cfg) -> None:
        options = self.method_options or {}
        fusions = [fusion_config(name, options.get(name)) for name in self.methods]
        report = run_statistics(self.model_dir, fusions, task_of(cfg), self.output, resolved(cfg),
                                precision=self.precision)
        took = ", ".join(f"{m} {s:.2f}s" for m, s in report["seconds"].items())
        print(f"statistics of {report['model']} on {report['task']} ({took}) -> {self.output}")
