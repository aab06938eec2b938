"""The k-way stage (symfusion-kway): k models moved into one basis, scored as one merge: the centroid on the test split and the simplex barrier; or the k end models themselves, their best and their logit ensemble.

    symfusion-kway task=NAME ends=[A,B,C] models=[A',B',C'] output=FILE.json [grid=4] [examples=N] [way=LABEL]
                   [line=ENDS.json]
    symfusion-kway task=NAME ends=[A,B,C] output=ENDS.json [examples=N]     # the end models, their best, the ensemble

`models` are the k end models `ends` after one way of moving them into one basis, in the same order (the end models
themselves for naive averaging; an align-many output's model_0 ..; matched folders onto the first), so the centroid
merge is the plain average of their weights. The scores (pipeline/kway.py, shared with benchmarks/bench_kway.py): the
centroid merge's metric and loss on the whole test split, and the simplex barrier, the largest over the points of
the simplex grid of step 1/grid (and the centroid) of the mixture's loss minus the mixture of the end models' losses,
on `examples` seeded test examples. Without models: each end model on the whole test split, the best one and the
logit ensemble (the mean of the k models' logits), and the end models' losses on the `examples` (the barrier's line),
which a scored way reads from that JSON (`line=`) instead of computing them again. Written as one JSON with its
provenance; CPU only.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from symfusion.errors import SymfusionError
from symfusion.io.modelio import write_json
from symfusion.io.outputs import file_marker, safe_output
from symfusion.io.provenance import provenance
from symfusion.io.regular import read_regular_text
from symfusion.pipeline.command import PATH, Command, command, integer, listing, option, text
from symfusion.pipeline.kway import best_of, end_losses, ensemble, scored, score_way
from symfusion.pipeline.stages.common import load_models, resolved, task_of

KWAY_MARKER = file_marker(("ends", "k", "task"))


def cloned(model: torch.nn.Module) -> dict:
    """A copy of a model's weights (a mixture loaded into the model then leaves them as they were)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def read_line(path: str, ends: list[str], task, examples: int | None) -> list[float]:
    """The end models' losses on the barrier's examples from `path`, the JSON of symfusion-kway without models= (its
    `line`), checked to be of these end models, task and examples; or a one-line error."""
    why = "give the JSON symfusion-kway wrote for these ends= without models= (e.g. kway/ends.json)"
    try:
        data = json.loads(read_regular_text(path))
    except (UnicodeDecodeError, ValueError) as error:
        raise SymfusionError(f"line={path} is not a JSON result of symfusion-kway; {why}") from error
    line = data.get("line") if isinstance(data, dict) else None
    if not isinstance(line, dict) or not isinstance(line.get("end_losses"), list) or "ends" not in data:
        raise SymfusionError(f"line={path} holds no end models' line (`line`: end_losses and examples); {why}")
    losses = line["end_losses"]
    if (len(losses) != len(ends) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                            and math.isfinite(v) for v in losses)):
        raise SymfusionError(f"line={path}: its end_losses are not {len(ends)} finite numbers; {why}")
    theirs = [str(Path(str(p)).resolve()) for p in data["ends"]] if isinstance(data["ends"], list) else None
    if theirs != [str(Path(p).resolve()) for p in ends]:
        raise SymfusionError(f"line={path} is of other end models than ends= (or in another order); {why}")
    if data.get("task") != task.name or line.get("examples") != examples:
        raise SymfusionError(f"line={path} is of task {str(data.get('task'))[:60]!r} on examples="
                             f"{str(line.get('examples'))[:20]}, not task {task.name!r} on examples={examples}; {why}")
    return [float(v) for v in losses]


@torch.no_grad()
def run_kway(ends: list[str], models: list[str] | None, task, output: str, grid: int = 4,
             examples: int | None = None, way: str | None = None, resolved_config: dict | None = None,
             line: str | None = None) -> dict:
    """Score one way of moving the k end models `ends` into one basis (`models`, in the same order), or with models
    None the end models themselves and their losses on the barrier's `examples`; write the JSON `output` (claimed
    before any work) and return it. `line`: a JSON of the latter, whose end model losses a scored way reads."""
    if models is not None and len(models) != len(ends):
        raise SymfusionError(f"models= gives {len(models)} folders for the {len(ends)} end models of ends=; give "
                             "the k end models after one way of moving them, in the order of ends")
    if models is None and line is not None:
        raise SymfusionError("line= is read by a scored way (with models=); without models= the end models' line "
                             "is computed and written; leave line= out")
    inputs = list(ends) + list(models or [])
    if len({str(Path(p).resolve()) for p in ends}) < len(ends):
        raise SymfusionError("ends= names one folder twice; give k distinct end models")
    known = read_line(line, ends, task, examples) if line is not None else None
    with safe_output(output, "symfusion-kway", KWAY_MARKER, inputs=inputs + ([line] if line else [])) as claim:
        start, cpu = time.perf_counter(), time.process_time()
        loaded = [m.eval() for m in load_models(inputs, use="match")]    # one family and shapes, all finite
        end_models, moved = loaded[:len(ends)], loaded[len(ends):]
        report = {"task": task.name, "k": len(ends), "ends": [str(p) for p in ends], "metric": task.metric}
        folder = ends[0]                                   # a decoder's test blocks: cut with its tokenizer
        if models is None:
            evals = [scored(m, task, model_dir=folder) for m in end_models]
            best = best_of(evals)
            report.update(end_evals=evals, best={**best, "model": evals.index(best)},
                          ensemble=ensemble(end_models, task, folder),
                          line={"examples": examples, "end_losses": end_losses(
                              end_models[0], [cloned(m) for m in end_models], task, examples, folder)})
        else:
            losses = known if known is not None else end_losses(end_models[0], [cloned(m) for m in end_models],
                                                                task, examples, folder)
            scores = score_way(moved[0], [cloned(m) for m in moved], losses, task, grid, examples, folder)
            report.update(way=way, models=[str(p) for p in models], grid=grid, examples=examples, end_losses=losses,
                          line_from=line, **scores)
        report.update(seconds=time.perf_counter() - start, cpu_seconds=time.process_time() - cpu,
                      provenance=provenance(resolved_config))
        with claim.writing() as tmp:
            write_json(report, tmp)
    return report


@command("kway")
@dataclass(frozen=True)
class Kway(Command):
    """symfusion-kway task=NAME ends=[DIR,DIR,...] output=FILE.json [models=[DIR,DIR,...]] [grid=4] [examples=N]
    [line=ENDS.json]"""
    groups = {"task": "fashion_mnist", "profile": "mini"}    # the profile: where the task's data come from, its size
    ends: list[str] = option(listing(text(), 2), "the k >= 2 end models as trained (the barrier's line; the first "
                             "gives a decoder's tokenizer)")
    output: str = option(PATH, "FILE.json: the scores")
    models: list[str] | None = option(listing(text(), 2, optional=True), "the k end models after one way of moving "
                                      "them into one basis, in the order of ends; null: score the end models, their "
                                      "best and their logit ensemble")
    grid: int = option(integer(1), "the simplex grid's step 1/grid (and the centroid)", 4)
    examples: int | None = option(integer(1, optional=True), "a seeded subset of N test examples for the simplex "
                                  "barrier; null: all (the centroid: always all)")
    way: str | None = option(text(optional=True), "a name for the way the models were moved, recorded (the table's "
                             "row: e.g. universe/full_symmetry)")
    line: str | None = option(text(optional=True), "with models=: the JSON of a run without models= on the same "
                              "ends and examples, whose end models' losses (the barrier's line) are read, not "
                              "computed again; null: computed")

    def run(self, cfg) -> None:
        report = run_kway(list(self.ends), None if self.models is None else list(self.models), task_of(cfg),
                          self.output, self.grid, self.examples, self.way, resolved(cfg), self.line)
        if self.models is None:
            best = report["best"]
            print(f"k = {report['k']} end models: best {best[report['metric']]:.4g} (model {best['model']}), ensemble "
                  f"{report['ensemble'][report['metric']]:.4g} -> {self.output}")
        else:
            print(f"{self.way or 'k-way'}: centroid {report['centroid'][report['metric']]:.4g} (loss "
                  f"{report['centroid']['loss']:.4f}), simplex barrier {report['barrier']:.4f} over "
                  f"{len(report['points'])} points -> {self.output}")
