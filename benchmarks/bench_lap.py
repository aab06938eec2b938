"""Exact linear-assignment solvers on this project's FFN cost matrices at 7B sizes: time, optimum, agreement.

    python benchmarks/bench_lap.py [--sizes 11008,14336] [--cache DIR] [--repeat 1]
    python benchmarks/bench_lap.py --planted vit-paper roberta-base

The cost matrix is matching/permutation.py's FFN cross product C = W_i1 W_i2^T + W_g1 W_g2^T + W_o1^T W_o2 of
two unrelated random SwiGLU layers of Llama shapes (hidden 4096; FFN 11008: Llama-2-7B, 14336: Llama-3-8B),
the case where the solver really runs (a fine-tune's row argmax is already a permutation and skips it). The
matrices are cached as .npy (the products cost minutes) so that solvers installed in other environments run
on the same matrices: `lap` and `lapx` both install the module `lap`, so run the script once in each.
Every solver found is timed on each matrix; its optimum must equal the first solver's to float64 rounding
(the assignment may differ only where ties leave the optimum unchanged). The table also gives each time as
a multiple of a float32 2048^3 GEMM on one thread (the calibration of benchmarks/bench_pipeline.py).

--planted CASE...: instead, every layer's FFN cost matrix of bench_matching's planted pair of that shape (the paper's
ViT, roberta-base: the assignments `rotation` solves there, in float32 as permutation.py hands them to the solver),
each solver's seconds summed over the layers, the layers where its optimum differs from the first solver's, and those
where its assignment does (ties included: a solver that breaks ties otherwise would change the matching's result).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import time
from pathlib import Path

import numpy as np


def calibration_seconds() -> float:
    a = np.random.default_rng(0).standard_normal((2048, 2048), dtype=np.float32)
    a @ a
    start = time.perf_counter()
    a @ a
    return time.perf_counter() - start


def cost_matrix(n: int, hidden: int, cache: Path) -> np.ndarray:
    path = cache / f"ffn_cross_{n}x{hidden}.npy"
    if path.is_file():
        return np.load(path)
    rng = np.random.default_rng(n)
    scale = hidden ** -0.5
    layers = [{name: (rng.standard_normal(shape, dtype=np.float32) * scale)
               for name, shape in (("up", (n, hidden)), ("gate", (n, hidden)), ("down", (hidden, n)))} for _ in range(2)]
    anchor, source = layers
    cross = anchor["up"] @ source["up"].T
    cross += anchor["gate"] @ source["gate"].T
    cross += anchor["down"].T @ source["down"]
    cache.mkdir(parents=True, exist_ok=True)
    np.save(path, cross)
    return cross


def solvers() -> dict:
    """name -> function(cost (maximise), float64) -> column of each row, for each installed exact solver."""
    found = {}
    try:
        from scipy.optimize import linear_sum_assignment
        found[f"scipy {importlib.metadata.version('scipy')}"] = lambda c: linear_sum_assignment(c, maximize=True)[1]
    except ImportError:
        pass
    try:
        import lap
        dist = next((d for d in ("lapx", "lap") if _installed(d)), "lap")
        found[f"{dist} {importlib.metadata.version(dist)} lapjv"] = lambda c: lap.lapjv(-c, extend_cost=False)[1]
        if hasattr(lap, "lapjvs"):
            found[f"{dist} {importlib.metadata.version(dist)} lapjvs"] = \
                lambda c: np.asarray(lap.lapjvs(-c, jvx_like=True, prefer_float32=False)[2])
    except ImportError:
        pass
    try:
        import fastlap
        version = importlib.metadata.version("fastlap")
        found[f"fastlap {version} linear_sum_assignment"] = lambda c: fastlap.linear_sum_assignment(c, maximize=True)[1]
    except ImportError:
        pass
    try:
        import lapjv
        version = importlib.metadata.version("lapjv")
        found[f"lapjv {version} (float64)"] = lambda c: lapjv.lapjv(-c, force_doubles=True)[0]
        found[f"lapjv {version} (float32, its default)"] = lambda c: lapjv.lapjv((-c).astype(np.float32))[0]
    except ImportError:
        pass
    return found


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="11008,14336")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--cache", type=Path, default=Path("benchmarks/out/lap"))
    parser.add_argument("--planted", nargs="*", help="bench_matching cases: their layers' FFN cost matrices instead")
    args = parser.parse_args()
    found = solvers()
    cal = calibration_seconds()
    print(f"calibration: float32 2048^3 GEMM {cal * 1000:.0f} ms ({2 * 2048**3 / cal / 1e9:.0f} GFLOP/s)\n")
    if args.planted:
        planted(args.planted, found)
        return
    print("| n | solver | seconds | x calibration | optimum | same optimum as first |")
    print("|---|---|---|---|---|---|")
    for n in (int(s) for s in args.sizes.split(",")):
        cost = cost_matrix(n, args.hidden, args.cache).astype(np.float64)
        reference = None
        for name, solve in found.items():
            start = time.perf_counter()
            cols = np.asarray(solve(cost), dtype=np.int64)
            seconds = time.perf_counter() - start
            assert np.array_equal(np.sort(cols), np.arange(n)), f"{name} returned no permutation"
            optimum = float(cost[np.arange(n), cols].sum())
            reference = optimum if reference is None else reference
            same = abs(optimum - reference) <= 1e-9 * abs(reference)
            print(f"| {n} | {name} | {seconds:.1f} | {seconds / cal:.0f}x | {optimum:.6f} | {'yes' if same else 'NO'} |",
                  flush=True)


def planted(cases: list[str], found: dict) -> None:
    """Every solver on every layer's FFN cost matrix of bench_matching's planted pairs; one row per case and solver."""
    from bench_matching import make_pair                       # torch and the library: only for this mode
    from symfusion.matching.permutation import ffn_cross
    print("| case | assignments | solver | seconds, all layers | optimum differs (layers) | assignment differs "
          "(layers) |\n|---|---|---|---|---|---|")
    for case in cases:
        source, anchor, layout = make_pair(case, 0.01)
        costs = [ffn_cross(source, anchor, block.ffn) for block in layout.layers]
        rows = {name: [0.0, 0, 0] for name in found}
        for cost in costs:
            wide, reference = cost.astype(np.float64), None
            for name, solve in found.items():
                start = time.perf_counter()
                cols = np.asarray(solve(cost if name.startswith("scipy") else wide), dtype=np.int64)
                rows[name][0] += time.perf_counter() - start
                optimum = float(wide[np.arange(len(cols)), cols].sum())
                reference = (optimum, cols) if reference is None else reference
                rows[name][1] += abs(optimum - reference[0]) > 1e-9 * abs(reference[0])
                rows[name][2] += not np.array_equal(cols, reference[1])
        shape = f"{len(costs)} x {costs[0].shape[0]}x{costs[0].shape[1]}"
        for name, (seconds, optimum, assignment) in rows.items():
            print(f"| {case} | {shape} | {name} | {seconds:.2f} | {optimum} | {assignment} |", flush=True)


if __name__ == "__main__":
    main()
