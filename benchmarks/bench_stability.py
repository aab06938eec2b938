"""Benchmark: how far the last bits of an end model move a matching's result (issue 33).

The source's weights are multiplied by (1 + eps * noise) with fixed seeds, eps = 1e-7 by default (the size of
float32 rounding: end models trained on two CPUs differ this much); each copy, and the source itself, is matched
onto the anchor with every variant, merged by Simple fusion (the midpoint) and evaluated. Per variant the table
gives each copy's folded distance, whether the found transform's discrete part (head and FFN permutations,
residual permutation) equals the unperturbed source's, the largest change of the residual map, the simple
merge's metric (accuracy, or loss for language models), and the loss barrier along 11 points by the paper's
definition (max - min) and by Generalized LMC's (max of the loss above the straight line between the end
models); then the spread (max - min over the copies) of each. Reads the task's data (the mini profile's by
default); timings are the matching's wall seconds on this machine.
    python benchmarks/bench_stability.py --anchor DIR --source DIR --task fashion_mnist \
        [--variants full_symmetry rotation] [--seeds 1 2 3] [--eps 1e-7] [--barrier-examples 2000] [--profile mini]
"""
from __future__ import annotations

import argparse
import time

import torch

from symfusion.arch import layout_of
from symfusion.pipeline.config import load_group
from symfusion.interpolation import loss_path
from symfusion.matching import match_models
from symfusion.io.modelio import load_model
from symfusion.pipeline.tasks import make_task
from symfusion.symmetry import apply_transform


def perturbed(state: dict, seed: int, eps: float) -> dict:
    """Every floating tensor times (1 + eps * N(0, 1)), noise seeded; rounded back to its dtype."""
    gen = torch.Generator().manual_seed(seed)
    return {k: (v.double() * (1 + eps * torch.randn(v.shape, generator=gen, dtype=torch.float64))).to(v.dtype)
            if v.is_floating_point() else v for k, v in state.items()}


def discrete_part(transform) -> tuple:
    """The permutations of a transform: per layer its head and FFN permutations, and a residual map's pattern when it
    is a signed permutation."""
    layers = tuple((i, None if t.head_perm is None else tuple(t.head_perm.tolist()),
                    None if t.ffn_perm is None else tuple(t.ffn_perm.tolist())) for i, t in sorted(transform.layers.items()))
    r = None if transform.residual is None else transform.residual.r
    pattern = None if r is None or not bool(((r == 0) | (r.abs() == 1)).all()) else tuple(r.flatten().tolist())
    return layers, pattern


def evaluate(model, anchor: dict, moved: dict, task, model_dir: str, examples: int | None) -> dict:
    """The simple merge's metrics on the test split, and the loss path's two barriers."""
    model.load_state_dict({k: 0.5 * (v + moved[k]) if v.is_floating_point() else v for k, v in anchor.items()})
    merged = task.evaluate(model.eval(), "test", model_dir=model_dir)
    path = loss_path(model, anchor, moved, lambda m: task.evaluate(m, "test", model_dir=model_dir, examples=examples))
    metric = "accuracy" if "accuracy" in merged else "loss"
    return {"metric": metric, "value": merged[metric] * (100 if metric == "accuracy" else 1),
            "barrier": path["barrier"], "barrier_linear": path["barrier_linear"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--anchor", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--task", required=True, help="conf/task name (fashion_mnist, lm_english, ...)")
    parser.add_argument("--profile", default="mini")
    parser.add_argument("--variants", nargs="*", default=["full_symmetry"])
    parser.add_argument("--seeds", nargs="*", type=int, default=[1, 2, 3])
    parser.add_argument("--eps", type=float, default=1e-7)
    parser.add_argument("--barrier-examples", type=int, default=2000, help="test examples per path point (0: all)")
    args = parser.parse_args()
    profile = load_group("profile", args.profile)
    task = make_task(args.task, profile)
    model = load_model(args.source)
    source = {k: v.detach().clone() for k, v in model.state_dict().items()}
    anchor = {k: v.detach().clone() for k, v in load_model(args.anchor).state_dict().items()}
    layout = layout_of(model.config, anchor)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    examples = args.barrier_examples or None
    print(f"source {args.source} onto anchor {args.anchor}, task {args.task}; source x (1 + {args.eps:g} N(0,1)), "
          f"seeds {args.seeds}; barriers over 11 points, {examples or 'all'} test examples each\n")
    header = ("variant", "source", "match s", "folded distance", "same discrete part", "max |dR|", "simple",
              "barrier (max-min)", "barrier (above line)")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for variant in args.variants:
        rows, reference = [], None
        for seed in [None] + args.seeds:
            state = source if seed is None else perturbed(source, seed, args.eps)
            start = time.perf_counter()
            result = match_models(state, anchor, layout, variant, tied=tied)
            seconds = time.perf_counter() - start
            moved = apply_transform(state, layout, result.transform)
            scores = evaluate(model, anchor, moved, task, args.source, examples)
            r = result.transform.residual.r if result.transform.residual is not None else None
            if reference is None:
                reference = (discrete_part(result.transform), r)
            same = discrete_part(result.transform) == reference[0]
            change = 0.0 if r is None or reference[1] is None else float((r - reference[1]).abs().max())
            rows.append({**scores, "folded": result.residual.get("folded_distance", float("nan"))})
            cells = (variant, "as given" if seed is None else f"seed {seed}", f"{seconds:.1f}",
                     f"{rows[-1]['folded']:.6f}", "yes" if same else "**no**", f"{change:.1e}",
                     f"{scores['value']:.2f}" if scores["metric"] == "accuracy" else f"{scores['value']:.4f}",
                     f"{scores['barrier']:.4f}", f"{scores['barrier_linear']:.4f}")
            print("| " + " | ".join(cells) + " |", flush=True)
        spread = {k: max(r[k] for r in rows) - min(r[k] for r in rows) for k in ("value", "barrier", "barrier_linear")}
        value = f"{spread['value']:.2f}" if rows[0]["metric"] == "accuracy" else f"{spread['value']:.4f}"
        print(f"| {variant} | **spread** | | | | | **{value}** | **{spread['barrier']:.4f}** | "
              f"**{spread['barrier_linear']:.4f}** |", flush=True)


if __name__ == "__main__":
    main()
