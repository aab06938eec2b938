"""Benchmark: symfusion's pairwise matching beside the paper authors' own matching code, in one run, with the GEMM floor.

The authors' code (zhengzaiyi/RotationSymmetry: per-head SVDs of the attention maps, with their optional rescaling,
and scipy's assignment of the FFN neurons) is never copied into this repository: give the path of a checkout of
it (`git clone https://github.com/zhengzaiyi/RotationSymmetry PATH`) and this script imports it from there at run
time. Their ViT code (`vit-fusion/otfusion/pi_vit_fusion.py: pi_match`, `use_scaling=True`, the paper's matching
with rescaling, on their nested weight dicts) is timed on the ViT; on roberta-base the same functions layer by layer
(`pi_utils.Chunk_SVD_QK`, `Chunk_SVD_VO`, `Permute_IO`, as their `pi_fusion` calls them, `use_scaling=True`, with the
head size 64 that `pi_fusion` cannot pass: it assumes 32; their text merger's copy, `src/model_merge/pi_utils/utils.py`,
adds every head's slice to the whole bias's outer product and fails on these shapes). Their time is what their own
scripts time (`running_time['match']` in vit-fusion/main.py): the matching on weights already in memory, as plain
tensors (their model_to_dict passes Parameters, whose products autograd would also record). Ours is given two ways: `symfusion-match` all-in (match.json `seconds`:
reading the folders, the solve, the checks, the distances, writing; its `seconds_by_stage` alongside) and `align()`
on two nn.Modules (report `seconds`, all-in as well). The GEMM floor is the FFN cross products alone (every layer's
two (n x d) x (d x n) float32 products, numpy's BLAS as in matching/permutation.py): no exact FFN matching costs less.

The pairs are planted (bench_matching.make_pair: the anchor moved by a random symmetry, residual map included, plus
1% noise). Without --authors only our side and the floor are timed. A Llama-2-7B-shaped single layer (hidden 4096,
32 heads, FFN 11008, a small vocabulary) is timed for ours only (the authors' code has no Llama path).
    python benchmarks/bench_authors.py --authors /path/to/RotationSymmetry [--cases vit-paper roberta-base
        llama-2-7b-layer] [--variants rotation full_symmetry] [--threads 1] [--repeats 1]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers as tf

import symfusion
from bench_matching import CASES, calibration_seconds, make_pair

LLAMA_LAYER = "llama-2-7b-layer"
BUILDERS = {**CASES, LLAMA_LAYER: lambda: tf.LlamaForCausalLM(tf.LlamaConfig(
    vocab_size=1024, hidden_size=4096, intermediate_size=11008, num_hidden_layers=1, num_attention_heads=32,
    num_key_value_heads=32, tie_word_embeddings=False))}


def authors_modules(path: Path):
    """(their pi_vit_fusion, their pi_utils), imported from the checkout at `path` (vit-fusion/otfusion)."""
    found = path / "vit-fusion" / "otfusion"
    if not (found / "pi_vit_fusion.py").is_file():
        sys.exit(f"error: --authors {path}: no vit-fusion/otfusion/pi_vit_fusion.py there (a checkout of "
                 "github.com/zhengzaiyi/RotationSymmetry)")
    sys.path[:0] = [str(found), str(found.parent)]  # their code imports its siblings by plain name, and otfusion.*
    import pi_utils                                # noqa: E402 - theirs, found at run time only
    import pi_vit_fusion                           # noqa: E402
    return pi_vit_fusion, pi_utils


def nested(state: dict, layout) -> dict:
    """Their ViT code's nested weight dict (HF's file naming: encoder.layer.i.attention.attention.query, ...)."""
    def pair(linear):
        return {"weight": state[linear.weight], "bias": state[linear.bias]}
    layers = {}
    for i, block in enumerate(layout.layers):
        att, ffn = block.attention, block.ffn
        prefix = att.query_like[0].weight.split("attention.")[0]
        layers[str(i)] = {
            "attention": {"attention": {"query": pair(att.query_like[0]), "key": pair(att.key_like[0]),
                                        "value": pair(att.value)},
                          "output": {"dense": pair(att.output)}},
            "intermediate": {"dense": pair(ffn.input)}, "output": {"dense": pair(ffn.output)},
            "layernorm_before": {n: state[f"{prefix}layernorm_before.{n}"] for n in ("weight", "bias")},
            "layernorm_after": {n: state[f"{prefix}layernorm_after.{n}"] for n in ("weight", "bias")}}
    rest = {"embeddings": {k: v for k, v in state.items() if ".embeddings." in k},
            "layernorm": {n: state[f"vit.layernorm.{n}"] for n in ("weight", "bias")}}
    return {"vit": {**rest, "encoder": {"layer": layers}},
            "classifier": {n: state[f"classifier.{n}"] for n in ("weight", "bias")}}


VIT_PATTERNS = {"attn_patterns": {"query": "attention.attention.query", "key": "attention.attention.key",
                                  "value": "attention.attention.value", "output": "attention.output.dense"},
                "ffn_patterns": {"intermediate": "intermediate.dense", "output": "output.dense"}}


def authors_vit(theirs, source: dict, anchor: dict, layout) -> float:
    """Seconds of their pi_match (use_scaling=True) on the pair, as their main.py times it."""
    weights = {"model_0": nested(source, layout), "model_1": nested(anchor, layout)}
    start = time.perf_counter()
    theirs.pi_match(VIT_PATTERNS, weights, use_scaling=True)
    return time.perf_counter() - start


def authors_layers(theirs, source: dict, anchor: dict, layout, heads: int, head_size: int) -> float:
    """Seconds of their per-layer matching (pi_fusion's three calls, use_scaling=True) of every layer."""
    start = time.perf_counter()
    for block in layout.layers:
        att, ffn = block.attention, block.ffn
        maps = {"Q": att.query_like[0], "K": att.key_like[0], "V": att.value, "O": att.output}
        qkvo = [{f"{w}_{n}": s[m.weight if w == "W" else m.bias] for n, m in maps.items() for w in ("W", "B")}
                for s in (source, anchor)]
        io = [{"W_I": s[ffn.input.weight], "B_I": s[ffn.input.bias], "W_O_FFN": s[ffn.output.weight],
               "B_O_FFN": s[ffn.output.bias]} for s in (source, anchor)]
        theirs.Chunk_SVD_QK(qkvo[0], qkvo[1], num_attention_heads=heads, attention_head_size=head_size,
                            use_scaling=True)
        theirs.Chunk_SVD_VO(qkvo[0], qkvo[1], num_attention_heads=heads, attention_head_size=head_size,
                            use_scaling=True)
        theirs.Permute_IO(io[0], io[1])
    return time.perf_counter() - start


def gemm_floor(source: dict, anchor: dict, layout) -> float:
    """Seconds of every layer's FFN cross products, float32, numpy's BLAS (what the FFN matching cannot avoid)."""
    total = 0.0
    for block in layout.layers:
        ffn = block.ffn
        pairs = [(anchor[ffn.input.weight].numpy(), source[ffn.input.weight].numpy().T),
                 (anchor[ffn.output.weight].numpy().T, source[ffn.output.weight].numpy())]
        if ffn.gate is not None:
            pairs.append((anchor[ffn.gate.weight].numpy(), source[ffn.gate.weight].numpy().T))
        start = time.perf_counter()
        cross = pairs[0][0] @ pairs[0][1]
        for a, b in pairs[1:]:
            cross += a @ b
        total += time.perf_counter() - start
        del cross
    return total


def models_of(case: str, source: dict, anchor: dict):
    made = []
    for state in (source, anchor):
        model = BUILDERS[case]()
        model.load_state_dict(state)
        made.append(model.eval())
    return made


def ours(case: str, source: dict, anchor: dict, variant: str, workdir: Path, repeats: int) -> dict:
    """Our seconds all-in through folders (match.json) and through modules, medians of `repeats`."""
    s_model, a_model = models_of(case, source, anchor)
    folders = workdir / case
    if not (folders / "anchor").is_dir():
        s_model.save_pretrained(str(folders / "source"))
        a_model.save_pretrained(str(folders / "anchor"))
    runs, module_runs = [], []
    for r in range(repeats):
        output = folders / f"matched-{variant}-{r}"
        _, report = symfusion.align(str(folders / "source"), str(folders / "anchor"), variant, output=output)
        runs.append(report)
        _, module_report = symfusion.align(s_model, a_model, variant)
        module_runs.append(module_report)
    best = sorted(runs, key=lambda rep: rep["seconds"])[len(runs) // 2]
    return {"folders": statistics.median(rep["seconds"] for rep in runs), "stages": best["seconds_by_stage"],
            "modules": statistics.median(rep["seconds"] for rep in module_runs),
            "distance": (best["distance_before"], best["distance_after"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--authors", type=Path, help="a checkout of github.com/zhengzaiyi/RotationSymmetry")
    parser.add_argument("--cases", nargs="*", default=["vit-paper", "roberta-base", LLAMA_LAYER])
    parser.add_argument("--variants", nargs="*", default=["rotation", "full_symmetry"])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1); numpy's BLAS: set OMP_NUM_THREADS alike before the run")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--noise", type=float, default=0.01)
    args = parser.parse_args()
    unknown = [c for c in args.cases if c not in BUILDERS]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r} (one of {', '.join(BUILDERS)})")
    torch.set_num_threads(args.threads)
    vit_theirs, layer_theirs = authors_modules(args.authors) if args.authors else (None, None)
    calibration = calibration_seconds()
    load = os.getloadavg()[0]
    print(f"torch {torch.__version__}, numpy {np.__version__}, {torch.get_num_threads()} threads, load average "
          f"{load:.2f} at the start; calibration GEMM {calibration * 1000:.0f} ms "
          f"({2 * 2048 ** 3 / calibration / 1e9:.0f} GFLOP/s)\n")
    print("| case | variant | authors s | ours all-in s (match.json) | ours modules s | ours / authors | GEMM floor s "
          "| ours all-in / floor | ours' stages (all-in) | distance before -> after |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="bench_authors_") as tmp:
        for case in args.cases:
            source, anchor, layout = make_pair(case, args.noise) if case in CASES else planted(case, args.noise)
            floor = gemm_floor(source, anchor, layout)
            theirs = None
            if vit_theirs is not None and case == "vit-paper":
                theirs = statistics.median(authors_vit(vit_theirs, source, anchor, layout) for _ in range(args.repeats))
            elif layer_theirs is not None and case == "roberta-base":
                theirs = statistics.median(authors_layers(layer_theirs, source, anchor, layout, 12, 64)
                                           for _ in range(args.repeats))
            for variant in args.variants:
                r = ours(case, source, anchor, variant, Path(tmp), args.repeats)
                stages = ", ".join(f"{k} {v:.2f}" for k, v in r["stages"].items())
                cells = (case, variant, "-" if theirs is None else f"{theirs:.2f}", f"{r['folders']:.2f}",
                         f"{r['modules']:.2f}", "-" if theirs is None else f"{r['folders'] / theirs:.2f}x",
                         f"{floor:.2f}", f"{r['folders'] / floor:.2f}x", stages,
                         f"{r['distance'][0]:.1f} -> {r['distance'][1]:.1f}")
                print("| " + " | ".join(cells) + " |", flush=True)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


def planted(case: str, noise: float):
    """make_pair for the cases bench_matching does not hold (the Llama layer)."""
    CASES[case] = BUILDERS[case]
    try:
        return make_pair(case, noise)
    finally:
        del CASES[case]


if __name__ == "__main__":
    main()
