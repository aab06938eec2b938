"""Benchmark: how far float32-rounding perturbations of an end model move a whole-symmetry merge.

The source end model's weights are multiplied by (1 + eps * noise), eps = 1e-7 by default (the size of float32
rounding), the noise drawn from fixed seeds; the unperturbed source and each perturbed one are matched onto the
anchor by symfusion.align() (by default full_symmetry_learned, reading the task's statistic batches as
`symfusion-match data_task=TASK data_split=SPLIT` does), merged by Simple averaging of the stored weights and
scored on the task's test split.
Prints one row per run (the descent's folded distance, the refinement's midpoint loss on its own data, the
merge's test metric and loss) and the spread (max - min over the runs) of the merge's metric, in points.
    python benchmarks/bench_stability_learned.py --anchor results/mini/vision/fashion_mnist/models/seed0 \\
        --source results/mini/vision/fashion_mnist/models/seed1 --task fashion_mnist [--seeds 1 2 3] \\
        [--eps 1e-7] [--matchings full_symmetry full_symmetry_learned] [--profile mini] [--data-split validation] \\
        [--examples N] [--refine-minimax 0.3 0.5 0.7]
Goal (issue 33): the learned variant's Simple merge moves by at most 0.5 points on the mini ViT pair.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import torch

import symfusion
from symfusion.interpolation import interpolate
from symfusion.io.modelio import load_model
from symfusion.matching import matching_config
from symfusion.pipeline.config import load_group
from symfusion.pipeline.tasks import make_task
from symfusion.pipeline.stages.match import Match


def perturbed(state: dict, seed: int | None, eps: float) -> dict:
    """Each floating tensor times (1 + eps * noise), noise standard normal from `seed` (None: unperturbed)."""
    if seed is None:
        return dict(state)
    gen = torch.Generator().manual_seed(seed)
    return {k: (v.double() * (1 + eps * torch.randn(v.shape, generator=gen, dtype=torch.float64))).to(v.dtype)
            if v.is_floating_point() else v for k, v in state.items()}


def run(args, task, matching: str, seed: int | None) -> dict:
    anchor_model, source_model = load_model(args.anchor), load_model(args.source)
    anchor, source = anchor_model.state_dict(), perturbed(source_model.state_dict(), seed, args.eps)
    source_model.load_state_dict(source)
    config = matching_config(matching)
    if args.refine_minimax:                           # as matching.refine_minimax=[...] on symfusion-match
        config = dataclasses.replace(config, refine_minimax=tuple(args.refine_minimax))
    data = task.statistic_batches(args.data_batches, args.source, args.data_split) if config.needs_data else None
    start = time.perf_counter()                       # the one matching path: align(), as symfusion-match runs it
    matched_model, report = symfusion.align(source_model, anchor_model, matching=config, data=data)
    seconds = time.perf_counter() - start
    matched = matched_model.state_dict()
    anchor_model.load_state_dict(interpolate(anchor, matched, 0.5))
    scores = task.evaluate(anchor_model.eval(), "test", model_dir=args.source, examples=args.examples)
    refine = report["residual"].get("refine", {})
    return {"matching": matching, "seed": seed, "seconds": seconds, "metric": scores.get("accuracy", scores["loss"]),
            "loss": scores["loss"], "folded_distance": report["residual"].get("folded_distance", float("nan")),
            "midpoint_loss": refine.get("midpoint_loss_after", float("nan")), "kept": refine.get("kept", "")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchor", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--task", required=True, help="the conf/task both models solve (its test split scores them)")
    parser.add_argument("--profile", default="mini")
    parser.add_argument("--matchings", nargs="*", default=["full_symmetry_learned"])
    parser.add_argument("--seeds", nargs="*", type=int, default=[1, 2, 3])
    parser.add_argument("--eps", type=float, default=1e-7)
    parser.add_argument("--data-batches", type=int, default=Match.data_batches,
                        help="as symfusion-match data_batches")
    parser.add_argument("--data-split", default=Match.data_split, choices=("train", "validation"),
                        help="as symfusion-match data_split")
    parser.add_argument("--examples", type=int, default=None, help="a seeded subset of the test split (default all)")
    parser.add_argument("--refine-minimax", type=float, nargs="*", default=None,
                        help="matching.refine_minimax for the learned matchings (path points)")
    args = parser.parse_args()
    task = make_task(args.task, load_group("profile", args.profile))
    scale = 100.0 if task.metric == "accuracy" else 1.0
    metric = "accuracy %" if task.metric == "accuracy" else "loss (nats)"
    digits = 2 if task.metric == "accuracy" else 4             # points, or nats as the test loss
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; source x (1 + {args.eps:g} noise), seeds "
          f"{args.seeds}; Simple merge scored on the test split ({args.examples or 'all'} examples)\n")
    print(f"| matching | perturbation seed | folded distance | midpoint loss (refinement data) | Simple {metric} | "
          "test loss | seconds |")
    print("|---|---|---|---|---|---|---|")
    spreads = {}
    for matching in args.matchings:
        rows = [run(args, task, matching, seed) for seed in [None, *args.seeds]]
        for r in rows:
            print(f"| {matching} | {'none' if r['seed'] is None else r['seed']} | {r['folded_distance']:.4f} | "
                  f"{r['midpoint_loss']:.4f} | {scale * r['metric']:.{digits}f} | {r['loss']:.4f} | {r['seconds']:.1f} |",
                  flush=True)
        metrics = [scale * r["metric"] for r in rows]
        spreads[matching] = (max(metrics) - min(metrics), max(r["loss"] for r in rows) - min(r["loss"] for r in rows))
    print(f"\n| matching | spread of Simple {metric} (max - min over {len(args.seeds) + 1} runs) | spread of "
          "test loss |\n|---|---|---|")
    for matching, (value, loss) in spreads.items():
        print(f"| {matching} | {value:.{digits}f} | {loss:.4f} |")


if __name__ == "__main__":
    main()
