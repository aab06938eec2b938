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
1% noise). Without --authors only our side and the floor are timed.

The true floor of the task is the GEMM floor plus the LAP floor: every exact assignment a matching solves (its cost
matrix, of its size and dtype, recorded as it is handed to the solver in one untimed extra run of each code) solved
again alone by each exact solver installed (scipy's linear_sum_assignment; `lap.lapjv` where it returns the same
assignment, ties included), the faster per matrix. A second table gives that floor, each code's all-in time over it,
and the share of each of our match.json stages in our all-in time; when the floor exceeds half the authors' time, no
implementation that solves the same assignments can be 2x faster than theirs. Every time is the median of --repeats
runs in one process, each repeat timing the GEMM floor, the authors, the LAP floors and ours one after the other
(interleaved, so that a shared machine's load weighs on all alike). A Llama-2-7B-shaped single layer (hidden 4096,
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

import lap
import numpy as np
import scipy.optimize
import torch
import transformers as tf

import symfusion
import symfusion.matching.heads
import symfusion.matching.permutation
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


class SolverLog:
    """Every exact assignment solved while it is on: count, seconds inside the solvers, and (keep=True) a copy of each
    cost matrix as handed to the solver (dtype included) with the sense it was solved in."""

    def __init__(self, keep: bool = False):
        self.keep, self.count, self.seconds, self.problems, self.shapes = keep, 0, 0.0, [], {}

    def wrap_scipy(self, solve):
        def recorded(cost, maximize=False):
            start = time.perf_counter()
            out = solve(cost, maximize=maximize)
            self._add(time.perf_counter() - start, cost, "max" if maximize else "min")
            return out
        return recorded

    def wrap_lapjv(self, solve):
        def recorded(cost, **kwargs):
            start = time.perf_counter()
            out = solve(cost, **kwargs)
            self._add(time.perf_counter() - start, cost, "min")
            return out
        return recorded

    def _add(self, seconds: float, cost, sense: str) -> None:
        self.count, self.seconds = self.count + 1, self.seconds + seconds
        shape = (tuple(cost.shape), str(cost.dtype))
        self.shapes[shape] = self.shapes.get(shape, 0) + 1
        if self.keep:
            self.problems.append((np.array(cost, copy=True), sense))

    def sizes(self) -> str:
        return ", ".join(f"{n} x {a}x{b} {dtype}" for ((a, b), dtype), n in self.shapes.items())


def solved(log: SolverLog, authors=None):
    """Puts `log` around the solvers where our matching (permutation.py, heads.py) and the authors' pi_utils call
    them; returns a function that takes it off."""
    places = [(symfusion.matching.permutation, "linear_sum_assignment"), (symfusion.matching.heads,
                                                                          "linear_sum_assignment")]
    if authors is not None:
        places.append((authors, "linear_sum_assignment"))
    kept = [(module, name, getattr(module, name)) for module, name in places]
    for module, name, solve in kept:
        setattr(module, name, log.wrap_scipy(solve))
    ours_lap = symfusion.matching.permutation.lap
    symfusion.matching.permutation.lap = type("lap", (), {"lapjv": staticmethod(log.wrap_lapjv(lap.lapjv))})

    def undo():
        for module, name, solve in kept:
            setattr(module, name, solve)
        symfusion.matching.permutation.lap = ours_lap
    return undo


def lap_floor(problems: list) -> dict:
    """Each recorded assignment solved alone once: scipy's linear_sum_assignment and lap.lapjv (square only, float64,
    minimising the negated cost as permutation.py does); `fastest`: per matrix the faster of the solvers whose
    assignment is scipy's exactly (ties included); `differ`: the matrices where lapjv's is not."""
    scipy_s = lapjv_s = fastest = 0.0
    differ = 0
    for cost, sense in problems:
        start = time.perf_counter()
        _, cols = scipy.optimize.linear_sum_assignment(cost, maximize=sense == "max")
        best = time.perf_counter() - start
        scipy_s += best
        if cost.shape[0] == cost.shape[1]:
            signed = -cost.astype(np.float64) if sense == "max" else cost.astype(np.float64)
            start = time.perf_counter()
            _, theirs, _ = lap.lapjv(signed, extend_cost=False)
            seconds = time.perf_counter() - start
            lapjv_s += seconds
            same = np.array_equal(np.asarray(theirs, dtype=np.int64), cols.astype(np.int64))
            differ += not same
            best = min(best, seconds) if same else best
        fastest += best
    return {"scipy": scipy_s, "lapjv": lapjv_s, "fastest": fastest, "differ": differ}


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


def recorded(run, theirs_module=None) -> SolverLog:
    """The assignments `run()` solves (cost matrices kept), in one untimed run."""
    kept = SolverLog(keep=True)
    undo = solved(kept, theirs_module)
    try:
        run()
    finally:
        undo()
    return kept


def ours(case: str, source: dict, anchor: dict, variant: str, workdir: Path, repeats: int, beside: dict) -> dict:
    """Our seconds all-in through folders (match.json, with the seconds inside the solvers) and through modules; each
    repeat also times every function of `beside` (name -> seconds or a dict of seconds), interleaved with ours so that
    a shared machine's load weighs on all alike; medians over the repeats (ours: the run of the median all-in time)."""
    s_model, a_model = models_of(case, source, anchor)
    folders = workdir / case
    if not (folders / "anchor").is_dir():
        s_model.save_pretrained(str(folders / "source"))
        a_model.save_pretrained(str(folders / "anchor"))
    problems = recorded(lambda: symfusion.align(s_model, a_model, variant))
    runs, module_runs, lap_seconds, others = [], [], [], {name: [] for name in beside}
    for r in range(repeats):
        for name, timed in beside.items():
            others[name].append(timed())
        others.setdefault("lap floor", []).append(lap_floor(problems.problems))
        output = folders / f"matched-{variant}-{r}"
        log = SolverLog()
        undo = solved(log)
        try:
            _, report = symfusion.align(str(folders / "source"), str(folders / "anchor"), variant, output=output)
        finally:
            undo()
        runs.append(report)
        lap_seconds.append(log.seconds)
        _, module_report = symfusion.align(s_model, a_model, variant)
        module_runs.append(module_report)
    problems.problems.clear()
    middle = sorted(range(repeats), key=lambda i: runs[i]["seconds"])[repeats // 2]
    medians = {name: ({k: statistics.median(v[k] for v in values) for k in values[0]} if isinstance(values[0], dict)
                      else statistics.median(values)) for name, values in others.items()}
    return {"folders": runs[middle]["seconds"], "stages": runs[middle]["seconds_by_stage"],
            "lap": lap_seconds[middle], "modules": statistics.median(rep["seconds"] for rep in module_runs),
            "distance": (runs[middle]["distance_before"], runs[middle]["distance_after"]), "problems": problems,
            **medians}


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
    floors = []
    with tempfile.TemporaryDirectory(prefix="bench_authors_") as tmp:
        for case in args.cases:
            source, anchor, layout = make_pair(case, args.noise) if case in CASES else planted(case, args.noise)
            beside, their_log = {"gemm": lambda: gemm_floor(source, anchor, layout)}, None
            if vit_theirs is not None and case == "vit-paper":
                beside["authors"] = lambda: authors_vit(vit_theirs, source, anchor, layout)
            elif layer_theirs is not None and case == "roberta-base":
                beside["authors"] = lambda: authors_layers(layer_theirs, source, anchor, layout, 12, 64)
            if "authors" in beside:
                their_log = recorded(beside["authors"], layer_theirs)
                beside["authors lap floor"] = lambda: lap_floor(their_log.problems)
            for variant in args.variants:
                r = ours(case, source, anchor, variant, Path(tmp), args.repeats, beside)
                floor, theirs = r["gemm"], r.get("authors")
                stages = ", ".join(f"{k} {v:.2f}" for k, v in r["stages"].items())
                cells = (case, variant, "-" if theirs is None else f"{theirs:.2f}", f"{r['folders']:.2f}",
                         f"{r['modules']:.2f}", "-" if theirs is None else f"{r['folders'] / theirs:.2f}x",
                         f"{floor:.2f}", f"{r['folders'] / floor:.2f}x", stages,
                         f"{r['distance'][0]:.1f} -> {r['distance'][1]:.1f}")
                print("| " + " | ".join(cells) + " |", flush=True)
                floors.append((case, variant, floor, theirs, their_log, r.get("authors lap floor"), r,
                               r["lap floor"]))
            if their_log is not None:
                their_log.problems.clear()
    print_floors(floors)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


def print_floors(floors: list) -> None:
    """The floor table: GEMM + LAP, each code over it, our stages' shares, and what the LAP floor rules out. The LAP
    floor is the faster of the two codes' recorded assignments (theirs are ours transposed: source by anchor)."""
    print("\n| case | variant | assignments solved: ours; the authors' | GEMM floor s | LAP floor s, ours: scipy / "
          "lapjv (assignments that differ) / fastest | the same, the authors' matrices | floor s (GEMM + LAP) "
          "| authors s | ours all-in s | ours inside the solvers s | ours / floor | authors / floor "
          "| LAP floor / authors | our stages, share of all-in |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    verdicts = []
    for case, variant, gemm, theirs, their_log, their_floor, r, lap_s in floors:
        same = their_log is not None and their_log.shapes == r["problems"].shapes
        lap_best = min(lap_s["fastest"], their_floor["fastest"]) if same else lap_s["fastest"]
        total = gemm + lap_best
        stages = dict(r["stages"])
        stages["other"] = r["folders"] - sum(stages.values())
        shares = ", ".join(f"{k} {100 * v / r['folders']:.1f}%" for k, v in stages.items())
        solved_by = f"{r['problems'].count}: {r['problems'].sizes() or 'none'}"
        solved_by += "" if their_log is None else f"; {their_log.count}: {their_log.sizes() or 'none'}"
        cells = (case, variant, solved_by, f"{gemm:.2f}", floor_cell(lap_s), floor_cell(their_floor), f"{total:.2f}",
                 "-" if theirs is None else f"{theirs:.2f}", f"{r['folders']:.2f}", f"{r['lap']:.2f}",
                 f"{r['folders'] / total:.2f}x", "-" if theirs is None else f"{theirs / total:.2f}x",
                 "-" if theirs is None else f"{lap_best / theirs:.2f}", shares)
        print("| " + " | ".join(cells) + " |", flush=True)
        if theirs is not None and same and total > theirs / 2:
            what = "the LAP floor alone" if lap_best > theirs / 2 else "the floor, GEMM + LAP,"
            verdicts.append(f"{case}, {variant}: {what} ({lap_best if lap_best > theirs / 2 else total:.2f} s) exceeds "
                            f"half the authors' time ({theirs:.2f} s): no implementation solving the same exact "
                            f"assignments can be 2x faster than theirs (at most {theirs / total:.2f}x, at the floor).")
    print("\n" + "\n".join(verdicts) if verdicts else "")


def floor_cell(lap_s: dict | None) -> str:
    if lap_s is None:
        return "-"
    return f"{lap_s['scipy']:.2f} / {lap_s['lapjv']:.2f} ({lap_s['differ']}) / {lap_s['fastest']:.2f}"


def planted(case: str, noise: float):
    """make_pair for the cases bench_matching does not hold (the Llama layer)."""
    CASES[case] = BUILDERS[case]
    try:
        return make_pair(case, noise)
    finally:
        del CASES[case]


if __name__ == "__main__":
    main()
