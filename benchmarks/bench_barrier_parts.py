"""Benchmark: which parts of a matched pair carry the loss barrier - each part merged alone, and all but it.

For a pair of end models (source onto anchor) and a matching, the source is moved onto the anchor, and for each
part P of the model (per layer: its Q/K maps, its V/O maps, its FFN, its norms and output biases; outside the
layers: each tensor) two models are evaluated on the test split:
    only P       the anchor with P replaced by the midpoint (anchor + moved source) / 2: the loss above the
                 anchor's is what merging P alone costs;
    all but P    the midpoint of every tensor except P, which stays the anchor's: the loss below the full
                 midpoint's is what P's merge adds to it, given everything else merged.
Neither mixed model lies on the linear path (one part merged is not a point of it), and the parts interact (the
two columns need not agree): the table locates where the midpoint's loss comes from. Prints one table per pair; the loss is the task's mean test
loss over --examples examples. With several pairs, a last table gives each part's mean over the pairs (and its
least and largest).
    python benchmarks/bench_barrier_parts.py --track vit --models DIR [--pairs seed2:seed1 ...] [--matching full_symmetry]
(a matching that reads data, full_symmetry_learned, reads the batches symfusion-match reads by default.)
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

import symfusion
from symfusion.arch import layout_of
from symfusion.io.modelio import load_model
from symfusion.matching import matching_config
from symfusion.matching.pairs import layer_prefix
from symfusion.pipeline.config import load_group
from symfusion.pipeline.tasks import make_task
from symfusion.pipeline.stages.match import Match

TRACKS = {"vit": ("fashion_mnist", 2000), "llama": ("lm_english", None)}


def parts(layout, keys) -> dict[str, list[str]]:
    """Canonical keys grouped into the parts of the table, in the model's order."""
    found: dict[str, list[str]] = {}
    placed = set()
    for i, layer in enumerate(layout.layers):
        for name, group in ((f"layer {i} Q/K", layer.attention.qk_keys()), (f"layer {i} V/O", layer.attention.vo_keys()),
                            (f"layer {i} FFN", layer.ffn.keys())):
            found[name] = [k for k in group if k in keys]
            placed.update(group)
        prefix = layer_prefix(layout, i)
        rest = [k for k in keys if k.startswith(prefix) and k not in placed]
        found[f"layer {i} norms, output biases"] = rest
        placed.update(rest)
    for k in keys:
        if k not in placed:
            found[k] = [k]
    return {name: group for name, group in found.items() if group}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--track", choices=list(TRACKS), required=True)
    parser.add_argument("--models", type=Path, required=True, help="folder holding the end models seed0, seed1, ...")
    parser.add_argument("--pairs", nargs="*", default=["seed1:seed0", "seed2:seed0", "seed2:seed1"], help="source:anchor")
    parser.add_argument("--matching", default="full_symmetry")
    parser.add_argument("--examples", type=int, default=None, help="test examples per evaluation (default: the track's)")
    args = parser.parse_args()
    task_name, examples = TRACKS[args.track]
    examples = args.examples or examples
    task = make_task(task_name, load_group("profile", "mini"))
    found: dict[str, list[tuple[float, float]]] = {}
    for pair in args.pairs:
        src_name, anc_name = pair.split(":")
        model, source_model = load_model(str(args.models / anc_name)), load_model(str(args.models / src_name))
        anchor = {k: v.detach().clone() for k, v in model.state_dict().items()}
        layout = layout_of(model.config, anchor)
        data = task.statistic_batches(Match.data_batches, str(args.models / src_name),
                                      Match.data_split) if matching_config(args.matching).needs_data else None
        matched, _ = symfusion.align(source_model, model, matching=args.matching, data=data)    # the one matching path
        moved = matched.state_dict()
        canon_a, canon_m = dict(layout.canonical(anchor)), dict(layout.canonical(moved))
        floating = [k for k, v in canon_a.items() if v.is_floating_point()]

        def loss(merged: set[str]) -> float:
            state = {k: 0.5 * (v + canon_m[k]) if k in merged else v for k, v in canon_a.items()}
            model.load_state_dict(layout.stored_form(state) if layout.stored else state)
            return task.evaluate(model.eval(), "test", model_dir=str(args.models / anc_name), examples=examples)["loss"]

        everything = set(floating)
        at_anchor, at_midpoint = loss(set()), loss(everything)
        print(f"\n{args.track} {pair}, {args.matching}: test loss of the anchor {at_anchor:.4f}, of the midpoint "
              f"{at_midpoint:.4f} ({examples or 'all'} examples)\n")
        print("| part | tensors | only this part merged: loss - anchor's | all but this part merged: midpoint's - loss |")
        print("|---|---|---|---|")
        for name, keys in parts(layout, floating).items():
            alone, added = loss(set(keys)) - at_anchor, at_midpoint - loss(everything - set(keys))
            found.setdefault(name, []).append((alone, added))
            print(f"| {name} | {len(keys)} | {alone:+.4f} | {added:+.4f} |", flush=True)
    if len(args.pairs) > 1:
        print(f"\nOver the {len(args.pairs)} pairs: mean (least, largest)\n")
        print("| part | only this part merged | all but this part merged |")
        print("|---|---|---|")
        for name, values in found.items():
            cells = [(sum(v) / len(v), min(v), max(v)) for v in zip(*values)]
            print(f"| {name} | " + " | ".join(f"{m:+.4f} ({lo:+.4f}, {hi:+.4f})" for m, lo, hi in cells) + " |")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
