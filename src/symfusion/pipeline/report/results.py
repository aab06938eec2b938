"""Reading stage results (checked against the shape each artefact reads) and writing artefacts (CSV, signed Markdown, PNG/PDF).

Shared by every writer of report/. A writer reads its inputs through `read_json` after `check_inputs` has
checked every one of them against the writer's SHAPES (JSON Schema per kind of input), and returns what it
writes as data (`Built`); symfusion-report (artefacts.py) swaps all of an artefact's files in only after
the whole artefact is computed, so a failure leaves nothing written and no earlier output replaced.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import re
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import matplotlib

from symfusion.pipeline.config import CONF_DIR
from symfusion.errors import SymfusionError, steps
from symfusion.fusion import FUSION_METHODS
from symfusion.io.outputs import safe_output, writing_together
from symfusion.io.regular import read_regular, read_regular_text

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the writers' plotting module, without a display)

PAPER_DIR = CONF_DIR / "paper"
FOLDER_REPORTS = ("match.json", "merge.json", "train.json")   # the stage report a result folder holds
RESULT_FILE = "file"                                          # a result given as a JSON file, not a folder

__all__ = ["plt"]


# ---------------------------------------------------------------- reading results


def result_file(path: str | Path) -> tuple[str, Path]:
    """(kind, JSON file) of a result: a folder's own stage report (match.json, merge.json or train.json), or
    the file itself (kind RESULT_FILE)."""
    path = Path(path)
    if path.is_dir():
        found = [name for name in FOLDER_REPORTS if (path / name).is_file()]
        if not found:
            raise SymfusionError(f"{path} holds no {', '.join(FOLDER_REPORTS)}; rerun the stage that writes it")
        return found[0], path / found[0]
    return RESULT_FILE, path


def read_json(path: str | Path) -> dict:
    """The JSON object of a result (a folder: its stage report), or a one-line error."""
    _, path = result_file(path)
    if not path.exists():
        raise SymfusionError(f"result file {path} does not exist; run the pipeline stage that writes it")
    try:
        data = json.loads(read_regular_text(path))           # a regular file of bounded size (io/regular.py)
    except (UnicodeDecodeError, ValueError) as error:
        raise SymfusionError(f"{path} is not a JSON result of a symfusion stage; pass the stage's own output") from error
    if not isinstance(data, dict):
        raise SymfusionError(f"{path} is not a JSON result of a symfusion stage; pass the stage's own output")
    return data


def check_inputs(paths: list[str], shapes: dict[str, dict], artefact: str) -> None:
    """Every input against the JSON Schema its kind has in a writer's SHAPES (kind: a folder's report name, or
    RESULT_FILE): the first one that does not fit is one error line naming the file, the place and the problem."""
    for path in steps(paths, "checking inputs", "file"):
        kind, file = result_file(path)
        schema = shapes.get(kind)
        if schema is None:
            wanted = " or ".join("a JSON result" if k == RESULT_FILE else f"a folder with {k}" for k in shapes)
            raise SymfusionError(f"{artefact} reads {wanted}, not {path}; pass the results its registry entry names")
        data = read_json(path)
        problem = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(data))
        if problem is not None:
            where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in problem.absolute_path).lstrip(".")
            raise SymfusionError(f"{file} is not a result {artefact} can read ({problem.message}"
                                 f"{' at ' + where if where else ''}); pass the stage's own output")
        if "method" in data and data["method"] not in RESULT_METHODS:
            raise SymfusionError(f"{file}: method {str(data['method'])[:60]!r} is no fusion method of symfusion (one "
                                 f"of {', '.join(RESULT_METHODS)}); pass the stage's own output")


# the methods a stage's result may name: a fusion method, or an end model's evaluation
RESULT_METHODS = (*FUSION_METHODS, "end_model")
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")   # a spreadsheet reads a cell beginning so as a formula


# Building blocks of SHAPES: JSON Schema of what a writer reads (only that: other keys may be there).
NUMBER, STRING, INTEGER = {"type": "number"}, {"type": "string"}, {"type": "integer"}
OPTIONAL_NUMBER = {"type": ["number", "null"]}


def array(items: dict, least: int = 0) -> dict:
    return {"type": "array", "items": items, "minItems": least}


def record(required: dict, **optional) -> dict:
    """An object with these keys (each of its schema) and maybe the optional ones."""
    return {"type": "object", "required": list(required), "properties": {**required, **optional}}


PER_EXAMPLE = {"type": "object", "minProperties": 1, "additionalProperties": array({"type": ["number", "null"]}, 1)}


def read_paper_table(name: str) -> list[dict]:
    """Rows of conf/paper/<name>.csv (comment lines start with '#')."""
    path = PAPER_DIR / f"{name}.csv"
    with open(path) as handle:
        return list(csv.DictReader(line for line in handle if not line.startswith("#")))


def percent(fraction: float | None) -> float | None:
    """A score or accuracy in [0, 1] as points (x100), the unit of every table and figure CSV (and of
    symfusion-compare's tolerance); None stays None."""
    return None if fraction is None else 100 * fraction


def model_name(path: str) -> str:
    """The language model's name: the folder after lang/ in results/<profile>/lang/<model>/..."""
    parts = Path(path).parts
    if "lang" not in parts[:-1]:
        raise SymfusionError(f"{path} does not lie under a lang/<model>/ folder of a run; pass the pipeline's results")
    return parts[parts.index("lang") + 1]


def read_csv_rows(path: Path) -> list[dict]:
    """The rows of a CSV of a results folder (a regular file of bounded size: io/regular.py)."""
    return list(csv.DictReader(io.StringIO(read_regular_text(path), newline="")))


# ---------------------------------------------------------------- what an artefact writes


@dataclass
class Built:
    """An artefact, computed: its rows, and each file's content by suffix (".csv" beside the output) or by the
    name of a sibling file ("provenance.json")."""

    rows: list
    files: dict[str, str | bytes] = field(default_factory=dict)


def csv_text(rows: list[dict]) -> str:
    """Rows as CSV; the columns are every key in order of first appearance (a row lacking one leaves it empty). A
    text cell a spreadsheet would read as a formula (FORMULA_STARTS; a number's minus sign aside) is refused in one
    line, so no text of an input (a folder's name, a method) reaches a cell as a formula."""
    fieldnames = list(dict.fromkeys(key for row in rows for key in row))
    for row in rows:
        for key, value in row.items():
            if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not _is_number(value):
                raise SymfusionError(f"the table's {key} cell would be {value[:40]!r}, which a spreadsheet reads as "
                                     "a formula; rename the input it comes from")
            if str(key).startswith(FORMULA_STARTS):
                raise SymfusionError(f"a column of the table would be named {str(key)[:40]!r}, which a spreadsheet "
                                     "reads as a formula; rename the input it comes from")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fieldnames, restval="")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def markdown_table(rows: list[dict], columns: list[str] | None = None) -> str:
    columns = columns or list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if 0 < abs(value) < 1 else f"{value:.2f}"
    return str(value)


def inputs_list(paths: list[str]) -> str:
    return "Inputs:\n" + "".join(f"- {p}\n" for p in paths)


def method_label(name: str) -> str:
    """A fusion method's display name in tables and figures, from its declaration (src/symfusion/fusion/)."""
    if name not in FUSION_METHODS:
        raise SymfusionError(f"unknown fusion method {name!r}; choose one of {', '.join(FUSION_METHODS)}")
    return FUSION_METHODS[name].label


def figure_files(fig, png_key: str = ".png") -> dict[str, bytes]:
    """A figure as PNG and PDF bytes, each signed in its metadata (a previous output is recognised by it)."""
    files = {}
    for suffix, key in ((png_key, "Software"), (".pdf", "Creator")):
        buffer = io.BytesIO()
        fig.savefig(buffer, dpi=150, bbox_inches="tight", format=suffix[1:], metadata={key: REPORT_SIGNATURE})
        files[suffix] = buffer.getvalue()
    plt.close(fig)
    return files


# ---------------------------------------------------------------- signatures: recognising a previous output

REPORT_SIGNATURE = "symfusion-report"   # in the PNG / PDF metadata of every figure
_MD_SIGNED = re.compile(r"\n<!-- symfusion-report sha256:([0-9a-f]{64}) -->\n\Z")


def signed_markdown(text: str) -> str:
    """Markdown with symfusion-report's signature as its last line: an HTML comment (invisible when rendered)
    holding the sha256 of everything before it, which no user file carries by accident, nor an edited one."""
    text = text if text.endswith("\n") else text + "\n"
    return f"{text}\n<!-- {REPORT_SIGNATURE} sha256:{hashlib.sha256(text.encode()).hexdigest()} -->\n"


def unsigned_markdown(text: str) -> str:
    """A signed Markdown output without its signature line."""
    found = _MD_SIGNED.search(text)
    return text[:found.start()] if found else text


def is_signed_markdown(text: str) -> bool:
    found = _MD_SIGNED.search(text)
    return found is not None and hashlib.sha256(text[:found.start()].encode()).hexdigest() == found.group(1)


def is_report_output(path: Path) -> bool:
    """Whether an existing file is an artefact symfusion-report wrote (a previous output may be replaced)."""
    try:
        data = read_regular(path)                   # a FIFO, a device or a huge file is no report output
    except SymfusionError:
        return False
    suffix = path.suffix
    if suffix == ".png":
        return data.startswith(b"\x89PNG") and REPORT_SIGNATURE.encode() in data
    if suffix == ".pdf":
        return data.startswith(b"%PDF") and REPORT_SIGNATURE.encode() in data
    if suffix == ".md":
        try:
            return is_signed_markdown(data.decode("utf-8"))
        except UnicodeDecodeError:
            return False
    if suffix in (".csv", ".json"):   # a table's or figure's numbers, the report's provenance: through their twin
        twins = [path.with_suffix(".md"), path.with_suffix(".png")] if suffix == ".csv" else [path.parent / "report.md"]
        return any(t.is_file() and is_report_output(t) for t in twins)
    return False


# ---------------------------------------------------------------- claiming and writing outputs


@contextmanager
def claimed(paths: list[Path], inputs: list[str]):
    """Claim every output file of one artefact (checked, locked) before anything is computed: {path: claim}."""
    with ExitStack() as stack:
        yield {Path(p): stack.enter_context(safe_output(p, "symfusion-report", is_report_output, inputs)) for p in paths}


def write_claimed(claims: dict, output: Path, built: Built) -> None:
    """Every file of a built artefact through its claim: all written to temp files first, then swapped in."""
    contents = {(output.with_suffix(key) if key.startswith(".") else output.parent / key): data
                for key, data in built.files.items()}
    if set(contents) != set(claims):
        raise SymfusionError(f"internal: the artefact built {sorted(map(str, contents))}, claimed {sorted(map(str, claims))}")
    paths = list(contents)
    with writing_together([claims[path] for path in paths]) as temps:   # all swapped in together, or none
        for path, tmp in zip(paths, temps):
            tmp.write_bytes(contents[path].encode() if isinstance(contents[path], str) else contents[path])
