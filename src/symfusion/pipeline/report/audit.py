"""The audit report: every table and figure of the registry beside the paper's, with each artefact's summary lines, the
paper's known anomalies, what differs from the paper, and a provenance.json of every run behind them.

The report shows what it was given: a table or figure is shown only when its artefact (a table's CSV, a figure's
PNG) is among the inputs, never because a file of that name lies in the results folder (`given`)."""
from __future__ import annotations

import json
import os
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

from symfusion.errors import SymfusionError
from symfusion.io.provenance import provenance
from symfusion.io.regular import is_regular, read_regular_text
from symfusion.pipeline.report.registry import Experiment
from symfusion.pipeline.report.results import Built, read_paper_table, signed_markdown, unsigned_markdown

DIFFERENCES = {
    "mini": [
        "Vision: Fashion-MNIST (Debian's dataset-fashion-mnist, 20,000 training images) instead of CIFAR-10, "
        "and a 3-layer ViT (hidden 96, 4 heads) trained 4 epochs instead of the paper's 7-layer ViT: the two end "
        "models are closer to each other and the absolute accuracies are not comparable.",
        "Language: all-MiniLM-L6-v2 (6 layers, 384 hidden) instead of RoBERTa-base / DeBERTa-v3-large, "
        "fine-tuned 3 epochs at lr 2e-4 (3e-4 for NER) on 480 examples per dataset instead of 20 epochs at 1e-5; "
        "Fisher and RegMean statistics from 32 validation examples per model.",
        "Emotion-like task: Rotten Tomatoes fresh/rotten/plot split into 3 disjoint movie domains (3 pairs) "
        "instead of 5 emotion datasets (10 pairs). NER: SILVER tags from spaCy's en_core_web_sm over 3 offline "
        "corpora, out-of-domain = gensim's Lee news corpus instead of OntoNotes domains and CoNLL-2003.",
        "Figure 6: a CoLA-like (2016 debates, speaker party, MCC) and an STS-B-like (Lee document pairs) task "
        "instead of CoLA and STS-B; the two fine-tuned models are merged with each other.",
        "Fisher and RegMean statistics are computed on the matched models and RegMean really uses the Gram "
        "matrices (the reference code did neither for language; see the anomalies below).",
    ],
    "smoke": ["Smoke profile: tiny data slices and barely trained models; the numbers only show the pipeline runs."],
    "paper": ["Paper profile: the paper's models and data; splits of the emotion datasets are our own "
              "(the paper's are unpublished), see docs/data_card.md."],
}


def paper_anomalies() -> list[str]:
    """Sentences on the paper's own numbers that look wrong, found from its tables."""
    notes = []
    table1 = defaultdict(dict)
    for row in read_paper_table("table1"):
        table1[(row["setting"], row["model"], row["matched"])][row["method"]] = row["score"]
    identical = sorted({f"{s}/{m}" for (s, m, _), v in table1.items() if v.get("simple") == v.get("regmean")})
    if identical:
        notes.append(f"Table 1: RegMean equals Simple exactly in {', '.join(identical)}. The authors' NLP RegMean "
                     "passed the Gram matrices under the wrong keyword and silently fell back to plain averaging; "
                     "our RegMean uses them (tests/library/test_fusion_fisher_regmean.py shows it differs from Simple).")
    notes.append("Table 1: the reference computed Fisher and Gram statistics before matching, so its '+match' "
                 "Fisher/RegMean rows mix statistics of unmatched models with matched weights; ours compute them "
                 "on the matched models.")
    table2 = {(r["method"], r["variant"]): float(r["accuracy"]) for r in read_paper_table("table2")}
    below = sorted({m for (m, v), a in table2.items() if a < 10.0})
    if below:
        notes.append(f"Table 2: {', '.join(below)} reach at most chance level (10% on CIFAR-10) in some columns: "
                     "differences of 0.1-3 points there are differences between broken models.")
    table3 = read_paper_table("table3")
    if any(r["stage"] == "finetune" and not r.get("vit") for r in table3):
        notes.append("Table 3: the paper gives no ViT training time (its ViTs were trained beforehand).")
    return notes


def given(inputs: list[str]) -> set[str]:
    """The real paths of the report's inputs (an artefact is shown only when it is one of them)."""
    return {os.path.realpath(p) for p in inputs}


def table_section(results: Path, experiment: Experiment, inputs: set[str] | None = None) -> str:
    """A table's section of report.md: its Markdown without its own title (and signature) under the registry's,
    when its CSV is among the `inputs` (given(); None: whenever the folder holds it)."""
    md = results / f"{experiment.name}.md"
    if inputs is not None and os.path.realpath(md.with_suffix(".csv")) not in inputs:
        md = None
    if (md is None or not md.exists()) and experiment.on_demand:
        return (f"## {experiment.title}\n\nBuilt on demand, not by the default run: `snakemake --cores 2 "
                f"{results / experiment.name}.csv --config profile={results.name}` (in a profile with its "
                f"`{experiment.track}` track).\n\n")
    if md is None or not md.exists():
        return f"## {experiment.title}\n\nNot produced in this profile.\n\n"
    try:
        body = unsigned_markdown(read_regular_text(md)).split("\n", 2)[-1]    # drop the file's own title line
    except UnicodeDecodeError as error:
        raise SymfusionError(f"{md} is not the UTF-8 Markdown symfusion-report writes; rebuild it") from error
    return f"## {experiment.title}\n\n{body.strip()}\n\n"


def run_provenance(results: Path) -> dict:
    """Every stage JSON under the results dir: its resolved config, seed and code version."""
    runs = {}
    for path in sorted(results.rglob("*.json")):
        if "logs" in path.parts or "benchmarks" in path.parts or path.name == "provenance.json" \
                or not is_regular(path):                # a FIFO or a device is never opened (io/regular.py)
            continue
        try:
            data = json.loads(read_regular_text(path))
        except (SymfusionError, ValueError):            # UnicodeDecodeError and JSON errors are ValueErrors
            continue
        record = data.get("provenance") if isinstance(data, dict) else None
        if record:
            runs[str(path)] = {"config": record.get("config"), "seed": record.get("seed"), "git": record.get("git")}
            for source in ("base_model_source", "data_source"):     # pinned Hub revisions, local stand-ins
                if data.get(source):
                    runs[str(path)][source] = data[source]
    return runs


def build_report(inputs: list[str], output: Path, experiments: list[Experiment], lines: list[str]) -> Built:
    """results/<profile>/report.md and provenance.json: the summary `lines`, then every table of the registry and
    every figure there is, in the registry's order."""
    results = output.parent
    profile = results.name
    figures_abs = figures_folder(inputs, profile)
    shown = given(inputs)                      # the artefacts report.md may show
    figures = Path(os.path.relpath(figures_abs, results))
    here = provenance()
    git = here["git"]
    text = [f"# symfusion reproduction report: profile `{profile}`\n",
            f"Generated {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} from commit "
            f"{git.get('commit')}{' (uncommitted changes)' if git.get('dirty') else ''} on "
            f"{here['machine']['cpu'] or here['machine']['processor']} ({here['machine']['cuda'] or 'no GPU'}"
            f"{', MKL_CBWR=' + here['machine']['mkl_cbwr'] if here['machine'].get('mkl_cbwr') else ''}). "
            "Paper: Zhang et al., "
            "ICML 2025, arXiv 2502.00264; its numbers come from conf/paper/*.csv.\n",
            "## Summary\n", *[f"- {line}" for line in lines], "",
            *[table_section(results, e, shown) for e in experiments if e.kind == "table"],
            "## Figures\n"]
    for e in experiments:
        if e.kind == "figure" and os.path.realpath(figures_abs / f"{e.name}.png") in shown:
            text.append(f"![{e.title}]({figures / f'{e.name}.png'})\n\n*{e.title}* Numbers: `{figures / f'{e.name}.csv'}`.\n")
        elif e.kind == "figure" and e.on_demand:
            text.append(f"*{e.title}* Built on demand, not by the default run: `snakemake --cores 2 "
                        f"{figures_abs / e.name}.png --config profile={profile}` (in a profile with its `{e.track}` "
                        "track).\n")
    text += ["## Known anomalies of the paper\n", *[f"- {n}" for n in paper_anomalies()], "",
             "## What differs from the paper, and why\n", *[f"- {d}" for d in DIFFERENCES.get(profile, [])], "",
             f"Provenance of every run behind these numbers: `{results / 'provenance.json'}`.\n"]
    record = {**here, "profile": profile, "inputs": list(inputs), "runs": run_provenance(results)}
    return Built(lines, {".md": signed_markdown("\n".join(text)),
                         "provenance.json": json.dumps(record, indent=2, sort_keys=True, default=str) + "\n"})


def figures_folder(inputs: list[str], profile: str) -> Path:
    """Where the figures are: beside the figure PNGs among the report's inputs (else figures/<profile>)."""
    pngs = [Path(p) for p in inputs if str(p).endswith(".png")]
    return pngs[0].parent if pngs else Path("figures") / profile
