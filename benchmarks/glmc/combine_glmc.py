"""Tables over pairs from several bench_glmc.py --output files (say one pair each, run one after another).

    python benchmarks/glmc/combine_glmc.py run-a.json run-b.json run-c.json [--curves unmatched learned ...]

Merges their per-pair results (a pair in two files: refused with one error line) and prints, for each barrier (above
the straight line, then max - min), every curve per pair with the mean and 95% t interval over the pairs and the mean
of the per-pair ratios to unmatched with its 95% t interval, then the paired differences ours - their learned merger
and their learned merger - their data-free weight matching (per pair, mean [95% t]) where those curves exist, and
the learned form's training record per pair. Reads only; writes nothing.
"""
from __future__ import annotations

import argparse
import json
import sys

from symfusion.pipeline.report.spread import over_pairs

CURVES = ["unmatched", "weight_matching", "learned", "full_symmetry", "full_symmetry_learned"]
DIFFERENCES = [("full_symmetry_learned", "learned"), ("full_symmetry", "learned"), ("learned", "weight_matching")]


def interval(spread: dict, digits: int = 3, sign: str = "") -> str:
    low = "" if spread["low"] is None else f" [{spread['low']:{sign}.{digits}f}, {spread['high']:{sign}.{digits}f}]"
    return f"{spread['mean']:{sign}.{digits}f}{low}"


def tables(results: dict, curves: list[str]) -> list[str]:
    """The markdown rows and difference lines of `results` ({pair: {curve: {barrier, barrier_linear, ...}}})."""
    pairs = list(results)
    lines = []
    for kind in ("barrier_linear", "barrier"):
        lines += ["", f"| {kind} | " + " | ".join(pairs) + " | mean [95% t] | % of unmatched [95% t] |",
                  "|---|" + "---|" * (len(pairs) + 2)]
        for name in [c for c in curves if all(c in results[p] for p in pairs)]:
            share = over_pairs({p: 100 * results[p][name][kind] / results[p]["unmatched"][kind] for p in pairs})
            lines.append(f"| {name} | " + " | ".join(f"{results[p][name][kind]:.3f}" for p in pairs) + " | "
                         + interval(over_pairs({p: results[p][name][kind] for p in pairs})) + f" | {interval(share, 1)}% |")
        for a, b in DIFFERENCES:
            if all(a in results[p] and b in results[p] for p in pairs):
                d = {p: results[p][a][kind] - results[p][b][kind] for p in pairs}
                lines.append(f"{a} - {b} ({kind}): " + " / ".join(f"{v:+.3f}" for v in d.values())
                             + f"; mean {interval(over_pairs(d), sign='+')}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="bench_glmc.py --output files")
    parser.add_argument("--curves", nargs="+", default=CURVES)
    args = parser.parse_args()
    results = {}
    for path in args.runs:
        try:
            run = json.load(open(path))["results"]
        except (OSError, ValueError, KeyError):
            print(f"error: {path} is no bench_glmc.py --output file", file=sys.stderr)
            return 2
        if set(run) & set(results):
            print(f"error: {path} repeats pair(s) {', '.join(sorted(set(run) & set(results)))}", file=sys.stderr)
            return 2
        results.update(run)
    print("\n".join(tables(results, args.curves)))
    for pair, curves in results.items():
        if "training" in curves.get("learned", {}):
            t = curves["learned"]["training"]
            print(f"{pair}: their learned merger {t['steps']} steps, validation "
                  + " / ".join(f"{e['eval_loss']:.4f}" for e in t["log"] if "eval_loss" in e)
                  + f", best {t['best_checkpoint']}, permutation rows moved "
                  + f"{sum(v.get('rows_moved', 0) for v in t['moved'].values())}, residual moved "
                  + f"{t['moved']['residual']['change']:.3f}, training {t['train_cpu_seconds']:.0f} CPU s, the form "
                  + f"{curves['learned']['cpu_seconds']:.0f} CPU s, midpoint loss {curves['learned']['loss'][5]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
