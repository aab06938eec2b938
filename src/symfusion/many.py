"""symfusion.align_many(): move k >= 2 models (nn.Modules) into one shared basis, each keeping its own function.

    aligned, report = symfusion.align_many([model_a, model_b, model_c], matching="full_symmetry")

`aligned` are k new modules (the given ones are left as they are), each checked to compute its source's function on
probe inputs: in the source's dtype as align() checks it, and in float64 (the transform applied to a float64 copy).
Their maps are cycle-consistent by construction: all k move to one basis (matching/universe.py: the alternation of
pairwise whole-group solves onto the leave-one-out consensus). A merge of the k aligned models is a plain average.
The report: the matching, the objective J = sum_i |X_i - mean|^2 after the start and after each round (in the gauge
the pairwise solver measures: folded for the whole group, whose aligned models are stored folded, with unit norm
gains; as stored for a block-only matching), why the alternation stopped (a fixed point, J settled, or the round cap),
the pairwise distances before and after in that gauge, each model's functional checks, the seconds, and the k
transforms (model i -> the shared basis).
Folders (loaded whole and written as k standard folders) are not taken yet.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import torch

from symfusion.arch import check_finite, check_same_layout, layout_of
from symfusion.errors import SymfusionError, erase_progress, progress_shown
from symfusion.families import check_compatible
from symfusion.io.checks import tolerance_for
from symfusion.io.loaded import output_change, tied
from symfusion.matching import MatchConfig, matching_config
from symfusion.matching.universe import MAX_ROUNDS, align_states, floating_keys
from symfusion.measures import tied_names
from symfusion.symmetry import apply_transform

FLOAT64_TOLERANCE = 1e-9     # the float64 check: max |f_aligned(x) - f(x)| / max |f(x)| with the moved float64 weights
FLOAT32_NORMS = 1e-5         # the same where transformers' RMSNorms normalise in float32 even in a float64 model


def align_many(models, matching: MatchConfig | str = "full_symmetry", output=None,
               max_relative_output_change: float = 1e-3, max_rounds: int = MAX_ROUNDS,
               progress: bool | None = None):
    """Move k >= 2 nn.Modules of one family and shapes into one shared basis; returns (aligned modules, report).

    matching: a data-free matching preset or MatchConfig (full_symmetry, the default; any variant without data:
    rotation, git_rebasin, ...), the pairwise solver of each step. output: folders are not taken yet (None).
    max_rounds: rounds of the alternation after the start (each k pairwise solves). progress: a bar with the time
    left on stderr per model of the start and per round (None: on when stderr is a terminal, or as SYMFUSION_PROGRESS
    says; it never changes the result)."""
    config = _check_arguments(models, matching, output, max_relative_output_change, max_rounds, progress)
    models = list(models)
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
        with progress_shown(progress):
            universe = align_states(states, layout, config, keys=keys, tied=tied(models[0]), max_rounds=max_rounds)
        aligned, checks = [], []
        for model, state, transform in zip(models, universe.aligned, universe.transforms):
            matched, check = _checked(model, state, transform, layout, max_relative_output_change)
            aligned.append(matched)
            checks.append(check)
    except BaseException:
        erase_progress()                # the bars go before the error is said
        raise
    finally:
        for m, training in modes:
            m.training = training
    return aligned, {
        "matching": matching if isinstance(matching, str) else None, "matching_config": config.as_report(),
        "family": layout.family, "models": len(models), "gauge": universe.gauge, "objective": universe.objective,
        "rounds": universe.rounds, "converged": universe.converged, "stop": universe.stop, "max_rounds": max_rounds,
        "pairwise_distance_before": universe.distances_before, "pairwise_distance_after": universe.distances_after,
        "checks": checks, "seconds": universe.seconds, "start_cpu_seconds": universe.start_cpu_seconds,
        "cpu_seconds": universe.cpu_seconds,
        "transforms": universe.transforms}


def _check_arguments(models, matching, output, tolerance, max_rounds, progress) -> MatchConfig:
    """align_many()'s arguments, each of its type (one SymfusionError line naming the first that is not)."""
    if isinstance(models, (str, bytes)) or not isinstance(models, Sequence):
        raise SymfusionError(f"align_many(): models must be a list of nn.Modules, got {type(models).__name__}")
    if len(models) < 2:
        raise SymfusionError(f"align_many(): needs k >= 2 models, got {len(models)}")
    if not all(isinstance(m, torch.nn.Module) for m in models):
        kinds = sorted({type(m).__name__ for m in models if not isinstance(m, torch.nn.Module)})
        raise SymfusionError(f"align_many(): models must be nn.Modules (folders are not taken yet), got {kinds[0]}")
    if len({id(m) for m in models}) < len(models):
        raise SymfusionError("align_many(): the same module is given twice; give k distinct models")
    if output is not None:
        raise SymfusionError("align_many(): output= is for folders, which are not taken yet; leave it out")
    if not isinstance(matching, (str, MatchConfig)):
        raise SymfusionError(f"align_many(): matching must be the name of a matching variant or a MatchConfig, got "
                             f"{type(matching).__name__}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not math.isfinite(tolerance) \
            or tolerance <= 0:
        raise SymfusionError(f"align_many(): max_relative_output_change must be a finite number > 0, got {tolerance!r}")
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 0:
        raise SymfusionError(f"align_many(): max_rounds must be an integer >= 0, got {max_rounds!r}")
    if progress is not None and not isinstance(progress, bool):
        raise SymfusionError(f"align_many(): progress must be True, False or None, got {progress!r}")
    config = matching_config(matching) if isinstance(matching, str) else matching
    if config.needs_data or config.runs_models:
        raise SymfusionError(f"align_many(): matching {matching if isinstance(matching, str) else 'given'} reads data "
                             "or runs the models; the k-way alignment is data-free for now (full_symmetry, ...)")
    if config.untie:
        raise SymfusionError("align_many(): matching.untie=true is pairwise only for now (align()); align k models "
                             "kept tied, or untie them first")
    return config


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
