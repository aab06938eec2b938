"""symfusion.align_many(): move k >= 2 models (nn.Modules or model folders) into one shared basis, each keeping its own function.

    aligned, report = symfusion.align_many([model_a, model_b, model_c], matching="full_symmetry")
    folders, report = symfusion.align_many(["a", "b", "c"], output="aligned")      # aligned/model_0 ... model_2

`aligned` are k new modules (the given ones are left as they are), each checked to compute its source's function on
probe inputs: in the source's dtype as align() checks it, and in float64 (the transform applied to a float64 copy).
Their maps are cycle-consistent by construction: all k move to one basis (matching/universe.py: the alternation of
pairwise whole-group solves onto the leave-one-out consensus). A merge of the k aligned models is a plain average.
The report: the matching, the objective J = sum_i |X_i - mean|^2 after the start and after each round (in the gauge
the pairwise solver measures: folded for the whole group, whose aligned models are stored folded, with unit norm
gains; as stored for a block-only matching), why the alternation stopped (a fixed point, J settled, or the round cap),
the pairwise distances before and after in that gauge, each model's functional checks, the seconds, and the k
transforms (model i -> the shared basis).
With a refine=loss matching (full_symmetry_learned) and data=[batches], the universe is then refined: all k maps
learned jointly on the loss of mixtures over the simplex (matching/universe_learned.py); with refine=synthetic
(full_symmetry_synthetic) the same, without data: distilled on inputs it makes (matching/synthetic.py: smooth-noise
images, or text the k end models write in turn), each mixture's target the end models' predictions mixed as it mixes
them; the report's `refine` says
how (steps, points, the centroid's loss before and after on the first batches, kept: refined | universe) and the
transforms are the refined ones (the objective and distances stay the data-free universe's).
Folders are read as align() reads them (io/modelio.load_model: safetensors only, every tensor of the config present,
shaped and finite; the bodies of one shape) and loaded whole; output=DIR then receives, atomically, model_0 ..
model_{k-1}, each written as align() writes a matched folder (the source's shards, index, key names and dtypes,
save_pretrained where a moved tensor has no entry of its own; its weights checked as written) with its
transform.safetensors, and many.json (the report, the sources and provenance). symfusion-align-many is this
function on folders.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from symfusion.arch import check_finite, check_same_layout, layout_of
from symfusion.errors import SymfusionError, library_call
from symfusion.families import check_compatible
from symfusion.alignment.checks import tolerance_for
from symfusion.alignment.loaded import check_same_body, holding, output_change
from symfusion.io.modelio import copy_auxiliary_files, load_config, load_model, write_json
from symfusion.io.outputs import folder_marker, safe_output
from symfusion.io.provenance import provenance
from symfusion.io.untie import is_tied, untie_all
from symfusion.alignment.rewrite import as_stored, plan_like, write_like
from symfusion.matching import MatchConfig, matching_config
from symfusion.matching.universe import MAX_ROUNDS, STARTS, align_states, floating_keys
from symfusion.matching.synthetic import SyntheticBatches, check_inputs, inputs_of
from symfusion.matching.universe_learned import refine_universe
from symfusion.measures import tied_names
from symfusion.symmetry import apply_transform

FLOAT64_TOLERANCE = 1e-9     # the float64 check: max |f_aligned(x) - f(x)| / max |f(x)| with the moved float64 weights
FLOAT32_NORMS = 1e-5         # the same where transformers' RMSNorms normalise in float32 even in a float64 model
# An output of align_many() on folders: it holds the report. Replaced only when it is one (never an input).
MANY_FOLDER = folder_marker("many.json", ("objective", "sources"))
WRITER = "symfusion-align-many / align_many()"


def align_many(models, matching: MatchConfig | str = "full_symmetry", output=None,
               max_relative_output_change: float = 1e-3, max_rounds: int = MAX_ROUNDS,
               progress: bool | None = None, data: list[dict] | None = None, record: dict | None = None,
               start: str = "incremental"):
    """Move k >= 2 models of one family and shapes into one shared basis; returns (aligned, report).

    models: nn.Modules (aligned: k new modules) or model folders (output=DIR is required; aligned: the k folders
    written, DIR/model_0 ..). matching: a data-free matching preset or MatchConfig (full_symmetry, the default; any
    variant without data: rotation, git_rebasin, ...), the pairwise solver of each step; or a whole-group preset with
    refine=loss (full_symmetry_learned) and data=[batches of model inputs, with labels]: the data-free universe, then
    the learned k-way refinement of all k maps on the loss of mixtures over the simplex (matching/universe_learned.py);
    or full_symmetry_synthetic (refine=synthetic, no data): that refinement distilled on inputs it makes.
    A preset with matching.untie=true (full_symmetry_untie, full_symmetry_untie_learned) aligns each tied decoder as
    its untied copy (io/untie.py: the same class, lm_head its own copy), so the residual map may be any orthogonal map.
    max_rounds: rounds of the alternation after the start (each k pairwise solves). start: where the alternation
    begins: incremental (model i onto the mean of the copies placed before it) or anchor (model i onto model 0, the
    k - 1 pairwise solves of anchor matching). progress: a bar with the time
    left on stderr per model of the start and per round (None: on when stderr is a terminal, or as SYMFUSION_PROGRESS
    says; it never changes the result). record: more fields for the report (a command's provenance, where its data
    came from), written into many.json too."""
    config = _check_arguments(models, matching, output, max_relative_output_change, max_rounds, progress, data,
                              record, start)
    name = matching if isinstance(matching, str) else None
    with library_call(progress):
        if isinstance(models[0], torch.nn.Module):
            if config.untie:                                    # each tied one aligned as its untied copy
                models = untie_all(list(models), [f"model {i}" for i in range(len(models))])
            aligned, report = _align_modules(list(models), config, name, max_relative_output_change, max_rounds, data,
                                             start)
            return aligned, {**report, **(record or {})}
        return _align_folders([Path(m) for m in models], Path(output), config, name, max_relative_output_change,
                              max_rounds, data, record, start)


def _align_modules(models: list, config: MatchConfig, name, tolerance: float, max_rounds: int, data=None,
                   start: str = "incremental"):
    """align_many() of nn.Modules, its arguments checked: (the aligned modules, the report)."""
    for i, model in enumerate(models[1:], 1):
        check_compatible(models[0].config, model.config, "model 0", f"model {i}")
    states = [{k: v.float() if v.is_floating_point() and v.dtype in (torch.float16, torch.bfloat16) else v
               for k, v in m.state_dict().items()} for m in models]
    for i, state in enumerate(states):
        check_finite(state, f"model {i}")
    layout = layout_of(models[0].config, states[0])
    for i, state in enumerate(states[1:], 1):
        check_same_layout(layout, layout_of(models[i].config, state))
        wrong = next((k for k, v in states[0].items() if k not in state or state[k].shape != v.shape), None)
        if wrong is not None:
            raise SymfusionError(f"model 0 and model {i} differ in {wrong!r}; they are not models of one architecture")
    ties = {t for m in models for t in tied_names(m)}
    keys = floating_keys(states[0], skip=ties)
    modes = [(m, m.training) for model in models for m in model.modules()]
    try:
        free = dataclasses.replace(config, refine="none")                    # the data-free universe first
        universe = align_states(states, layout, free, keys=keys, tied=is_tied(models[0]), max_rounds=max_rounds,
                                start=start)
        transforms, aligned_states, refine = universe.transforms, universe.aligned, None
        if config.refine in ("loss", "synthetic"):
            batches = list(data) if config.refine == "loss" else \
                SyntheticBatches(models[0], states, config.refine_settings(layout).steps)   # the k end models write
            transforms, refine = refine_universe(states, layout, config, transforms, copy.deepcopy(models[0]),
                                                 batches, tied=is_tied(models[0]))
            refine = {**refine, "inputs": inputs_of(batches)}
            aligned_states = [apply_transform(s, layout, t) for s, t in zip(states, transforms)]
        aligned, checks = [], []
        for model, state, transform in zip(models, aligned_states, transforms):
            matched, check = _checked(model, state, transform, layout, tolerance)
            aligned.append(matched)
            checks.append(check)
    finally:
        for m, training in modes:
            m.training = training
    return aligned, {
        "matching": name, "matching_config": config.as_report(),
        "family": layout.family, "models": len(models), "gauge": universe.gauge, "objective": universe.objective,
        "start": start, "rounds": universe.rounds, "converged": universe.converged, "stop": universe.stop,
        "max_rounds": max_rounds,
        "pairwise_distance_before": universe.distances_before, "pairwise_distance_after": universe.distances_after,
        "checks": checks, "seconds": universe.seconds, "start_cpu_seconds": universe.start_cpu_seconds,
        "cpu_seconds": universe.cpu_seconds, "refine": refine,
        "transforms": transforms}


def _align_folders(paths: list[Path], output: Path, config: MatchConfig, name, tolerance: float, max_rounds: int,
                   data=None, record=None, start: str = "incremental"):
    """align_many() of model folders, its arguments checked: each read as align() reads a model, then written as
    output/model_i (the source's layout and dtypes, checked as written) beside many.json; (the k folders, report)."""
    began = time.perf_counter()
    for i, path in enumerate(paths):
        if not path.is_dir():
            raise SymfusionError(f"models[{i}]={path}: no such directory")
    if len({p.resolve() for p in paths}) < len(paths):
        raise SymfusionError("align_many(): the same folder is given twice; give k distinct models")
    configs = [load_config(p) for p in paths]
    for i, (path, config_i) in enumerate(zip(paths[1:], configs[1:]), 1):
        check_compatible(configs[0], config_i, str(paths[0]), str(path))
    models = [load_model(p) for p in paths]                               # each checked finite
    for path, model in zip(paths[1:], models[1:]):
        check_same_body(models[0], model, paths[0], path)
    if config.untie:            # each tied one aligned and written as its untied copy (save_pretrained: lm_head saved)
        models = untie_all(models, [str(p) for p in paths])
    if config.refine == "synthetic":
        check_inputs(models[0])                    # an encoder classifier: nothing to make for it (one line)
    # a new folder, or a previous output of align_many; never an input
    with safe_output(output, WRITER, MANY_FOLDER, inputs=paths, is_dir=True) as claim:
        aligned, report = _align_modules(models, config, name, tolerance, max_rounds, data, start)
        with claim.writing() as tmp:
            for i, (path, model, moved) in enumerate(zip(paths, models, aligned)):
                report["checks"][i]["as_written"] = _write_like(path, model, moved.state_dict(), tmp / f"model_{i}",
                                                                tolerance)
                report["transforms"][i].save(tmp / f"model_{i}" / "transform.safetensors")
            folders = [output / f"model_{i}" for i in range(len(paths))]
            written = {**{k: v for k, v in report.items() if k != "transforms"}, "sources": [str(p) for p in paths],
                       "outputs": [str(f) for f in folders], "seconds_total": time.perf_counter() - began,
                       "provenance": provenance(None), **(record or {})}
            write_json(written, tmp / "many.json")
    return folders, {**written, "transforms": report["transforms"]}


def _write_like(source: Path, model: torch.nn.Module, moved: dict, target: Path, tolerance: float) -> dict:
    """Write the moved weights as the folder `source` stores its own (write_like; save_pretrained where a moved
    tensor has no entry of its own), after checking them as they will be stored: (relative change, tolerance)."""
    file_state, dtypes = plan_like(model, model.state_dict(), moved, source)
    matched = holding(model, as_stored(moved, dtypes))
    change = output_change(model, matched)
    limit = tolerance_for({d for d in dtypes.values() if d.is_floating_point}, tolerance)
    if not change <= limit:                                   # NaN fails too
        raise SymfusionError(f"the aligned {source} changes its outputs by {change:.3g} relative as stored "
                             f"(> {limit:.3g}); nothing written. Report this as a bug")
    target.mkdir(parents=True)
    if file_state is not None:
        write_like(source, file_state, target)
    else:
        matched.save_pretrained(str(target), safe_serialization=True)
        copy_auxiliary_files(source, target)
    return {"relative_output_change": change, "tolerance": limit}


def _check_arguments(models, matching, output, tolerance, max_rounds, progress, data, record,
                     start) -> MatchConfig:
    """align_many()'s arguments, each of its type (one SymfusionError line naming the first that is not)."""
    if isinstance(models, (str, bytes)) or not isinstance(models, Sequence):
        raise SymfusionError(f"align_many(): models must be a list of nn.Modules or of model folders, got "
                             f"{type(models).__name__}")
    if len(models) < 2:
        raise SymfusionError(f"align_many(): needs k >= 2 models, got {len(models)}")
    modules = all(isinstance(m, torch.nn.Module) for m in models)
    if not modules and not all(isinstance(m, (str, Path)) and str(m).strip() for m in models):
        kinds = sorted({type(m).__name__ for m in models})
        raise SymfusionError(f"align_many(): models must be all nn.Modules or all model folders (paths), got "
                             f"{' and '.join(kinds)}")
    if modules and len({id(m) for m in models}) < len(models):
        raise SymfusionError("align_many(): the same module is given twice; give k distinct models")
    if modules and output is not None:
        raise SymfusionError("align_many(): output= is for model folders (modules come back as modules); leave it out")
    if not modules and (output is None or not isinstance(output, (str, Path)) or not str(output).strip()):
        raise SymfusionError(f"align_many() of model folders needs output=DIR (where the k aligned folders are "
                             f"written), got {type(output).__name__} {str(output)[:60]!r}")
    if not isinstance(matching, (str, MatchConfig)):
        raise SymfusionError(f"align_many(): matching must be the name of a matching variant or a MatchConfig, got "
                             f"{type(matching).__name__}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not math.isfinite(tolerance) \
            or tolerance <= 0:
        raise SymfusionError(f"align_many(): max_relative_output_change must be a finite number > 0, got {tolerance!r}")
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 0:
        raise SymfusionError(f"align_many(): max_rounds must be an integer >= 0, got {max_rounds!r}")
    if start not in STARTS:
        raise SymfusionError(f"align_many(): start must be one of {', '.join(STARTS)}, got {start!r}")
    if progress is not None and not isinstance(progress, bool):
        raise SymfusionError(f"align_many(): progress must be True, False or None, got {progress!r}")
    if data is not None and (not isinstance(data, (list, tuple)) or not all(isinstance(b, Mapping) for b in data)):
        raise SymfusionError(f"align_many(): data must be a list of batches (dicts of model inputs) or None, got "
                             f"{type(data).__name__}")
    if record is not None and not (isinstance(record, Mapping) and all(isinstance(k, str) for k in record)):
        raise SymfusionError(f"align_many(): record must be a dict of report fields (str keys) or None, got "
                             f"{type(record).__name__}")
    config = matching_config(matching) if isinstance(matching, str) else matching
    given = matching if isinstance(matching, str) else "given"
    k_way_matching(config, given)
    if config.refine == "loss" and not data:
        raise SymfusionError(f"align_many(): matching {given} learns on the loss of mixtures: give data=[batches of "
                             "model inputs, with labels]")
    if data and config.refine != "loss":      # it would be unread
        raise SymfusionError(f"align_many(): matching {given} {config.reads}, no data: leave data out, or "
                             "choose full_symmetry_learned")
    if config.refine == "synthetic" and modules:
        check_inputs(models[0])                    # an encoder classifier: nothing to make for it (one line)
    return config


def k_way_matching(config: MatchConfig, given: str) -> None:
    """Refuse, in one SymfusionError line, a matching the k-way solver cannot run (whatever the data): one that starts
    from activations (`given`: its name, for the line)."""
    if config.residual_solve != "weights":
        raise SymfusionError(f"align_many(): matching {given} starts from activations; the k-way start is data-free "
                             "(full_symmetry), its learned forms read data (full_symmetry_learned with data=...) or "
                             "inputs they make (full_symmetry_synthetic)")


@torch.no_grad()
def _checked(model: torch.nn.Module, state: dict, transform, layout, tolerance: float) -> tuple[torch.nn.Module, dict]:
    """The aligned copy of `model` (weights `state`, cast to the model's dtypes) and its functional checks: as stored,
    within align()'s tolerance, and the transform applied in float64 to a float64 copy, within FLOAT64_TOLERANCE
    (FLOAT32_NORMS for a model with RMSNorms, which transformers computes in float32)."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    source = copy.deepcopy(model).eval()
    matched = copy.deepcopy(source)
    matched.load_state_dict(state)
    change, limit = output_change(source, matched), tolerance_for(dtypes, tolerance)
    if not change <= limit:                                   # NaN fails too
        raise SymfusionError(f"an aligned model changes its source's outputs by {change:.3g} relative (> {limit:.3g}); "
                             "report this as a bug")
    wide = source.double()
    moved = copy.deepcopy(wide)
    moved.load_state_dict(apply_transform(wide.state_dict(), layout, transform))
    change64 = output_change(wide, moved)
    limit64 = FLOAT32_NORMS if any(type(m).__name__.endswith("RMSNorm") for m in wide.modules()) else FLOAT64_TOLERANCE
    if not change64 <= limit64:
        raise SymfusionError(f"an aligned model changes its source's outputs by {change64:.3g} relative in float64 "
                             f"(> {limit64:g}); report this as a bug")
    return matched, {"relative_output_change": change, "tolerance": limit, "relative_output_change_float64": change64,
                     "tolerance_float64": limit64}
