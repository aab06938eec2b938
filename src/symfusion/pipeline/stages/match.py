"""The match stage: load source and anchor folders, match, verify the function, write atomically."""
from __future__ import annotations

import copy
import time
from dataclasses import asdict

import torch

from symfusion.arch import check_finite, check_same_layout, layout_of, resolve_layers
from symfusion.matching import MatchConfig, MatchData, match_models
from symfusion.measures import distance, probe_length
from symfusion.modelio import copy_auxiliary_files, write_json
from symfusion.outputs import folder_marker, safe_output
from symfusion.provenance import provenance
from symfusion.rewrite import as_stored, plan_like, write_like
from symfusion.sharded import tolerance_for
from symfusion.pipeline.stages.common import check_function_preserved, check_same_body, load_models, require_folder
from symfusion.symmetry import apply_transform


def _scale_summary(transform) -> dict:
    """How far the rescaling moved away from 1, over all heads (a is usually close to 1)."""
    scales = [s for t in transform.layers.values() for s in (t.a_qk, t.a_vo) if s is not None]
    if not scales:
        return {}
    flat = torch.cat(scales)
    return {"min": flat.min().item(), "max": flat.max().item(), "mean_abs_log": flat.abs().log().abs().mean().item()}


# A folder is a previous output of this stage when it holds a match report.
MATCH_MARKER = folder_marker("match.json", ("distance_after", "matching"))


def run_match(
    source: str, anchor: str, output: str, matching: MatchConfig, matching_name: str,
    layers=None, last_layers=None, seed: int = 0, probe_batch: int = 4, probe_len: int = 32,
    max_relative_output_change: float = 1e-3, resolved_config: dict | None = None,
    data_task=None, data_batches: int = 16,
) -> dict:
    """Match `source` onto `anchor` and write `output` (model + match.json + transform); returns the JSON.
    data_task: the task whose statistic batches a data-driven matching reads (matching.needs_data)."""
    source_dir, anchor_dir = require_folder(source, "source"), require_folder(anchor, "anchor")
    with safe_output(output, "symfusion-match", MATCH_MARKER, inputs=[source_dir, anchor_dir], is_dir=True) as claim:
        model, anchor_model = load_models([str(source_dir), str(anchor_dir)], same_shapes=False, use="match")
        source_state, anchor_state = model.state_dict(), anchor_model.state_dict()
        layout, anchor_layout = layout_of(model.config, source_state), layout_of(anchor_model.config, anchor_state)
        check_same_layout(layout, anchor_layout)
        check_same_body(model, anchor_model, source_dir, anchor_dir)
        matched_layers = resolve_layers(layout.num_layers, layers, last_layers)

        probe_len = probe_length(model.config, probe_len)       # never past the model's position table
        data = None
        if data_task is not None:
            data_task.check_model(model, str(source_dir))
            data = MatchData(copy.deepcopy(model), data_task.statistic_batches(data_batches, source_dir))
        start = time.perf_counter()
        result = match_models(source_state, anchor_state, layout, matching, layers=layers, last_layers=last_layers,
                              data=data)
        matched_state = apply_transform(source_state, layout, result.transform)
        seconds = time.perf_counter() - start
        check_finite(matched_state, "matched model")

        # distances first: load_state_dict below writes into the tensors that source_state holds
        before_dist = distance(source_state, anchor_state, layout)
        after_dist = distance(matched_state, anchor_state, layout)
        # the folder keeps the source's shards, index, dtypes and config (where a moved tensor has no entry of its
        # own in the source's files: transformers' layout); the check runs on the weights as stored (rounded)
        file_state, dtypes = plan_like(model, source_state, matched_state, source_dir)
        limit = tolerance_for({d for d in dtypes.values() if d.is_floating_point}, max_relative_output_change)
        change, relative = check_function_preserved(model, as_stored(matched_state, dtypes), limit,
                                                    "matched model", output, seed=seed, batch_size=probe_batch,
                                                    seq_len=probe_len)
        report = {
            "source": str(source_dir), "anchor": str(anchor_dir), "output": str(output),
            "matching": matching_name, "matching_config": asdict(matching),
            "family": layout.family, "layers": matched_layers,
            "distance_before": before_dist["total"], "distance_after": after_dist["total"],
            "distance_before_by_module": before_dist, "distance_after_by_module": after_dist,
            "max_output_change": change, "relative_output_change": relative,
            "probe": {"batch_size": probe_batch, "seq_len": probe_len, "seed": seed},
            "scales": _scale_summary(result.transform), "residual": result.residual,
            "data": None if data is None else {"task": data_task.name, "batches": len(data.batches)},
            "seconds": seconds, "seconds_by_stage": result.seconds,
            "provenance": provenance(resolved_config, seed),
        }
        with claim.writing() as tmp:
            if file_state is not None:
                write_like(source_dir, file_state, tmp)
            else:
                model.save_pretrained(str(tmp), safe_serialization=True)
                copy_auxiliary_files(source_dir, tmp)
            result.transform.save(tmp / "transform.safetensors")
            write_json(report, tmp / "match.json")
    return report
