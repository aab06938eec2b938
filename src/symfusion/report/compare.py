"""symfusion-compare: check a run's tables and figure data against a reference run, cell by cell.

    symfusion-compare RUN_DIR [--reference REF_DIR] [--figures FIG_DIR] [--tolerance X] [--exact]

RUN_DIR is results/<profile> of a new run. The reference defaults to the committed reference run,
reference/<profile>/ (tables) and reference/<profile>/figures/ (figure data). It is kept apart from
results/ so that a fresh clone's pipeline really runs instead of finding its outputs present. Numbers must agree within the tolerance (absolute, in the
table's units: accuracy/F1 points x100, losses); timing columns (Table 3, seconds) are only
reported, never compared. Exit code 0 when everything agrees, 1 with a readable diff otherwise.
"""
from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

# Artefacts compared, relative to the results dir (tables) or the figures dir (figure data).
TABLES = ("table1.csv", "table2.csv", "multimodel.csv")
FIGURE_DATA = ("fig3_ablation.csv", "fig4_distance.csv", "fig5_barrier.csv", "fig6_layers.csv")
TIMING_COLUMNS = ("seconds",)            # never compared (nor Table 3): seconds depend on the machine and its load
DEFAULT_TOLERANCE = 0.5   # points of accuracy / F1 (x100) and loss units: same-machine reruns agree exactly


def read_rows(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def reference_text(path: Path, reference: Path) -> str | None:
    """The reference copy of `path`: the file of the same name under `reference`."""
    candidate = reference / path.name
    return candidate.read_text() if candidate.is_file() else None


def as_number(value: str):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def compare_rows(name: str, ours: list[dict], theirs: list[dict], tolerance: float) -> list[str]:
    """Readable differences between two tables with the same layout."""
    if len(ours) != len(theirs):
        return [f"{name}: {len(ours)} rows, reference has {len(theirs)}"]
    problems = []
    for index, (row, ref) in enumerate(zip(ours, theirs)):
        label = " / ".join(str(v) for v in list(row.values())[:2])
        for column in ref:
            if column in TIMING_COLUMNS:
                continue
            a, b = row.get(column), ref[column]
            x, y = as_number(a), as_number(b)
            if x is not None and y is not None:
                if abs(x - y) > tolerance or (x != x) != (y != y):
                    problems.append(f"{name} row {index} ({label}) {column}: {x:.4g} vs reference {y:.4g} "
                                    f"(|diff| {abs(x - y):.3g} > {tolerance})")
            elif a != b:
                problems.append(f"{name} row {index} ({label}) {column}: {a!r} vs reference {b!r}")
    return problems


def compare_run(run_dir: Path, figures_dir: Path, reference: Path, reference_figures: Path,
                tolerance: float) -> tuple[list[str], int]:
    """(problems, number of files compared)."""
    problems, compared = [], 0
    targets = [(run_dir / t, reference) for t in TABLES] + [(figures_dir / f, reference_figures) for f in FIGURE_DATA]
    for path, ref_dir in targets:
        if not path.is_file():
            continue
        ref = reference_text(path, ref_dir)
        if ref is None:
            problems.append(f"{path}: no reference copy to compare with")
            continue
        problems += compare_rows(path.name, read_rows(path.read_text()), read_rows(ref), tolerance)
        compared += 1
    if compared == 0:
        problems.append(f"nothing to compare: no tables in {run_dir} or figure data in {figures_dir}")
    return problems, compared


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="symfusion-compare", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="results/<profile> of the run to check")
    parser.add_argument("--figures", type=Path, help="its figures dir (default: figures/<profile>)")
    parser.add_argument("--reference", type=Path, help="reference results dir (default: reference/<profile>)")
    parser.add_argument("--reference-figures", type=Path, help="reference figures dir (default: <reference>/figures)")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="absolute tolerance per number")
    parser.add_argument("--exact", action="store_true", help="tolerance 0: for determinism checks")
    args = parser.parse_args(argv)
    if not args.run_dir.is_dir():
        print(f"error: {args.run_dir} is not a directory; pass results/<profile> of a finished run", file=sys.stderr)
        return 2
    figures = args.figures or Path("figures") / args.run_dir.name
    reference = args.reference or Path("reference") / args.run_dir.name
    reference_figures = args.reference_figures or reference / "figures"
    tolerance = 0.0 if args.exact else args.tolerance
    problems, compared = compare_run(args.run_dir, figures, reference, reference_figures, tolerance)
    if problems:
        print(f"{len(problems)} difference(s) from the reference (tolerance {tolerance}):")
        print("\n".join(f"  - {p}" for p in problems))
        return 1
    print(f"{compared} file(s) agree with the reference (tolerance {tolerance})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
