"""Reading stage results (eval, match and barrier JSON) and the paper's reference tables."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from symfusion.config import CONF_DIR
from symfusion.errors import SymfusionError

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
    return json.loads(path.read_text())


def read_paper_table(name: str) -> list[dict]:
    """Rows of conf/paper/<name>.csv (comment lines start with '#')."""
    path = PAPER_DIR / f"{name}.csv"
    with open(path) as handle:
        return list(csv.DictReader(line for line in handle if not line.startswith("#")))


def write_csv(rows: list[dict], path: str | Path) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(path, buffer.getvalue())


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write through a hidden temp file and one rename: a killed writer never leaves a half file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


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
