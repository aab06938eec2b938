"""Reading stage results (eval, match and barrier JSON) and the paper's reference tables."""
from __future__ import annotations

import csv
import io
import json
from contextlib import ExitStack, contextmanager
from pathlib import Path

from symfusion.config import CONF_DIR
from symfusion.errors import SymfusionError
from symfusion.outputs import safe_output

PAPER_DIR = CONF_DIR / "paper"

# Display names of the matching variants, as the paper labels them.
VARIANT_LABELS = {
    "none": "w/o match",
    "ffn_only": "w/o ATTN",
    "attn_only": "w/o FFN",
    "rotation_no_rescale": "w/o rescale",
    "rotation": "match",
    "git_rebasin": "Git Re-Basin",
    "ot_ffn": "OT-Fusion (FFN)",
}
METHOD_LABELS = {
    "simple": "Simple", "fisher": "Fisher", "regmean": "RegMean",
    "ot_acts_emd": "OT-ACTS-EMD", "ot_acts": "OT-ACTS", "ot_wts": "OT-WTS",
}


def read_json(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        candidates = [p for p in ("match.json", "merge.json") if (path / p).is_file()]
        if not candidates:
            raise SymfusionError(f"{path} holds no match.json or merge.json; rerun the stage that writes it")
        path = path / candidates[0]
    if not path.is_file():
        raise SymfusionError(f"result file {path} does not exist; run the pipeline stage that writes it")
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, ValueError) as error:
        raise SymfusionError(f"{path} is not a JSON result of a symfusion stage; pass the stage's own output") from error
    if not isinstance(data, dict):
        raise SymfusionError(f"{path} is not a JSON result of a symfusion stage; pass the stage's own output")
    return data


def read_paper_table(name: str) -> list[dict]:
    """Rows of conf/paper/<name>.csv (comment lines start with '#')."""
    path = PAPER_DIR / f"{name}.csv"
    with open(path) as handle:
        return list(csv.DictReader(line for line in handle if not line.startswith("#")))


def percent(fraction: float | None) -> float | None:
    """A score or accuracy in [0, 1] as points (x100), the unit of every table and figure CSV (and of
    symfusion-compare's tolerance); None stays None."""
    return None if fraction is None else 100 * fraction


def write_csv(rows: list[dict], path: str | Path) -> None:
    """Rows as CSV; the columns are every key in order of first appearance (a row lacking one leaves it empty)."""
    fieldnames = list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fieldnames, restval="")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(path, buffer.getvalue())


# ---------------------------------------------------------------- outputs of symfusion-report

REPORT_SIGNATURE = "symfusion-report"   # in the PNG / PDF metadata of every figure


def is_report_output(path: Path) -> bool:
    """Whether an existing file is an artefact symfusion-report wrote (a previous output may be replaced)."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    suffix = path.suffix
    if suffix == ".png":
        return data.startswith(b"\x89PNG") and REPORT_SIGNATURE.encode() in data
    if suffix == ".pdf":
        return data.startswith(b"%PDF") and REPORT_SIGNATURE.encode() in data
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    if suffix == ".md":
        return text.startswith("# ") and ("\nInputs:\n" in text or text.startswith("# symfusion"))
    if suffix == ".json":
        return path.name == "provenance.json" and '"runs"' in text and '"inputs"' in text
    if suffix == ".csv":      # a table's or figure's numbers: recognised through its twin (.md or .png)
        twins = [path.with_suffix(".md"), path.with_suffix(".png")]
        return any(t.is_file() and is_report_output(t) for t in twins)
    return False


# The claims run_report takes on every file of an artefact before it computes anything.
_CLAIMS: dict[Path, object] = {}


@contextmanager
def claimed(paths: list[Path], inputs: list[str]):
    """Claim every output file of one artefact (checked, locked) before any is written."""
    with ExitStack() as stack:
        for path in paths:
            claim = stack.enter_context(safe_output(path, "symfusion-report", is_report_output, inputs))
            _CLAIMS[Path(path)] = claim
        try:
            yield
        finally:
            for path in paths:
                _CLAIMS.pop(Path(path), None)


@contextmanager
def _writing(path: Path):
    """A temp file that replaces `path` on success: through run_report's claim, or a claim of its own."""
    claim = _CLAIMS.get(Path(path))
    if claim is not None:
        with claim.writing() as tmp:
            yield tmp
        return
    with safe_output(path, "symfusion-report", is_report_output) as own:
        with own.writing() as tmp:
            yield tmp


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write through a hidden temp file and one atomic swap: a killed writer never leaves a half file."""
    with _writing(Path(path)) as tmp:
        tmp.write_text(text)


def save_figure(fig, png: str | Path) -> None:
    """PNG and PDF beside each other (signed in their metadata), each written through a temp file."""
    png = Path(png)
    for path, key in ((png, "Software"), (png.with_suffix(".pdf"), "Creator")):
        with _writing(path) as tmp:
            fig.savefig(tmp, dpi=150, bbox_inches="tight", format=path.suffix[1:],
                        metadata={key: REPORT_SIGNATURE})


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
