"""The audit report: every table and figure of a profile beside the paper's, with summary lines, the
paper's known anomalies, what differs from the paper, and a provenance.json of every run behind them."""
from __future__ import annotations

import csv
import json
import os
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

from symfusion.provenance import provenance
from symfusion.pipeline.report.results import read_paper_table, write_text_atomic

FIGURES = {
    "fig3_ablation.png": "Figure 3: ablation of the matching components, per fusion method (vision pair).",
    "fig4_distance.png": "Figure 4: Euclidean distance between the two end ViTs after each matching method.",
    "fig5_barrier.png": "Figure 5: loss along the linear path between the end ViTs, unmatched and matched.",
    "fig6_layers.png": "Figure 6: eval loss when matching one attention layer, or the last k layers.",
}

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
              "(the paper's are unpublished), see README's data card."],
}


def read_csv_rows(path: Path) -> list[dict]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


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
                     "our RegMean uses them (tests/test_fusion_fisher_regmean.py shows it differs from Simple).")
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


def table_section(results: Path, name: str, title: str) -> str:
    md = results / f"{name}.md"
    if not md.is_file():
        return f"## {title}\n\nNot produced in this profile.\n\n"
    body = md.read_text().split("\n", 2)[-1]            # drop the file's own title line
    return f"## {title}\n\n{body.strip()}\n\n"


def effect_counts(rows: list[dict], column: str = "ours_effect") -> str:
    """'k of n detectable (h help, t hurt)' over a table's effects."""
    verdicts = [r[column] for r in rows if r.get(column)]
    helps, hurts = verdicts.count("helps"), verdicts.count("hurts")
    return f"{helps + hurts} of {len(verdicts)} effects detectable ({helps} help, {hurts} hurt)"


def summary_lines(results: Path, figures: Path) -> list[str]:
    lines = []
    if (results / "table2.csv").is_file():
        rows = read_csv_rows(results / "table2.csv")
        agree = sum(r["effect_agrees"] == "yes" for r in rows)
        disagree = sum(r["effect_agrees"] == "no" for r in rows)
        lines.append(f"Table 2 (vision): full matching vs none, 95% paired bootstrap intervals: "
                     f"{effect_counts(rows)}; of the detectable ones, {agree} agree with the paper's direction and "
                     f"{disagree} do not.")
    if (results / "table1.csv").is_file():
        rows = read_csv_rows(results / "table1.csv")
        per_model = "; ".join(
            f"vs {m}: {sum(r[f'agrees_{m}'] == 'yes' for r in rows)} agree, {sum(r[f'agrees_{m}'] == 'no' for r in rows)} "
            "disagree" for m in ("roberta-base", "deberta-v3-large"))
        lines.append(f"Table 1 (language): matched vs unmatched, 95% paired bootstrap intervals: {effect_counts(rows)}; "
                     f"{per_model}.")
    if (figures / "fig3_ablation.csv").is_file():
        rows = [r for r in read_csv_rows(figures / "fig3_ablation.csv") if r["variant"] != "none"]
        lines.append(f"Figure 3: each matching variant vs none, per fusion method: {effect_counts(rows, 'verdict')}.")
    if (figures / "fig4_distance.csv").is_file():
        rows = {r["matching"]: float(r["distance"]) for r in read_csv_rows(figures / "fig4_distance.csv")}
        if "none" in rows and "rotation" in rows:
            order = " < ".join(sorted(rows, key=rows.get))
            lines.append(f"Figure 4: distance {rows['none']:.2f} unmatched -> {rows['rotation']:.2f} with rotation "
                         f"matching; order {order}.")
    if (figures / "fig5_barrier.csv").is_file():
        rows = read_csv_rows(figures / "fig5_barrier.csv")
        per_matching = defaultdict(dict)                  # matching -> pair -> a row of its path (barriers per path)
        for r in rows:
            per_matching[r["matching"]][r["pair"]] = r
        pairs = len({r["pair"] for r in rows})
        means = {m: {k: sum(float(r[k]) for r in found.values()) / len(found) for k in ("barrier", "barrier_linear")}
                 for m, found in per_matching.items()}
        barriers = {m: mean["barrier"] for m, mean in means.items()}
        cells = []
        for matching, found in per_matching.items():
            r = next(iter(found.values()))                # the change and its interval: one per matching
            cell = f"{matching} {barriers[matching]:.3f} (above line {means[matching]['barrier_linear']:.3f})"
            if r.get("barrier_change"):
                cell += (f", change {float(r['barrier_change']):+.3f} [{float(r['change_low']):+.3f}, "
                         f"{float(r['change_high']):+.3f}] {r['change_verdict']}")
            cells.append(cell)
        lowest = min(barriers, key=barriers.get)
        over = f", means over {pairs} model pairs" if pairs > 1 else ""
        lines.append(f"Figure 5: loss barriers (the paper's: max - min along the path{over}) " + "; ".join(cells) +
                     f"; lowest: {lowest} ({'as' if lowest == 'rotation' else 'unlike'} the paper, where full "
                     "matching gives the lowest barrier).")
    if (figures / "fig6_layers.csv").is_file():
        rows = [r for r in read_csv_rows(figures / "fig6_layers.csv") if r.get("loss_change")]
        if rows:
            largest = max(rows, key=lambda r: abs(float(r["loss_change"])))
            lines.append(f"Figure 6: each layer subset's eval-loss change vs unmatched: "
                         f"{effect_counts(rows, 'change_verdict')}; the largest "
                         f"{float(largest['loss_change']):+.3g} ({largest['task']}, {largest['setting']} {largest['k']}).")
    if (results / "multimodel.csv").is_file():
        lines += multimodel_summary(read_csv_rows(results / "multimodel.csv"))
    if (results / "table3.csv").is_file():
        rows = {r["stage"]: r for r in read_csv_rows(results / "table3.csv")}
        cells = [f"{k[5:]} {float(v):.2f}s" for k, v in rows.get("matching", {}).items()
                 if k.startswith("ours_") and not k.endswith("_n") and v]
        if cells:
            lines.append("Table 3: matching one pair takes " + ", ".join(cells) + " here.")
    return lines


def multimodel_summary(rows: list[dict]) -> list[str]:
    """One line per model of multimodel.csv: barycentric vs anchor matching, and the joint-matching gain."""
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        cells = {r["variant"]: r for r in mine if r["comparison"] == "group matching"}
        if not {"anchor", "barycenter"} <= set(cells):
            continue
        a, b = cells["anchor"], cells["barycenter"]
        line = (f"Beyond the paper ({model}, k={a['k']}): barycentric matching gives a sum of pairwise distances "
                f"{float(b['sum_pairwise_distance']):.4f} vs {float(a['sum_pairwise_distance']):.4f} with anchor "
                f"matching (unmatched {float(a['distance_before']):.4f})")
        if a.get("merged_ood_score") not in (None, ""):
            line += f"; OOD score of the simple merge {b['merged_ood_score']} vs {a['merged_ood_score']}"
        gains = [float(r["relative_gain"]) for r in mine if r["comparison"] == "joint vs sequential"]
        if gains:
            line += f"; joint rotation+rescaling is closer than sequential by at most {max(gains):.2e} (relative)"
        lines.append(line + ".")
    return lines


def run_provenance(results: Path) -> dict:
    """Every stage JSON under the results dir: its resolved config, seed and code version."""
    runs = {}
    for path in sorted(results.rglob("*.json")):
        if "logs" in path.parts or "benchmarks" in path.parts or path.name == "provenance.json":
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        record = data.get("provenance") if isinstance(data, dict) else None
        if record:
            runs[str(path)] = {"config": record.get("config"), "seed": record.get("seed"), "git": record.get("git")}
            for source in ("base_model_source", "data_source"):     # pinned Hub revisions, local stand-ins
                if data.get(source):
                    runs[str(path)][source] = data[source]
    return runs


def write_report(inputs: list[str], output: str | Path) -> list[str]:
    """results/<profile>/report.md and provenance.json from the profile's tables and figures."""
    output = Path(output)
    results = output.parent
    profile = results.name
    pngs = [Path(p) for p in inputs if str(p).endswith(".png")]     # the figures are among the inputs
    figures_abs = pngs[0].parent if pngs else Path("figures") / profile
    figures = Path(os.path.relpath(figures_abs, results))
    here = provenance()
    lines = summary_lines(results, figures_abs)
    git = here["git"]
    text = [f"# symfusion reproduction report: profile `{profile}`\n",
            f"Generated {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} from commit "
            f"{git.get('commit')}{' (uncommitted changes)' if git.get('dirty') else ''} on "
            f"{here['machine']['processor']} ({here['machine']['cuda'] or 'no GPU'}). Paper: Zhang et al., "
            "ICML 2025, arXiv 2502.00264; its numbers come from conf/paper/*.csv.\n",
            "## Summary\n", *[f"- {line}" for line in lines], "",
            table_section(results, "table1", "Table 1: language fusion (in-domain and out-of-domain)"),
            table_section(results, "table2", "Table 2: vision fusion, six methods with and without matching"),
            table_section(results, "table3", "Table 3: runtimes"),
            table_section(results, "multimodel", "Beyond the paper: multi-model (barycentric) and joint matching"),
            "## Figures\n"]
    for name, caption in FIGURES.items():
        if (figures_abs / name).is_file():
            text.append(f"![{caption}]({figures / name})\n\n*{caption}* Numbers: `{figures / name.replace('.png', '.csv')}`.\n")
    text += ["## Known anomalies of the paper\n", *[f"- {n}" for n in paper_anomalies()], "",
             "## What differs from the paper, and why\n", *[f"- {d}" for d in DIFFERENCES.get(profile, [])], "",
             f"Provenance of every run behind these numbers: `{results / 'provenance.json'}`.\n"]
    write_text_atomic(output, "\n".join(text))
    record = {**here, "profile": profile, "inputs": list(inputs), "runs": run_provenance(results)}
    write_text_atomic(results / "provenance.json", json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
    return lines
