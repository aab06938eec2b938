"""Benchmark: k models merged into one (issue 58, its first step): the centroid merge and the simplex barrier of k ViTs.

For k end models (trained by the mini's recipe: symfusion-train task=fashion_mnist model=vit_mini profile=mini seed=S)
and each way of moving them into one basis, the table gives the centroid (equal-weight) merge's test accuracy and loss
(the 10,000 test images) and the simplex barrier: the largest, over a grid of the simplex (weights c/N, and the
centroid), of loss(sum_i w_i X_i) - sum_i w_i loss(X_i), on --examples test images (the mini barrier's subset).
    naive        the models as trained
    anchor       each model onto model 0 by pairwise full_symmetry (align(); anchor matching)
    perm         the universe (symfusion.align_many) over permutations only (the preset full_permutation): heads,
                 FFN neurons and a (signed) permutation of the residual stream, the same alternation (MergeMany-like)
    universe     the universe over the whole group, data-free (align_many, matching="full_symmetry")
  with --learned (the training split's statistic batches, as symfusion-match reads them for full_symmetry_learned):
    anchor_learned  each model onto model 0 by pairwise full_symmetry_learned (align() with data; its 200 steps)
    learned      the universe, then the learned k-way refinement of all k maps on the loss of mixtures over the
                 simplex (align_many, matching="full_symmetry_learned_many", data=...: its 400 steps;
                 matching/universe_learned.py); --learned-steps N: both rows N steps
  with --synthetic (no data read):
    synthetic    the universe, then the k-way refinement distilled on inputs it makes (align_many, matching=
                 "full_symmetry_synthetic" as its preset says: 600 steps on smooth-noise images or text the k models
                 write; matching/synthetic.py). --learned-only --synthetic --no-anchor-learned --no-kway-learned: it alone
  with --anchor-synthetic (no data read):
    anchor_synthetic  each model onto model 0 by pairwise full_symmetry_synthetic (align(), its preset's 600 steps):
                 the like-for-like anchor row for synthetic
beside the best end model and the logit ensemble (the mean of the k models' logits). Also each universe's objective
per round (in the folded gauge the whole-group solver measures), why it stopped, and its CPU seconds against k
pairwise full_symmetry solves timed in the same run, and for k = 2 (the first two models) the universe against the
pairwise solve: the folded distance and the Simple (midpoint) merge. The scores are the pipeline's (the k-way entry,
symfusion-kway): src/symfusion/pipeline/kway.py, the simplex maths in symfusion.interpolation.
    python benchmarks/bench_kway.py --models /work/kway-models [--names seed0 seed1 seed2] [--grid 4] [--learned]
With --task NAME (a causal_lm task, e.g. lm_english_plateau) the models are decoders and the task scores them: the
loss in nats per token on its held-out test blocks (all of them unless --examples), perplexity where the ViTs have
accuracy, the best end model the lowest loss, the logit ensemble the mean of the k models' next-token logits; the learned
rows read the task's train-split statistic batches (cut with the first model's tokenizer). With --untie also, for tied
decoders, the rows of each model untied first (io/untie.py: lm_head a copy of the embeddings, the same function), so
the residual map may be any orthogonal map: anchor_untie (pairwise full_symmetry_untie), universe_untie (align_many on
the untied copies, full_symmetry) and with --learned learned_untie (full_symmetry_learned on them).
    python benchmarks/bench_kway.py --task lm_english_plateau --models /work/plateau-models/llama_mini --untie
With --summary G1.json G2.json ... (each a --out of a full run on one group of k models, and of its --learned-only runs,
whose rows join the full run of the same --names): each group's row per way and the mean over groups with its 95% t
interval (the issue's targets: the learned barrier <= 5% of naive
averaging's, the data-free one <= 30% and below anchor matching's, the centroid >= the pairwise full_symmetry mean).
--learned-only --base G.json (a full run's --out for the same models): its --out is G's content with the new rows
added, so that --summary tabulates them beside G's (a row of G of the same name is refused, never replaced).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

import symfusion
from symfusion.arch import layout_of
from symfusion.interpolation import mixture, simplex_grid
from symfusion.io.untie import is_tied, untied
from symfusion.io.modelio import load_model
from symfusion.io.provenance import cpu_model
from symfusion.matching import match_models, matching_config
from symfusion.pipeline import kway
from symfusion.pipeline.config import load_group
from symfusion.pipeline.kway import best_of, end_losses, score_way
from symfusion.pipeline.report.spread import over_pairs
from symfusion.pipeline.tasks import make_task
from symfusion.symmetry import apply_transform

# the permutation-only universe (MergeMany-like): heads, FFN neurons and a (signed) permutation of the residual stream
PERMUTATIONS = "full_permutation"
# the learned rows' presets: pairwise onto model 0, and the k-way one (the pipeline entry's, table_kway)
LEARNED_ROWS = {"anchor_learned": "full_symmetry_learned", "learned": "full_symmetry_learned_many"}


def evaluate(model, state, task, examples=None) -> dict:
    """The task's metric and loss of `state` on the test split (pipeline/kway.py); a decoder's blocks are cut with the
    tokenizer of the folder task.folder (main sets it)."""
    return kway.evaluate(model, state, task, examples, getattr(task, "folder", None))


def score(row: dict) -> str:
    """A row's metric as the tables print it: accuracy in %, or perplexity."""
    return f"{100 * row['accuracy']:.2f}" if "accuracy" in row else f"{row['perplexity']:.2f}"


def scored_way(model, states, ends, task, args) -> dict:
    """The centroid merge and the simplex barrier of one way (pipeline/kway.score_way), on --grid and --examples."""
    return score_way(model, states, ends, task, args.grid, args.examples, getattr(task, "folder", None))


def pair_check(models, states, pair_state, pair_distance, task, args) -> dict:
    """k = 2: the universe of the first two models against the pairwise solve of model 1 onto model 0 (its moved
    state and folded distance): the folded distance and the Simple merge of each."""
    two, two_report = symfusion.align_many(models[:2], max_rounds=args.max_rounds)
    two_states = [m.state_dict() for m in two]
    work = load_model(str(args.models / args.names[0])).eval()
    return {"pairwise": {"distance": pair_distance,
                         "simple": evaluate(work, mixture([states[0], pair_state], [0.5, 0.5]), task)},
            "universe": {"distance": two_report["pairwise_distance_after"][0][1],
                         "simple": evaluate(work, mixture(two_states, [0.5, 0.5]), task),
                         "objective": two_report["objective"], "seconds": two_report["cpu_seconds"]}}


def onto_first(models, first: dict, matching, **options) -> tuple[float, tuple[list, None]]:
    """Anchor matching: each model after the first onto it by pairwise align() (`first`: the first's state as the
    way holds it); (the all-in CPU seconds, (the states, no report))."""
    cpu, moved = time.process_time(), [first]
    for model in models[1:]:
        matched, _ = symfusion.align(model, models[0], matching=matching, **options)
        moved.append({k: v.detach().clone() for k, v in matched.state_dict().items()})
    return time.process_time() - cpu, (moved, None)


def steps_of(name: str, steps: int | None):
    """The matching preset `name`, with refine_steps=`steps` where given."""
    config = matching_config(name)
    return config if steps is None else dataclasses.replace(config, refine_steps=steps)


def learned_configs(args) -> dict:
    """The learned rows' MatchConfigs, by row: each its preset, refine_steps=--learned-steps where given."""
    return {row: steps_of(name, args.learned_steps) for row, name in LEARNED_ROWS.items()}


def learned_steps(args) -> dict:
    """The learned rows' refine_steps, by row."""
    return {row: config.refine_steps for row, config in learned_configs(args).items()}


def learned_ways(args, models, states, task, ways: dict, cpu_of: dict) -> None:
    """The learned rows into `ways` (states, report) and their all-in CPU seconds into `cpu_of`: anchor_learned
    (pairwise full_symmetry_learned of each model onto model 0) unless --no-anchor-learned, and learned (align_many
    with full_symmetry_learned_many: the universe, then the k-way refinement), each its preset's refine_steps (or
    --learned-steps) on --data-batches training batches; with --synthetic also synthetic (align_many with full_symmetry_synthetic as
    its preset says: the universe, then the k-way refinement distilled on inputs it makes; no data read)."""
    if args.synthetic:
        cpu = time.process_time()
        aligned, report = symfusion.align_many(models, matching="full_symmetry_synthetic", max_rounds=args.max_rounds)
        cpu_of["synthetic"], ways["synthetic"] = time.process_time() - cpu, ([m.state_dict() for m in aligned], report)
        print(f"synthetic: {cpu_of['synthetic']:.1f} CPU s (data-free start {report['cpu_seconds']:.1f}); refine: "
              f"{json.dumps(report['refine'])}", flush=True)
    if args.anchor_synthetic:
        cpu_of["anchor_synthetic"], ways["anchor_synthetic"] = onto_first(models, states[0], "full_symmetry_synthetic")
        print(f"anchor_synthetic: {cpu_of['anchor_synthetic']:.1f} CPU s ({len(models) - 1} pairwise)", flush=True)
    if not (args.learned or args.learned_only) or (args.no_anchor_learned and args.no_kway_learned):
        return
    data = task.statistic_batches(args.data_batches, args.models / args.names[0], "train")
    configs = learned_configs(args)
    pairwise, learned = configs["anchor_learned"], configs["learned"]
    if not args.no_anchor_learned:
        cpu_of["anchor_learned"], ways["anchor_learned"] = onto_first(models, states[0], pairwise, data=data)
        print(f"anchor_learned: {cpu_of['anchor_learned']:.1f} CPU s ({len(models) - 1} pairwise)", flush=True)
    if args.no_kway_learned:
        return
    cpu = time.process_time()
    aligned, report = symfusion.align_many(models, matching=learned, max_rounds=args.max_rounds, data=data)
    cpu_of["learned"], ways["learned"] = time.process_time() - cpu, ([m.state_dict() for m in aligned], report)
    print(f"learned ({learned.refine_steps} steps, {len(data)} batches): {cpu_of['learned']:.1f} CPU s (data-free start "
          f"{report['cpu_seconds']:.1f}); refine: {json.dumps(report['refine'])}", flush=True)
    if args.untie:
        cpu = time.process_time()
        aligned, report = symfusion.align_many([untied(m) for m in models], matching=learned,
                                               max_rounds=args.max_rounds, data=data)
        cpu_of["learned_untie"] = time.process_time() - cpu
        ways["learned_untie"] = ([m.state_dict() for m in aligned], report)
        print(f"learned_untie: {cpu_of['learned_untie']:.1f} CPU s; refine: {json.dumps(report['refine'])}", flush=True)


def learned_only(args, models, states, task, work) -> None:
    """--learned-only: the learned rows alone (the others: a full run of this benchmark), their centroid on the whole
    test split and simplex barrier as main() measures them."""
    k, ways, cpu_of = len(models), {}, {}
    learned_ways(args, models, states, task, ways, cpu_of)
    grid = simplex_grid(k, args.grid)
    ends_subset = end_losses(work, states, task, args.examples, getattr(task, "folder", None))
    rows = {}
    for name, (aligned, report) in ways.items():
        into = untied(work) if name.endswith("_untie") else work
        way = scored_way(into, aligned, ends_subset, task, args)
        rows[name] = {"centroid": way["centroid"], "barrier": way["barrier"],
                      "cpu_seconds": cpu_of[name], "refine": None if report is None else report["refine"],
                      "checks": None if report is None else [c["relative_output_change_float64"]
                                                             for c in report["checks"]]}
        print(name, json.dumps(rows[name]), flush=True)
    print(f"\nk = {k} {args.kind} ({', '.join(args.names)}), {cpu_model() or 'unknown CPU'}, 1 thread; refine steps "
          f"{json.dumps(learned_steps(args))} on {args.data_batches} training batches; the barrier over {len(grid)} "
          f"simplex points on {args.on}\n")
    print(f"| models into one basis | centroid {args.metric} | centroid loss | simplex barrier | CPU s (all-in) |")
    print("|---|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {score(row['centroid'])} | {row['centroid']['loss']:.4f} | "
              f"{row['barrier']:.4f} | {row['cpu_seconds']:.1f} |")
    if args.out:
        record = {"cpu": cpu_model() or 'unknown CPU', "names": args.names, "rows": rows,
                  "cpu_all_in": cpu_of, "steps": learned_steps(args), "batches": args.data_batches}
        if args.base is not None:
            record = with_base(args.base, record)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1))


def refuse(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def check_base(args) -> None:
    """--base: only with --learned-only and --out (another file), a full run on the same models without these rows."""
    if not args.learned_only or args.out is None or args.out.resolve() == args.base.resolve():
        refuse("--base needs --learned-only and an --out other than the base")
    try:
        base = json.loads(args.base.read_text())
    except (OSError, ValueError) as error:
        refuse(f"--base {args.base}: not a readable JSON ({type(error).__name__})")
    if not isinstance(base, dict) or base.get("names") != args.names or not isinstance(base.get("rows"), dict):
        refuse(f"--base {args.base} is not a full run on {' '.join(args.names)}")
    planned = {"anchor_synthetic": args.anchor_synthetic, "synthetic": args.synthetic,
               "anchor_learned": not args.no_anchor_learned, "learned": not args.no_kway_learned,
               "learned_untie": args.untie and not args.no_kway_learned}
    clash = sorted(name for name, on in planned.items() if on and name in base["rows"])
    if clash:
        refuse(f"--base {args.base} already has the rows {', '.join(clash)}")


def with_base(base: Path, record: dict) -> dict:
    """--base G.json: G's record (a full run on the same models) with this --learned-only record's rows and CPU
    seconds added, as --summary puts a group's runs together (grouped)."""
    merged = grouped([json.loads(base.read_text()), record])[0]
    return {**merged, "added": {"cpu": record["cpu"], "rows": sorted(record["rows"])}}


def interval(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    """'mean [low, high]' over groups (the 95% t interval), or the one value."""
    spread = over_pairs({str(i): v * scale for i, v in enumerate(values)})
    if spread["pairs"] < 2:
        return f"{spread['mean']:.{digits}f} (1 group)"
    return f"{spread['mean']:.{digits}f} [{spread['low']:.{digits}f}, {spread['high']:.{digits}f}]"


def grouped(records: list[dict]) -> list[dict]:
    """The runs of one group of models (the same `names`) as one record: a full run's, with the rows of its other runs
    (--learned-only ones, with or without --base) added; a way measured twice for one group, with two results, is
    refused."""
    def all_in(record: dict) -> dict:          # a --learned-only row carries its all-in CPU seconds itself
        rows = {k: r["cpu_seconds"] for k, r in record["rows"].items() if r.get("cpu_seconds") is not None}
        return {**rows, **(record.get("cpu_all_in") or {})}

    groups: dict[tuple, dict] = {}
    for record in records:
        key = tuple(record.get("names") or ())
        if key not in groups:
            groups[key] = {**record, "rows": dict(record["rows"]), "cpu_all_in": all_in(record)}
            continue
        group = groups[key]
        clash = sorted(k for k in set(group["rows"]) & set(record["rows"]) if group["rows"][k] != record["rows"][k])
        if clash:                                # a row copied by --base is the same measurement: not a clash
            refuse(f"--summary: {' '.join(key)} has the rows {', '.join(clash)} in two runs that differ")
        group["rows"].update(record["rows"])
        group["cpu_all_in"].update(all_in(record))
        if "best" not in group and "best" in record:
            groups[key] = {**record, "rows": group["rows"], "cpu_all_in": group["cpu_all_in"]}
    missing = [" ".join(k) or "a run without names" for k, g in groups.items() if "best" not in g]
    if missing:
        refuse(f"--summary: {', '.join(missing)}: no full run (only --learned-only rows)")
    return list(groups.values())


def summary(paths: list[Path]) -> None:
    """--summary: per group and over groups (mean [95% t interval]) from the JSONs of full runs (all ViT runs, or
    all decoder runs: perplexity where the ViTs have accuracy; the paired differences in loss then); a group's
    --learned-only runs (the same --names) add their rows to its full run's."""
    runs = grouped([json.loads(p.read_text()) for p in paths])
    kinds = {"accuracy" in r["best"] for r in runs}
    if len(kinds) > 1:
        refuse("--summary tabulates runs of one kind: ViT runs (accuracy) or decoder runs (--task), not both")
    vit = kinds == {True}
    metric, scale = ("accuracy", 100) if vit else ("perplexity", 1)
    labels = [" ".join(r.get("names") or [f"group {i + 1}"]) for i, r in enumerate(runs)]
    ways = [w for w in runs[0]["rows"] if all(w in r["rows"] for r in runs)]
    print(f"{len(runs)} groups ({'; '.join(labels)}), {', '.join(sorted({r['cpu'] for r in runs}))}\n")
    print(f"| way | group | centroid {'accuracy %' if vit else 'perplexity'} | centroid loss | simplex barrier | "
          "% of naive's |")
    print("|---|---|---|---|---|---|")
    percent = {w: [100 * r["rows"][w]["barrier"] / r["rows"]["naive"]["barrier"] for r in runs] for w in ways}
    for way in ways:
        rows = [r["rows"][way] for r in runs]
        for label, row, share in zip(labels, rows, percent[way]):
            print(f"| {way} | {label} | {scale * row['centroid'][metric]:.2f} | {row['centroid']['loss']:.4f} | "
                  f"{row['barrier']:.4f} | {share:.1f} |")
        print(f"| **{way}** | mean [95% t] | {interval([r['centroid'][metric] for r in rows], scale)} | "
              f"{interval([r['centroid']['loss'] for r in rows], digits=4)} | "
              f"{interval([r['barrier'] for r in rows], digits=4)} | {interval(percent[way], digits=1)} |")
    for name, key in (("best end model", "best"), ("logit ensemble", "ensemble")):
        print(f"| {name} | mean [95% t] | {interval([r[key][metric] for r in runs], scale)} | "
              f"{interval([r[key]['loss'] for r in runs], digits=4)} | | |")
    print()
    for better, worse in (("universe", "anchor"), ("universe_anchor", "anchor"), ("universe_anchor", "universe"),
                          ("learned", "anchor_learned"), ("learned", "universe"), ("learned", "anchor"),
                          ("universe_untie", "anchor_untie"), ("learned_untie", "learned"),
                          ("synthetic", "anchor"), ("synthetic", "universe"), ("learned", "synthetic"),
                          ("synthetic", "anchor_synthetic"), ("anchor_synthetic", "anchor")):
        if better in ways and worse in ways:
            barrier = [r["rows"][better]["barrier"] - r["rows"][worse]["barrier"] for r in runs]
            key, unit, factor = ("accuracy", "points", 100) if vit else ("loss", "nats", 1)
            centroid = [r["rows"][better]["centroid"][key] - r["rows"][worse]["centroid"][key] for r in runs]
            print(f"paired {better} - {worse}: barrier {interval(barrier, digits=4)} (per group "
                  f"{', '.join(f'{b:+.4f}' for b in barrier)}); centroid {key} {interval(centroid, factor, 4 - 2 * vit)} "
                  f"{unit} (per group {', '.join(f'{factor * a:+.{4 - 2 * vit}f}' for a in centroid)})")
    for way, start in (("universe", "incremental"), ("universe_anchor", "anchor")):
        ratio = [r["rows"][way]["seconds"] / (len(r["pairwise_cpu"]) + 1) / (sum(r["pairwise_cpu"]) /
                 len(r["pairwise_cpu"])) for r in runs if r.get("pairwise_cpu") and way in r["rows"]]
        if len(ratio) == len(runs):
            print(f"the data-free universe's solve ({start} start) / k pairwise full_symmetry solves (CPU s, same "
                  f"run): {interval(ratio)} (per group {', '.join(f'{x:.2f}' for x in ratio)})")
    for way in ("anchor_learned", "learned", "synthetic", "anchor_synthetic"):
        seconds = [r.get("cpu_all_in", {}).get(way) for r in runs]
        if all(x is not None for x in seconds):
            print(f"{way}: {interval(seconds, digits=1)} CPU s all-in (per group {', '.join(f'{x:.1f}' for x in seconds)})")


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=Path("/work/kway-models"))
    parser.add_argument("--names", nargs="+", default=["seed0", "seed1", "seed2"])
    parser.add_argument("--grid", type=int, default=4, help="simplex grid step 1/N (plus the centroid)")
    parser.add_argument("--examples", type=int, default=None,
                        help="test examples per barrier point (default: the mini's 2,000 images; a decoder's all blocks)")
    parser.add_argument("--task", default="fashion_mnist", help="the task that scores the models (a causal_lm task: "
                        "decoders, perplexity), e.g. lm_english_plateau")
    parser.add_argument("--untie", action="store_true", help="also the rows of tied decoders untied first")
    parser.add_argument("--max-rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--skip-k2", action="store_true", help="leave out the k = 2 comparison with the pairwise solve")
    parser.add_argument("--timing-only", action="store_true", help="only the solves' seconds (wall and CPU), no evaluation")
    parser.add_argument("--learned", action="store_true", help="also the learned rows (anchor_learned, learned)")
    parser.add_argument("--learned-steps", type=int, default=None, help="refine_steps of the learned rows (default: "
                        "each preset's: anchor_learned full_symmetry_learned's, learned full_symmetry_learned_many's)")
    parser.add_argument("--data-batches", type=int, default=200, help="training batches the learned rows read")
    parser.add_argument("--synthetic", action="store_true", help="also the synthetic row (align_many with "
                        "full_symmetry_synthetic: the k-way refinement distilled on inputs it makes, no data)")
    parser.add_argument("--learned-only", action="store_true", help="only the learned rows (and their evaluation)")
    parser.add_argument("--anchor-synthetic", action="store_true", help="also the anchor_synthetic row (pairwise "
                        "full_symmetry_synthetic onto model 0; no data)")
    parser.add_argument("--base", type=Path, default=None, help="with --learned-only: a full run's --out on the same "
                        "models; --out then holds its rows and these")
    parser.add_argument("--no-anchor-learned", action="store_true", help="leave out the anchor_learned row")
    parser.add_argument("--no-kway-learned", action="store_true", help="leave out the learned (k-way) row")
    parser.add_argument("--summary", type=Path, nargs="+", help="only the table over groups of these --out JSONs")
    args = parser.parse_args()
    if args.summary:
        return summary(args.summary)
    if args.base is not None:
        check_base(args)
    torch.set_num_threads(1)
    models = [load_model(str(args.models / n)).eval() for n in args.names]
    states = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in models]
    layout = layout_of(models[0].config, states[0])
    task = make_task(args.task, load_group("profile", "mini"))
    task.folder = args.models / args.names[0]                 # a decoder's test blocks: cut with its tokenizer
    decoder = task.metric == "perplexity"
    if args.examples is None and not decoder:
        args.examples = 2000                                  # the mini barrier's subset of test images
    args.kind, args.metric = ("decoders", "perplexity") if decoder else ("ViTs", "accuracy %")
    args.on = (f"{args.examples or 'all'} test blocks (the centroid on all)" if decoder else
               f"{args.examples} test images; the centroid on all 10,000")
    work = load_model(str(args.models / args.names[0])).eval()
    k, full = len(models), matching_config("full_symmetry")
    if args.learned_only:
        return learned_only(args, models, states, task, work)

    pairwise_seconds, pairwise_cpu, anchor, pairwise_folded = [], [], [states[0]], []
    for i in range(1, k):
        start, cpu = time.perf_counter(), time.process_time()
        result = match_models(states[i], states[0], layout, full, tied=is_tied(models[0]))
        pairwise_seconds.append(time.perf_counter() - start)
        pairwise_cpu.append(time.process_time() - cpu)
        anchor.append(apply_transform(states[i], layout, result.transform))
        pairwise_folded.append(result.residual["folded_distance"])
    ways, cpu_of = {"naive": (states, None), "anchor": (anchor, None)}, {}
    for name, config, start in (("perm", PERMUTATIONS, "incremental"), ("universe", "full_symmetry", "incremental"),
                                ("universe_anchor", "full_symmetry", "anchor")):
        cpu = time.process_time()
        aligned, report = symfusion.align_many(models, matching=config, max_rounds=args.max_rounds, start=start)
        cpu_of[name] = time.process_time() - cpu                  # with align_many's functional checks
        ways[name] = ([m.state_dict() for m in aligned], report)
    if args.untie:
        cpu_of["anchor_untie"], ways["anchor_untie"] = onto_first(models, untied(models[0]).state_dict(),
                                                                  "full_symmetry_untie")
        cpu = time.process_time()
        aligned, report = symfusion.align_many([untied(m) for m in models], matching="full_symmetry",
                                               max_rounds=args.max_rounds)
        cpu_of["universe_untie"] = time.process_time() - cpu
        ways["universe_untie"] = ([m.state_dict() for m in aligned], report)
    if args.learned or args.synthetic or args.anchor_synthetic:
        learned_ways(args, models, states, task, ways, cpu_of)
    one, universe = sum(pairwise_cpu) / len(pairwise_cpu), ways["universe"][1]
    per_round = ", ".join(f"{r['cpu_seconds']:.1f}" for r in universe["rounds"])
    print(f"{cpu_model() or 'unknown CPU'}, 1 thread: one pairwise full_symmetry solve {one:.2f} CPU s (mean of {len(pairwise_cpu)}; "
          f"wall {sum(pairwise_seconds) / len(pairwise_seconds):.2f} s); k of them {k * one:.1f} CPU s; the universe's "
          f"solve {universe['cpu_seconds']:.1f} CPU s = {universe['cpu_seconds'] / (k * one):.2f}x (start "
          f"{universe['start_cpu_seconds']:.1f}, then {len(universe['rounds'])} rounds: "
          f"{per_round}; stop: {universe['stop']}; with the "
          f"functional checks {cpu_of['universe']:.1f} CPU s); the permutation universe {cpu_of['perm']:.1f} CPU s",
          flush=True)
    anchored = ways["universe_anchor"][1]
    anchored_rounds = ", ".join(f"{r['cpu_seconds']:.1f}" for r in anchored["rounds"])
    print(f"universe_anchor (each model onto model 0 first, then the rounds): {anchored['cpu_seconds']:.1f} CPU s = "
          f"{anchored['cpu_seconds'] / (k * one):.2f}x k pairwise (start {anchored['start_cpu_seconds']:.1f}, then "
          f"{len(anchored['rounds'])} rounds: {anchored_rounds}; stop: {anchored['stop']})", flush=True)
    for name in ("universe", "universe_anchor", "perm"):
        print(f"{name}: J ({ways[name][1]['gauge']}) after the start and each round: "
              f"{', '.join(f'{j:.3f}' for j in ways[name][1]['objective'])}; stop: {ways[name][1]['stop']}", flush=True)
    if args.timing_only:
        return

    grid = simplex_grid(k, args.grid)
    ends_subset = end_losses(work, states, task, args.examples, getattr(task, "folder", None))
    ends_full = [evaluate(work, s, task) for s in states]
    rows, work_untied = {}, untied(work)
    for name, (aligned, report) in ways.items():
        into = work_untied if name.endswith("_untie") else work      # the untied rows' states hold their own lm_head
        way = scored_way(into, aligned, ends_subset, task, args)
        rows[name] = {"centroid": way["centroid"], "barrier": way["barrier"],
                      "objective": None if report is None else report["objective"],
                      "converged": None if report is None else report["converged"],
                      "seconds": None if report is None else report["cpu_seconds"],
                      "stop": None if report is None else report["stop"],
                      "checks": None if report is None else [c["relative_output_change_float64"] for c in report["checks"]],
                      "refine": None if report is None else report.get("refine")}
        print(name, json.dumps(rows[name]), flush=True)
    best = best_of(ends_full)
    logit = kway.ensemble(models, task, getattr(task, "folder", None))

    k2 = None if args.skip_k2 else pair_check(models, states, anchor[1], pairwise_folded[0], task, args)

    print(f"\nk = {k} {args.kind} ({', '.join(args.names)}), {cpu_model() or 'unknown CPU'}, 1 thread; the barrier over {len(grid)} "
          f"simplex points (step 1/{args.grid} and the centroid) on {args.on}\n")
    print(f"| models into one basis | centroid {args.metric} | centroid loss | simplex barrier | objective J (start -> "
          "end) | rounds | solve CPU s |")
    print("|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        objective = "" if row["objective"] is None else f"{row['objective'][0]:.1f} -> {row['objective'][-1]:.1f}"
        rounds = "" if row["objective"] is None else f"{len(row['objective']) - 1} ({row['stop']})"
        seconds = f"{sum(pairwise_cpu):.1f} ({k - 1} pairwise)" if name == "anchor" else \
            f"{cpu_of[name]:.1f} (all-in)" if name in ("anchor_learned", "learned", "anchor_untie", "universe_untie",
                                                        "learned_untie", "synthetic", "anchor_synthetic") else \
            ("" if row["seconds"] is None else f"{row['seconds']:.1f}")
        print(f"| {name} | {score(row['centroid'])} | {row['centroid']['loss']:.4f} | "
              f"{row['barrier']:.4f} | {objective} | {rounds} | {seconds} |")
    print(f"| best end model | {score(best)} | {best['loss']:.4f} | | | | |")
    print(f"| logit ensemble | {score(logit)} | {logit['loss']:.4f} | | | | |")
    print(f"\none pairwise full_symmetry solve: {one:.2f} CPU s (mean of {len(pairwise_cpu)}); k of them: {k * one:.1f} s; "
          f"the universe's solve: {rows['universe']['seconds']:.1f} CPU s = {rows['universe']['seconds'] / (k * one):.2f}x")
    print(f"the universe's J per round: {', '.join(f'{j:.2f}' for j in rows['universe']['objective'])}")
    print(f"the permutation universe's J per round: {', '.join(f'{j:.2f}' for j in rows['perm']['objective'])}")
    if k2 is not None:
        print(f"\nk = 2 ({args.names[1]} and {args.names[0]}), folded distances: pairwise full_symmetry {k2['pairwise']['distance']:.4f}, "
              f"Simple {score(k2['pairwise']['simple'])} (loss {k2['pairwise']['simple']['loss']:.4f}); "
              f"universe distance {k2['universe']['distance']:.4f}, Simple {score(k2['universe']['simple'])} "
              f"(loss {k2['universe']['simple']['loss']:.4f}); its J per round "
              f"{', '.join(f'{j:.3f}' for j in k2['universe']['objective'])}, {k2['universe']['seconds']:.1f} CPU s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"cpu": cpu_model() or 'unknown CPU', "names": args.names, "rows": rows, "best": best,
                                        "ensemble": logit, "k2": k2, "task": args.task, "pairwise_seconds": pairwise_seconds,
                                        "pairwise_cpu": pairwise_cpu, "cpu_all_in": cpu_of, "ends": ends_full,
                                        "steps": learned_steps(args) if args.learned else None}, indent=1))


if __name__ == "__main__":
    main()
