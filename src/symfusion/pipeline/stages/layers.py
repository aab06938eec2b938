"""The layer-subset sweep (paper Figure 6): match single layers or the last k layers, average, evaluate.

For two models fine-tuned on different tasks (the source moved onto the anchor), every subset
of attention layers is matched, the two encoder bodies are simply averaged, and each task is
evaluated with its own fine-tuned model whose body is replaced by the merged one (its task
head stays: heads of different tasks have different shapes). Subsets: none, each single layer
i, and the last k layers for k = 1..L. One process, one JSON: 2L+1 rows per task, from 2L merges of two
models (the last single layer and the tail of 1 are one subset).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from symfusion.arch import layout_of
from symfusion.families import family_spec
from symfusion.errors import SymfusionError, steps
from symfusion.matching import MatchConfig, match_models, matching_config
from symfusion.io.modelio import write_json
from symfusion.io.outputs import file_marker, safe_output
from symfusion.io.provenance import provenance
from symfusion.alignment.loaded import check_same_body
from symfusion.pipeline.command import PATH, Command, command, integer, listing, option, text
from symfusion.pipeline.stages.common import load_models, match_config, resolved, tasks_of
from symfusion.symmetry import apply_transform


LAYERS_MARKER = file_marker(("rows", "num_layers"))


def subsets(num_layers: int) -> list[dict]:
    """[{"setting", "k", "layers"}]: no matching, every single layer, every tail of k layers."""
    rows = [{"setting": "none", "k": 0, "layers": []}]
    rows += [{"setting": "single", "k": i, "layers": [i]} for i in range(num_layers)]
    rows += [{"setting": "tail", "k": k, "layers": list(range(num_layers - k, num_layers))}
             for k in range(1, num_layers + 1)]
    return rows


def body_keys(model: torch.nn.Module) -> list[str]:
    """State-dict keys of the encoder (the family's body); the rest is the task head."""
    return family_spec(model.config).body_keys(model.state_dict())


def averaged_body(anchor_state: dict, source_state: dict, keys: list[str]) -> dict:
    """Simple fusion of the encoder: the mean of the two bodies, key by key."""
    return {k: (anchor_state[k].double() + source_state[k].double()).div(2).to(anchor_state[k].dtype) for k in keys}


def evaluate_with_body(model: torch.nn.Module, body: dict, evaluate) -> dict:
    """Metrics of `model` with its encoder replaced by `body` (its own weights are restored afterwards)."""
    original = {k: v.clone() for k, v in model.state_dict().items() if k in body}
    model.load_state_dict(body, strict=False)
    try:
        return evaluate(model)
    finally:
        model.load_state_dict(original, strict=False)


def run_layer_sweep(anchor: str, source: str, tasks: list, matching: MatchConfig | str, output: str,
                    examples: int | None = None, resolved_config: dict | None = None,
                    matching_name: str | None = None) -> dict:
    """Sweep layer subsets for the pair (anchor, source) with the matching `matching` and write the rows as JSON."""
    if isinstance(matching, str):                  # a variant by name: presets/matching/<name>.yaml
        matching_name, matching = matching, matching_config(matching)
    if len(tasks) != 2:
        raise SymfusionError("tasks=[ANCHOR_TASK,SOURCE_TASK]: one task per model")
    for path in (anchor, source):
        if not Path(path).is_dir():
            raise SymfusionError(f"model folder {path} does not exist; fine-tune it first")
    with safe_output(output, "symfusion-layers", LAYERS_MARKER, inputs=[anchor, source]) as claim:
        loaded = load_models([anchor, source], same_shapes=False)      # two tasks: the heads differ
        models = {"anchor": loaded[0], "source": loaded[1]}
        anchor_state, source_state = models["anchor"].state_dict(), models["source"].state_dict()
        layout = layout_of(models["source"].config, source_state)
        check_same_body(models["source"], models["anchor"], source, anchor)
        keys = body_keys(models["anchor"])
        start, rows, measured = time.perf_counter(), [], {}
        for subset in steps(subsets(layout.num_layers), "layer subsets", "subset"):
            layers = tuple(subset["layers"])
            if layers not in measured:       # the last single layer is the tail of 1: one merge serves both rows
                transform = match_models(source_state, anchor_state, layout, matching, layers=subset["layers"]).transform
                body = averaged_body(anchor_state, apply_transform(source_state, layout, transform), keys)
                measured[layers] = []
                for role, task, folder in (("anchor", tasks[0], anchor), ("source", tasks[1], source)):
                    metrics = evaluate_with_body(models[role], body,
                                                 lambda m: task.evaluate(m, "test", model_dir=folder, examples=examples))
                    record = metrics.pop("per_example")            # the losses' part: Figure 6's intervals
                    measured[layers].append({"task": task.name, "role": role, **metrics,
                                             "per_example": {k: record[k] for k in ("loss", "tokens") if k in record}})
            rows += [{**subset, **metrics} for metrics in measured[layers]]
        report = {"anchor": anchor, "source": source, "matching": matching_name,
                  "matching_config": matching.as_report(), "num_layers": layout.num_layers, "fusion": "simple",
                  "examples": examples, "rows": rows,
                  "seconds": time.perf_counter() - start, "provenance": provenance(resolved_config)}
        with claim.writing() as tmp:
            write_json(report, tmp)
    return report


@command("layers")
@dataclass(frozen=True)
class Layers(Command):
    """symfusion-layers anchor=DIR source=DIR tasks=[T_ANCHOR,T_SOURCE] output=FILE.json [matching=NAME] [examples=N]"""
    groups = {"matching": "attn_only_no_rescale", "profile": "mini"}     # the paper's language setting
    anchor: str = option(PATH, "fine-tuned model of the first task (kept fixed)")
    source: str = option(PATH, "fine-tuned model of the second task (moved onto the anchor)")
    output: str = option(PATH, "FILE.json: the sweep")
    tasks: list[str] = option(listing(text(), 2), "[anchor's task, source's task]")
    examples: int | None = option(integer(1, optional=True), "the first N test examples of each task; null: all")

    def check(self, cfg, given: set[str]) -> None:
        match_config(cfg)

    def run(self, cfg) -> None:
        report = run_layer_sweep(self.anchor, self.source, tasks_of(cfg, self.tasks), match_config(cfg), self.output,
                                 self.examples, resolved(cfg), matching_name=cfg.matching.name)
        print(f"layer sweep: {len(report['rows'])} evaluations in {report['seconds']:.0f}s -> {self.output}")
