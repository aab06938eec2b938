"""Record in a reference folder how far a second run of the same code moved each cell: its tolerances.yaml for symfusion-compare.

    python scripts/record_tolerances.py OTHER_RESULTS OTHER_FIGURES REFERENCE --why TEXT

OTHER_* is a finished run of the same code and profile that computes differently on purpose (the maintainers'
use: `--config portable=false`, the machine's own AVX-512 kernels instead of the portable AVX2 ones, on an AVX-512
CPU); REFERENCE the reference folder (its figure data in REFERENCE/figures). For every file symfusion-compare checks
and every column, the largest difference over the rows that the compare's own allowances (the default tolerance, a
mean's spread over pairs) do not cover is written as that column's tolerance, rounded up to two significant
digits, under `tolerances:` in REFERENCE/tolerances.yaml, with `why` and what was measured. A verdict that differs
is covered only by the compare's rule for verdicts (compare.py: it may change to or from "no detectable change"
where the reference row's interval has an endpoint that the cell's spread over pairs or its tolerance recorded here
lets cross 0); any other word that differs cannot be tolerated: it is listed under `differing_words` and the
script exits 1, so that a maintainer explains it. Nothing is written when the runs agree within the allowances
already.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import yaml

from symfusion.pipeline.report.compare import (DEFAULT_TOLERANCE, TIMING_COLUMNS, TOLERANCES_FILE, Malformed,
                                               as_number, compared_files, load_table, spread_tolerance,
                                               verdict_may_differ)


HEADER = "# symfusion-compare reads this file (src/symfusion/pipeline/report/compare.py); written by scripts/record_tolerances.py"


def round_up(value: float) -> float:
    """`value` rounded up to two significant digits (a tolerance never below what was measured)."""
    if value <= 0:
        return 0.0
    digits = 1 - math.floor(math.log10(value))           # decimals of the second significant digit
    return round(math.ceil(value * 10 ** digits) / 10 ** digits, max(digits, 0))


def moved_columns(ours: list[dict], theirs: list[dict]) -> tuple[dict[str, float], list[str]]:
    """(column -> the largest difference the compare's allowances do not cover, columns whose words differ beyond
    what the compare's rule for verdicts allows once those tolerances are recorded)."""
    moved, differing = {}, []           # differing: (reference row, column, ours, theirs) of words that differ
    for row, ref in zip(ours, theirs):
        for column in ref:
            if column in TIMING_COLUMNS or column not in row:
                continue
            x, y = as_number(row[column]), as_number(ref[column])
            if x is None or y is None:
                if row[column] != ref[column]:
                    differing.append((ref, column, row[column], ref[column]))
            elif not (math.isnan(x) or math.isnan(y)) and abs(x - y) > max(DEFAULT_TOLERANCE,
                                                                          spread_tolerance(ref, column)):
                moved[column] = max(moved.get(column, 0.0), abs(x - y))
    words = []                          # judged once every tolerance is known
    for ref, column, a, b in differing:
        measured = lambda c, ref=ref: max(spread_tolerance(ref, c), round_up(moved.get(c, 0.0)))  # noqa: E731
        if column not in words and not verdict_may_differ(ref, column, a, b, measured):
            words.append(column)
    return moved, words


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="results/<profile> of the other run")
    parser.add_argument("figures", type=Path, help="figures/<profile> of the other run")
    parser.add_argument("reference", type=Path, help="the reference folder (figure data in its figures/)")
    parser.add_argument("--why", required=True, help="what computes differently in the other run, and why")
    args = parser.parse_args(argv)
    tables, figure_data = compared_files()
    files = [(n, args.results / n, args.reference / n) for n in tables]
    files += [(n, args.figures / n, args.reference / "figures" / n) for n in figure_data]
    tolerances, differing = {}, {}
    for name, path, reference in files:
        if not (path.is_file() and reference.is_file()):
            continue
        try:
            ours, theirs = load_table(path), load_table(reference)
        except Malformed as error:
            print(f"error: {name}: {error}", file=sys.stderr)
            return 2
        if len(ours) != len(theirs):
            print(f"error: {name}: {len(ours)} rows, the reference has {len(theirs)}; not a run of the same code",
                  file=sys.stderr)
            return 2
        moved, words = moved_columns(ours, theirs)
        if moved:
            tolerances[name] = {column: round_up(value) for column, value in sorted(moved.items())}
        if words:
            differing[name] = words
    if not tolerances and not differing:
        print("the runs agree within the compare's allowances: nothing to record")
        return 0
    record = {"why": args.why,
              "measured": {"run": str(args.results), "reference": str(args.reference),
                           "machine": platform.processor() or platform.machine(),
                           "when": datetime.now(timezone.utc).isoformat(timespec="seconds")},
              "tolerances": tolerances}
    if differing:
        record["differing_words"] = differing
    target = args.reference / TOLERANCES_FILE
    if target.exists() and (not target.is_file() or target.is_symlink()
                            or not target.read_text(errors="replace").startswith(HEADER)):
        print(f"error: {target} exists and is not a file this script wrote; move it away first", file=sys.stderr)
        return 2
    temporary = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    temporary.write_text(HEADER + "\n" + yaml.safe_dump(record, sort_keys=False, width=110))
    os.replace(temporary, target)
    print(f"{sum(len(t) for t in tolerances.values())} column tolerance(s) in {len(tolerances)} file(s) -> {target}")
    if differing:
        print("words that differ (a tolerance cannot cover them): "
              + "; ".join(f"{n}: {', '.join(c)}" for n, c in differing.items()))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
