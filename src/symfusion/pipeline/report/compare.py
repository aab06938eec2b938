"""symfusion-compare: check a run's tables and figure data against a reference run, cell by cell.

    symfusion-compare RUN_DIR [--reference REF_DIR] [--figures FIG_DIR] [--tolerance X] [--exact | --within-intervals]

RUN_DIR is results/<profile> of a new run; the files compared are the CSVs of the experiment registry's entries
with `compare: true` (conf/experiments.yaml). The reference defaults to the committed reference run,
reference/<profile>/ (tables) and reference/<profile>/figures/ (figure data), or, for a run made with
portable=vendors (its provenance.json records MKL_CBWR=COMPATIBLE), reference/<profile>_vendors/. It is kept apart from
results/ so that a fresh clone's pipeline really runs instead of finding its outputs present. The run's
figure data are found from the run's own report (the figures its report.md shows), wherever the command
is run from, unless --figures says otherwise. Numbers must agree within the tolerance (absolute, in the
table's units: accuracy/F1 points x100, losses); timing columns (Table 3, seconds) are only reported,
never compared. A cell that is a mean over several model pairs may also move by half the reference's 95% t
interval over pairs (its spread columns, report/spread.py; a perplexity by what its loss's interval allows), and a
cell the reference's tolerances.yaml names (cells known to depend on the CPU: why and how they were measured are
in the file) by the tolerance recorded there; --exact allows nothing. A verdict (helps / hurts / no detectable
change) is a function of an interval: it may change to or from "no detectable change" (never between helps and
hurts) where an interval it rests on, in the reference's row, has an endpoint that the cell's measured allowances
(half its interval over pairs, a recorded tolerance; not the blanket --tolerance) let cross 0 (`borderline`);
elsewhere, and always with --exact, a verdict that differs is a difference. An artefact that one side has and the other lacks (but an on-demand one, conf/experiments.yaml `on_demand`,
which is compared only when both runs built it), an unreadable or malformed file, a
row or a column that one side lacks: each is a difference. Exit code 0 when everything agrees, 1 with a
readable diff otherwise, 2 (one line) for a usage error.
"""
from __future__ import annotations

import argparse
import csv
import fnmatch
import io
import json
import math
import re
import sys
from pathlib import Path
from typing import Callable

import yaml

from symfusion.errors import SymfusionError
from symfusion.io.regular import read_regular, read_regular_text
from symfusion.pipeline.report.registry import experiments
from symfusion.pipeline.uncertainty import NO_CHANGE, VERDICTS


def compared_files() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(tables, figure data): the CSV of every registry entry with `compare: true`, relative to the results dir
    (tables) or the figures dir (figures), in the registry's order."""
    entries = [e for e in experiments().values() if e.compare]
    return (tuple(f"{e.name}.csv" for e in entries if e.kind == "table"),
            tuple(f"{e.name}.csv" for e in entries if e.kind == "figure"))


def on_demand_files() -> frozenset[str]:
    """The CSVs of entries built only when asked for by name: a run without one is no difference."""
    return frozenset(f"{e.name}.csv" for e in experiments().values() if e.on_demand)


TIMING_COLUMNS = ("seconds",)            # never compared (nor Table 3): seconds depend on the machine and its load
DEFAULT_TOLERANCE = 0.5   # points of accuracy / F1 (x100) and loss units: same-machine reruns agree exactly


class Malformed(Exception):
    """A file that is not a readable CSV table."""


def read_rows(text: str) -> list[dict]:
    """The rows of a CSV table; Malformed when it has no header or a row of another width."""
    reader = csv.reader(io.StringIO(text))
    try:
        table = [row for row in reader if row]
    except csv.Error as error:
        raise Malformed(str(error)) from error
    if not table:
        raise Malformed("empty file")
    header = table[0]
    if len(set(header)) != len(header) or any(not name for name in header):
        raise Malformed("its header has empty or repeated column names")
    for number, row in enumerate(table[1:], start=2):
        if len(row) != len(header):
            raise Malformed(f"line {number} has {len(row)} fields, the header {len(header)}")
    return [dict(zip(header, row)) for row in table[1:]]


def load_table(path: Path) -> list[dict]:
    try:
        text = read_regular(path).decode("utf-8")        # a FIFO, a device or a huge file: refused (io/regular.py)
    except SymfusionError as error:
        raise Malformed(str(error)) from error
    except UnicodeDecodeError as error:
        raise Malformed("not UTF-8 text") from error
    if "\x00" in text:
        raise Malformed("binary content")
    return read_rows(text)


def as_number(value: str):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


INTERVAL_COLUMNS = (("effect_low", "effect_high"), ("low", "high"), ("change_low", "change_high"))


def row_tolerance(reference: dict, tolerance: float, within_intervals: bool) -> float:
    """The tolerance for one row: with within_intervals, at least half the widest 95% interval the reference
    row reports (an effect, a bar's error bar, a barrier change), so a rerun that moved by less than its
    own uncertainty agrees."""
    if not within_intervals:
        return tolerance
    widths = [as_number(reference.get(high)) - as_number(reference.get(low)) for low, high in INTERVAL_COLUMNS
              if as_number(reference.get(low)) is not None and as_number(reference.get(high)) is not None]
    return max([tolerance] + [w / 2 for w in widths if math.isfinite(w)])


def own_interval_tolerance(reference: dict, column: str) -> float:
    """Half the width of the cell's own 95% interval where the reference names one for it (a column X with X_low and
    X_high, as Table 2's effect_<matching>; or those endpoints themselves), else 0; intervals over pairs are
    spread_tolerance's. With within_intervals a cell may move by it, as a row by its generic interval (row_tolerance):
    the same effect then has the same allowance in a wide table (Table 2) and a long one (Figure 3)."""
    base = column[:-len("_low")] if column.endswith("_low") else column[:-len("_high")] if column.endswith("_high") \
        else column
    if base.endswith("_pairs"):
        return 0.0
    low, high = as_number(reference.get(f"{base}_low")), as_number(reference.get(f"{base}_high"))
    if low is None or high is None or not math.isfinite(high - low):
        return 0.0
    return (high - low) / 2


SPREAD_SUFFIXES = ("_pairs_low", "_pairs_high", "_sd", "_se")   # a cell's spread over pairs (report/spread.py)
TOLERANCES_FILE = "tolerances.yaml"     # in a reference folder: recorded tolerances of cells that depend on the CPU


def spread_tolerance(reference: dict, column: str) -> float:
    """Half the reference's 95% t interval over model pairs of the cell `column` is, or is the spread of (a rerun that
    trains other end models, e.g. on another CPU, may move a mean over pairs by that much); a perplexity's from its
    loss's interval (exp); 0 for a cell without one (one pair)."""
    base = next((column[:-len(s)] for s in SPREAD_SUFFIXES if column.endswith(s)), column)
    loss_scale = None
    if base == "perplexity":
        base, loss_scale = "loss", as_number(reference.get("perplexity"))
    low, high = as_number(reference.get(f"{base}_pairs_low")), as_number(reference.get(f"{base}_pairs_high"))
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return 0.0
    half = (high - low) / 2
    return half if loss_scale is None else abs(loss_scale) * math.expm1(half)


def recorded_tolerances(reference: Path) -> dict[str, list[tuple[str, float]]]:
    """file -> [(column pattern, tolerance)] from the reference's tolerances.yaml (none when it has no such file)."""
    path = reference / TOLERANCES_FILE
    if not path.exists() and not path.is_symlink():       # a FIFO or a device there is refused by read_regular
        return {}
    try:
        data = yaml.safe_load(read_regular_text(path)) or {}
        found = {name: [(str(pattern), float(value)) for pattern, value in columns.items()]
                 for name, columns in (data.get("tolerances") or {}).items()}
    except (SymfusionError, yaml.YAMLError, AttributeError, TypeError, ValueError) as error:
        raise SymfusionError(f"{path} is not a readable tolerances file ({str(error).splitlines()[0]}); "
                             "it maps file -> column pattern -> tolerance under `tolerances:`") from error
    if any(not math.isfinite(v) or v < 0 for columns in found.values() for _, v in columns):
        raise SymfusionError(f"{path}: every tolerance must be a finite number >= 0")
    return found


def recorded_tolerance(recorded: list[tuple[str, float]], column: str) -> float:
    return max([v for pattern, v in recorded if fnmatch.fnmatchcase(column, pattern)], default=0.0)


def verdict_bases(column: str) -> tuple[str, ...]:
    """The effects a verdict column rests on (report/effects.py, barriers.py): `ours_<effect>` on <effect>, Figure 3's
    `verdict` on `effect`, a barrier's `change_verdict` on the change over pairs and each pair's; a paper's verdict
    (copied from the paper) on none."""
    if column == "verdict":
        return ("effect",)
    if column == "change_verdict":
        return ("change", "pair_change", "barrier_change")
    return (column[len("ours_"):],) if column.startswith("ours_") else ()


def borderline(reference: dict, column: str, allowed: Callable[[str], float]) -> bool:
    """Whether the verdict in `column` rests on an interval of the reference row (<effect>_low/_high, or over pairs
    <effect>_pairs_low/_high) with an endpoint within its allowed movement (`allowed`: column -> tolerance, > 0) of
    0: then numbers that agree within the allowances can fall on either side of 0, hence give either verdict next
    to it. Over 3 pairs: an interval whose nearer endpoint lies within half its width of 0."""
    for base in verdict_bases(column):
        for end in (f"{base}_low", f"{base}_high", f"{base}_pairs_low", f"{base}_pairs_high"):
            value, tolerance = as_number(reference.get(end)), allowed(end)
            if value is not None and math.isfinite(value) and tolerance > 0 and abs(value) <= tolerance:
                return True
    return False


def verdict_may_differ(reference: dict, column: str, ours: str, theirs: str, allowed: Callable[[str], float]) -> bool:
    """A verdict that differs from the reference's and is allowed to: one of the two is "no detectable change", the
    other a verdict, and the row is borderline for that column."""
    return ({ours, theirs} <= set(VERDICTS) and NO_CHANGE in (ours, theirs) and ours != theirs
            and borderline(reference, column, allowed))


def row_label(row: dict) -> str:
    """A row's name in a message: its first cell, and the second when that is a name too (fig3: `ot_acts /
    rotation`), never a number (table2: `ot_acts`, not `ot_acts / 47.68`)."""
    cells = list(row.values())[:2]
    return " / ".join(str(v) for i, v in enumerate(cells) if i == 0 or as_number(v) is None)


def compare_rows(name: str, ours: list[dict], theirs: list[dict], tolerance: float,
                 within_intervals: bool = False, recorded: list[tuple[str, float]] | None = None) -> list[str]:
    """Readable differences between two tables with the same layout; with a tolerance above 0, a cell's own
    (spread over pairs, recorded) may widen it."""
    problems = []
    if ours and theirs:
        extra, lacking = sorted(set(ours[0]) - set(theirs[0])), sorted(set(theirs[0]) - set(ours[0]))
        if extra:
            problems.append(f"{name}: column(s) {extra} are not in the reference")
        if lacking:
            problems.append(f"{name}: column(s) {lacking} of the reference are missing")
    if len(ours) != len(theirs):
        return problems + [f"{name}: {len(ours)} rows, reference has {len(theirs)}"]
    for index, (row, ref) in enumerate(zip(ours, theirs)):
        label = row_label(row)
        row_allowed = row_tolerance(ref, tolerance, within_intervals)

        def measured(column: str) -> float:           # what the reference measured of a cell's variation
            if tolerance == 0 and not within_intervals:
                return 0.0                                # --exact
            return max(spread_tolerance(ref, column), recorded_tolerance(recorded or [], column))

        for column in ref:
            if column in TIMING_COLUMNS or column not in row:
                continue
            allowed = max(row_allowed, measured(column), own_interval_tolerance(ref, column) if within_intervals else 0.0)
            a, b = row.get(column), ref[column]
            x, y = as_number(a), as_number(b)
            if x is not None and y is not None:
                if (math.isnan(x) != math.isnan(y)) or (not math.isnan(x) and abs(x - y) > allowed):
                    problems.append(f"{name} row {index} ({label}) {column}: {x:.4g} vs reference {y:.4g} "
                                    f"(|diff| {abs(x - y):.3g} > {allowed:.3g})")
            elif a != b and not verdict_may_differ(ref, column, a, b, measured):
                problems.append(f"{name} row {index} ({label}) {column}: {a!r} vs reference {b!r}")
    return problems


def compare_file(name: str, path: Path, reference: Path, tolerance: float,
                 within_intervals: bool = False, recorded: list[tuple[str, float]] | None = None) -> tuple[list[str], bool]:
    """(problems, compared) for one artefact that at least one side has."""
    if not path.exists() and not path.is_symlink():     # a FIFO or a device is malformed (load_table), not missing
        return [f"{name}: missing from the run ({path}); the reference has it"], False
    if not reference.exists() and not reference.is_symlink():
        return [f"{name}: the run has it but the reference ({reference}) does not"], False
    try:
        ours = load_table(path)
    except Malformed as error:
        return [f"{name}: {path} is malformed ({error})"], False
    try:
        theirs = load_table(reference)
    except Malformed as error:
        return [f"{name}: reference {reference} is malformed ({error})"], False
    return compare_rows(name, ours, theirs, tolerance, within_intervals, recorded), True


def compare_run(run_dir: Path, figures_dir: Path, reference: Path, reference_figures: Path,
                tolerance: float, within_intervals: bool = False, only: list[str] | None = None) -> tuple[list[str], int]:
    """(problems, number of files compared); `only` limits the comparison to these artefacts (file names)."""
    problems, compared = [], 0
    tables, figure_data = compared_files()
    pairs = [(t, run_dir / t, reference / t) for t in tables]
    pairs += [(f, figures_dir / f, reference_figures / f) for f in figure_data]
    if only:
        pairs = [p for p in pairs if p[0] in only]
    on_demand = on_demand_files()
    recorded = recorded_tolerances(reference)
    for name, path, ref in pairs:
        if (not path.exists() and not ref.exists()) or (name in on_demand and not (path.exists() and ref.exists())):
            continue                         # an artefact neither run has (e.g. a profile without it), or one built
                                             # on demand that either run did not build (checked when both have it)
        found, ok = compare_file(name, path, ref, tolerance, within_intervals, recorded.get(name))
        problems += found
        compared += ok
    if compared == 0 and not problems:
        problems.append(f"nothing to compare: no tables in {run_dir} or figure data in {figures_dir}")
    return problems, compared


def figures_of(run_dir: Path) -> Path | None:
    """The figures folder a run's report.md shows (its image links are relative to the run folder)."""
    report = run_dir / "report.md"
    if not report.is_file():
        return None
    try:
        text = read_regular_text(report)
    except (SymfusionError, UnicodeDecodeError):
        return None
    links = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", text)
    return (run_dir / links[0]).parent if links else None


def mkl_path(run_dir: Path) -> str | None:
    """MKL's code path the run's report job computed with (its provenance.json: `machine.mkl_cbwr`, COMPATIBLE
    in a run with portable=vendors); None where it is not recorded or not readable (a FIFO or device is not read)."""
    path = run_dir / "provenance.json"
    if not path.is_file():
        return None
    try:
        record = json.loads(read_regular(path))
    except (SymfusionError, ValueError):             # UnicodeDecodeError and JSON errors are ValueErrors
        return None
    machine = record.get("machine") if isinstance(record, dict) else None
    return machine.get("mkl_cbwr") if isinstance(machine, dict) else None


def default_reference(run_dir: Path, root: Path = Path("reference")) -> tuple[Path, str | None]:
    """(reference/<profile>, None), or, for a run made with portable=vendors where there is one,
    (reference/<profile>_vendors, why: docs/reproduce.md#determinism, that run's numbers are another vendor-neutral
    set)."""
    profile = run_dir.resolve().name
    vendors = root / f"{profile}_vendors"
    if mkl_path(run_dir) == "COMPATIBLE" and vendors.is_dir():
        return vendors, "this run computed with MKL_CBWR=COMPATIBLE: portable=vendors"
    return root / profile, None


def usage_error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


class OneLineParser(argparse.ArgumentParser):
    """argparse with its usage errors as one `error:` line (exit 2), as every symfusion command's; --help shows
    the usage."""

    def error(self, message: str):
        self.exit(2, f"error: {message}; see symfusion-compare --help\n")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="symfusion-compare", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="results/<profile> of the run to check")
    parser.add_argument("--figures", type=Path, help="its figures dir (default: the one its report.md shows)")
    parser.add_argument("--reference", type=Path, help="reference results dir (default: reference/<profile>; "
                        "reference/<profile>_vendors for a run made with portable=vendors)")
    parser.add_argument("--reference-figures", type=Path, help="reference figures dir (default: <reference>/figures)")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="absolute tolerance per number")
    parser.add_argument("--exact", action="store_true", help="tolerance 0: for determinism checks")
    parser.add_argument("--only", help="compare only these artefacts, comma-separated (e.g. table2.csv,fig3_ablation.csv):"
                        " a run of one slice of a DAG against the whole")
    parser.add_argument("--within-intervals", action="store_true",
                        help="a row's numbers may move by half the reference row's 95%% interval (at least --tolerance)")
    args = parser.parse_args(argv)
    if not args.run_dir.is_dir():
        return usage_error(f"{args.run_dir} is not a directory; pass results/<profile> of a finished run")
    if not math.isfinite(args.tolerance) or args.tolerance < 0:
        return usage_error(f"--tolerance {args.tolerance}: give a finite number >= 0")
    figures = args.figures or figures_of(args.run_dir)
    if figures is None:
        return usage_error(f"cannot tell where the figures of {args.run_dir} are (no report.md showing them); "
                           "pass --figures DIR")
    reference, why = (args.reference, None) if args.reference else default_reference(args.run_dir)
    if why:
        print(f"reference: {reference} ({why})")
    reference_figures = args.reference_figures or reference / "figures"
    if not reference.is_dir():
        return usage_error(f"reference {reference} is not a directory; pass --reference DIR")
    tolerance = 0.0 if args.exact else args.tolerance
    if args.exact and args.within_intervals:
        return usage_error("give --exact or --within-intervals, not both")
    only = [name.strip() for name in args.only.split(",")] if args.only else None
    try:
        known = sum(compared_files(), ())
    except SymfusionError as error:
        return usage_error(str(error))
    unknown = sorted(set(only or []) - set(known))
    if unknown:
        return usage_error(f"--only {unknown[0]}: not an artefact; choose from {', '.join(known)}")
    try:
        problems, compared = compare_run(args.run_dir, figures, reference, reference_figures, tolerance,
                                         args.within_intervals, only)
    except SymfusionError as error:
        return usage_error(str(error))
    if problems:
        print(f"{len(problems)} difference(s) from the reference (tolerance {tolerance}):")
        print("\n".join(f"  - {p}" for p in problems))
        return 1
    print(f"{compared} file(s) agree with the reference (tolerance {tolerance})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
