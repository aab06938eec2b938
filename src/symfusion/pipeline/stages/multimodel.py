"""The multi-model matching stage: anchor vs barycentric matching of k models, joint vs sequential rescaling.

Loads k model folders (the first is the anchor), matches them with method=anchor (every model
onto the first) and method=barycenter (matching/multi.py), and records the sum of pairwise
distances and the seconds of each; for every pair it also records how much closer joint
rotation+rescaling (rotation_joint) brings the two models than the paper's sequential order
(rotation). Writes one JSON, and optionally the model folders matched by one of the two methods (matching.multi).
"""
from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch

from symfusion.arch import check_same_layout, layout_of
from symfusion.errors import SymfusionError
from symfusion.matching import MatchConfig, match_models, matching_config
from symfusion.matching.multi import METHODS, match_group, pairwise_distances, pairwise_sq
from symfusion.measures import distance
from symfusion.io.modelio import copy_auxiliary_files, write_json
from symfusion.io.outputs import file_marker, folder_marker, safe_output, writing_together
from symfusion.io.provenance import provenance
from symfusion.alignment.rewrite import as_stored, plan_like, write_like
from symfusion.alignment.checks import tolerance_for
from symfusion.pipeline.command import PATH, Command, command, listing, option, text
from symfusion.pipeline.stages.common import check_function_preserved, load_models, match_config, resolved
from symfusion.symmetry import apply_transform


MULTIMODEL_MARKER = file_marker(("methods", "k"))
MODELS_MARKER = folder_marker("models.json", ("models", "multi"))


def load_group(model_dirs: list[str]):
    """(dirs, models, states, layout) for k >= 2 compatible, finite model folders."""
    models = load_models(model_dirs, use="match")   # existence, compatibility, finiteness, equal shapes
    dirs = [Path(p) for p in model_dirs]
    states = [m.state_dict() for m in models]
    layouts = [layout_of(m.config, s) for m, s in zip(models, states)]
    for layout in layouts[1:]:
        check_same_layout(layout, layouts[0])
    return dirs, models, states, layouts[0]


def method_summary(states, layout, matching: MatchConfig, method: str):
    """(summary dict, matched states) for one multi-model method."""
    start = time.perf_counter()
    result = match_group(states, layout, matching, method)
    matched = [apply_transform(s, layout, t) for s, t in zip(states, result.transforms)]
    seconds = time.perf_counter() - start
    distances = pairwise_distances(matched)
    summary = {
        "sum_pairwise_distance": sum(distances), "pairwise_distances": distances,
        "sum_pairwise_sq_distance": pairwise_sq(matched),
        "iterations": result.info["iterations"], "objective": result.info["objective"], "seconds": seconds,
    }
    return summary, matched, result.transforms


def joint_gains(states, layout) -> list[dict]:
    """For every pair i < j: distance of model j matched onto model i by rotation vs rotation_joint."""
    pairs = []
    for i in range(len(states)):
        for j in range(i + 1, len(states)):
            after = {}
            for name in ("rotation", "rotation_joint"):
                moved = apply_transform(states[j], layout, match_models(states[j], states[i], layout, name).transform)
                after[name] = distance(moved, states[i], layout)
            sequential, joint = after["rotation"]["total"], after["rotation_joint"]["total"]
            pairs.append({
                "anchor": i, "source": j, "distance_rotation": sequential, "distance_rotation_joint": joint,
                "gain": sequential - joint, "relative_gain": (sequential - joint) / sequential if sequential else 0.0,
                "by_module_rotation": after["rotation"], "by_module_rotation_joint": after["rotation_joint"],
            })
    return pairs


def write_models(dirs, models, matched, transforms, folder: Path, output, max_relative_output_change: float) -> list[dict]:
    """Save every matched model into <folder>/<i> (the temp folder of `output`) after checking it computes
    the original function."""
    written = []
    for i, (path, model, state, transform) in enumerate(zip(dirs, models, matched, transforms)):
        file_state, dtypes = plan_like(model, model.state_dict(), state, path)   # as in the match stage
        limit = tolerance_for({d for d in dtypes.values() if d.is_floating_point}, max_relative_output_change)
        change, _ = check_function_preserved(model, as_stored(state, dtypes), limit, f"matched model {i} ({path})",
                                             output)
        target = Path(folder) / str(i)
        target.mkdir()
        if file_state is not None:
            write_like(path, file_state, target)
        else:
            model.save_pretrained(str(target), safe_serialization=True)
            copy_auxiliary_files(path, target)
        transform.save(target / "transform.safetensors")
        written.append({"model": str(path), "output": str(i), "max_output_change": change})
    return written


@torch.no_grad()
def run_multimodel(
    model_dirs: list[str], output: str, matching: MatchConfig | str = "rotation", matching_name: str | None = None,
    resolved_config: dict | None = None, output_models_dir: str | None = None,
    max_relative_output_change: float = 1e-3, multi: str = "anchor",
) -> dict:
    """Compare anchor and barycentric matching of k models (and joint vs sequential per pair); write `output`.

    With output_models_dir, the models matched by the `multi` method (anchor | barycenter) are written there
    (one folder, <dir>/0, <dir>/1, ... and models.json, replaced as a whole).
    """
    if isinstance(matching, str):                  # a variant by name: presets/matching/<name>.yaml
        matching_name, matching = matching, matching_config(matching)
    if multi not in METHODS:
        raise SymfusionError(f"matching.multi={multi!r}; choose one of {', '.join(METHODS)}")
    inputs = list(model_dirs or [])
    with ExitStack() as stack:        # every output is checked and locked before any work
        report_claim = stack.enter_context(safe_output(output, "symfusion-multimodel", MULTIMODEL_MARKER, inputs))
        models_claim = None
        if output_models_dir:
            models_claim = stack.enter_context(safe_output(output_models_dir, "symfusion-multimodel", MODELS_MARKER,
                                                           inputs + [output], is_dir=True, what="output_models"))
        dirs, models, states, layout = load_group(model_dirs)
        before = pairwise_distances(states)
        methods, matched_by_method = {}, {}
        for method in METHODS:
            methods[method], matched, transforms = method_summary(states, layout, matching, method)
            matched_by_method[method] = (matched, transforms)
        report = {
            "models": [str(p) for p in dirs], "k": len(dirs), "matching": matching_name,
            "matching_config": matching.as_report(), "family": layout.family,
            "sum_pairwise_distance_before": sum(before), "pairwise_distances_before": before,
            "sum_pairwise_sq_distance_before": pairwise_sq(states),
            "methods": methods,
            "barycenter_gain": methods["anchor"]["sum_pairwise_distance"] - methods["barycenter"]["sum_pairwise_distance"],
            "joint_vs_sequential": joint_gains(states, layout),
            "provenance": provenance(resolved_config),
        }
        claims = [c for c in (models_claim, report_claim) if c is not None]
        with writing_together(claims) as temps:    # both outputs appear together, or neither
            if models_claim is not None:       # last: load_state_dict writes into the tensors `states` hold
                matched, transforms = matched_by_method[multi]
                report["output_models_multi"] = multi
                report["output_models"] = write_models(dirs, models, matched, transforms, temps[0],
                                                       output_models_dir, max_relative_output_change)
                write_json({"models": report["output_models"], "multi": multi, "provenance": report["provenance"]},
                           temps[0] / "models.json")
            write_json(report, temps[-1])
    return report


@command("multimodel")
@dataclass(frozen=True)
class Multimodel(Command):
    """symfusion-multimodel models=[ANCHOR,M1,...] output=FILE.json [matching=NAME] [output_models=DIR matching.multi=anchor|barycenter]"""
    groups = {"matching": "attn_only_no_rescale"}       # the grouped language merges' matching
    models: list[str] = option(listing(text(), 2), "k >= 2 model folders of one architecture; the first is the anchor")
    output: str = option(PATH, "FILE.json: the distances")
    output_models: str | None = option(text(optional=True), "also write the models matched by matching.multi "
                                       "(anchor or barycenter) to DIR/0, DIR/1, ... (for merging)")

    def check(self, cfg, given: set[str]) -> None:
        match_config(cfg)

    def run(self, cfg) -> None:
        report = run_multimodel(self.models, self.output, match_config(cfg), cfg.matching.name, resolved(cfg),
                                output_models_dir=self.output_models, multi=cfg.matching.get("multi", "anchor"))
        anchor, bary = report["methods"]["anchor"], report["methods"]["barycenter"]
        print(f"{report['k']} models: sum of pairwise distances {report['sum_pairwise_distance_before']:.3f} -> "
              f"{anchor['sum_pairwise_distance']:.3f} (anchor) / {bary['sum_pairwise_distance']:.3f} (barycenter) "
              f"-> {self.output}")
