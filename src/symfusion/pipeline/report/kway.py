"""Beyond the paper: k models into one: the centroid merge and the simplex barrier of each track's k end models after each way of moving them into one basis, beside the best end model and the logit ensemble (a table, or a figure).

Inputs (the kway_evals of conf/experiments.yaml, symfusion-kway's JSONs): one per way and matching, `way` naming them
(anchor/none: naive averaging; anchor/M: each model onto the first by pairwise M; barycenter/M: symfusion-multimodel's
grouped matching; universe/M: symfusion-align-many), and the end models' own (their scores, the best, the logit
ensemble). One section per task (a track's k end models: the ViTs, the decoders), in the inputs' order: rows in the
entry's order of ways and matchings, then the best end model and the ensemble; accuracies in points (x100), a
decoder's perplexity as it is, losses in nats; the barrier also as a percentage of the section's naive averaging's. A
way that another section has and this one lacks is a row saying it was not run (the barycentric matching: encoders
only). The figure: per section, the centroid's score per way with the best end model and the ensemble as lines, and
the simplex barrier per way.
"""
from __future__ import annotations

from pathlib import Path

from symfusion.errors import SymfusionError
from symfusion.pipeline.report.registry import Experiment
from symfusion.pipeline.report.results import (INTEGER, NUMBER, RESULT_FILE, STRING, Built, array, csv_text,
                                               figure_files, inputs_list, markdown_table, plt, read_csv_rows,
                                               read_json, record, signed_markdown)

SCORE = record({"loss": NUMBER})
WAY = record({"way": STRING, "k": INTEGER, "task": STRING, "metric": STRING, "centroid": SCORE, "barrier": NUMBER,
              "end_losses": array(NUMBER, 2), "points": array(SCORE, 1)})
ENDS = record({"k": INTEGER, "task": STRING, "metric": STRING, "best": SCORE, "ensemble": SCORE,
               "end_evals": array(SCORE, 2)})
SHAPES = {RESULT_FILE: {"if": {"required": ["ensemble"]}, "then": ENDS, "else": WAY}}
WAYS = {"anchor": "anchor: each onto the first by pairwise", "barycenter": "barycentric (grouped) matching,",
        "universe": "universe: all into one basis by"}
NAIVE = "anchor/none"
NOT_RUN = {"barycenter": "not run: symfusion-multimodel's grouped matching supports the encoder families only"}
COLUMNS = ["way", "label", "task", "k", "metric", "centroid", "centroid_loss", "simplex_barrier", "barrier_of_naive_pct",
           "points", "examples"]


def declared(experiment: Experiment) -> list[str]:
    """The ways the entry shows, `way/matching`, in its order (over its tracks, each once)."""
    return list(dict.fromkeys(f"{way}/{m}" for kinds in experiment.inputs.values() for kind, spec in kinds.items()
                              if kind == "kway_evals" for way, matchings in spec.items() for m in matchings))


def label(way: str, experiment: Experiment) -> str:
    """A way's row label: naive averaging, or the way with its matching's label."""
    kind, matching = way.split("/", 1)
    return "none (naive averaging)" if way == NAIVE else f"{WAYS[kind]} {experiment.label(matching)}"


def score(value: float, metric: str) -> float:
    """A metric as tables show it: accuracy in points (x100), perplexity as it is."""
    return 100 * value if metric == "accuracy" else value


def kway_rows(paths: list[str], experiment: Experiment) -> list[dict]:
    """Per task (section, in the inputs' order): one row per declared way that the inputs hold (entry order), a row
    for each way another section has and this one lacks (not run), then the best end model and the ensemble."""
    order = declared(experiment)
    sections: dict[str, dict] = {}
    for path in paths:
        data = read_json(path)
        section = sections.setdefault(data["task"], {"ways": {}, "ends": None})
        if "ensemble" in data:
            if section["ends"] is not None:
                raise SymfusionError(f"{experiment.name}: two results of the end models of {data['task']} ({path}); "
                                     "pass one")
            section["ends"] = data
            continue
        if data["way"] not in order:
            raise SymfusionError(f"{experiment.name}: {path} is of way {data['way'][:60]!r}, which its entry in "
                                 f"conf/experiments.yaml does not declare ({', '.join(order)}); declare it there")
        if data["way"] in section["ways"]:
            raise SymfusionError(f"{experiment.name}: two results of way {data['way']!r} of {data['task']}; pass one")
        section["ways"][data["way"]] = data
    if not sections or any(s["ends"] is None or not s["ways"] for s in sections.values()):
        raise SymfusionError(f"{experiment.name} reads the end models' scores (kway/ends.json) and at least one way's "
                             "(kway/<way>/<matching>.json) of each track; pass the results its registry entry names")
    anywhere = {way for s in sections.values() for way in s["ways"]}
    return [row for s in sections.values() for row in section_rows(s["ways"], s["ends"], order, anywhere, experiment)]


def section_rows(ways: dict, ends: dict, order: list[str], anywhere: set, experiment: Experiment) -> list[dict]:
    """One task's rows: its ways (and those of `anywhere` it lacks, not run), its best end model, its ensemble."""
    if any(d["k"] != ends["k"] for d in ways.values()):
        raise SymfusionError(f"{experiment.name}: the ways' results are not of the end models' k = {ends['k']} and "
                             f"task {ends['task']}; pass one group's results")
    naive = ways.get(NAIVE, {}).get("barrier")
    rows = []
    for way in (w for w in order if w in anywhere):
        if way not in ways:
            why = NOT_RUN.get(way.split("/", 1)[0], "not run for these models")
            rows.append({"task": ends["task"], "k": ends["k"], "way": way, "label": f"{label(way, experiment)} "
                         f"({why})", "metric": ends["metric"]})
            continue
        data = ways[way]
        metric = data["metric"]
        rows.append({"task": data["task"], "k": data["k"], "way": way, "label": label(way, experiment),
                     "metric": metric, "centroid": score(data["centroid"][metric], metric),
                     "centroid_loss": data["centroid"]["loss"], "simplex_barrier": data["barrier"],
                     "barrier_of_naive_pct": 100 * data["barrier"] / naive if naive else None,
                     "points": len(data["points"]), "examples": data.get("examples")})
    metric = ends["metric"]
    for way, name in (("best", f"best end model (model {ends['best'].get('model')})"), ("ensemble", "logit ensemble")):
        rows.append({"task": ends["task"], "k": ends["k"], "way": way, "label": name, "metric": metric,
                     "centroid": score(ends[way][metric], metric), "centroid_loss": ends[way]["loss"]})
    return [{c: row.get(c) for c in COLUMNS} for row in rows]


def by_task(rows: list[dict]) -> dict[str, list[dict]]:
    """The rows of each section (task), in their order."""
    sections: dict[str, list[dict]] = {}
    for row in rows:
        sections.setdefault(row["task"], []).append(row)
    return sections


def build(paths: list[str], experiment: Experiment) -> Built:
    rows = kway_rows(paths, experiment)
    if experiment.kind == "figure":
        return Built(rows, {**figure_files(plot(rows, experiment)), ".csv": csv_text(rows)})
    tables = "\n".join(f"k = {part[0]['k']} end models ({task}, {part[0]['metric']}):\n\n" + markdown_table(part, COLUMNS)
                       for task, part in by_task(rows).items())
    text = (f"# {experiment.title}\n\n" + tables +
            "\n`centroid`: the equal-weight merge's metric (accuracy in points, or a decoder's perplexity) on the whole "
            "test split, `centroid_loss` its loss (nats; a decoder's per token); `simplex_barrier`: the largest, "
            "over the simplex grid's `points` (weights in steps of 1/4, and the centroid) on `examples` test "
            "examples (empty: all), of the mixture's loss minus the mixture of the end models' losses "
            "(`barrier_of_naive_pct`: of the same models' naive averaging's). The best end model (a decoder's: the "
            "lowest loss) and the logit ensemble (the mean of the k models' logits) are the end models' own "
            "scores.\n\n" + inputs_list(paths))
    return Built(rows, {".csv": csv_text(rows), ".md": signed_markdown(text)})


def plot(rows: list[dict], experiment: Experiment):
    """Per section (a row of panels): left, the centroid's score per way, the best end model and the ensemble as
    lines; right, the simplex barrier. A way not run: no bar, "(not run)" after its label (the table says why)."""
    sections = list(by_task(rows).values())
    heights = [0.5 * sum(r["way"] not in ("best", "ensemble") for r in part) + 1.5 for part in sections]
    fig, axes = plt.subplots(len(sections), 2, figsize=(13, sum(heights) + 1), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for (left, right), part in zip(axes, sections):
        ways = [r for r in part if r["way"] not in ("best", "ensemble")]
        lines = {r["way"]: r for r in part if r["way"] in ("best", "ensemble")}
        metric, y = ways[0]["metric"], range(len(ways))
        left.barh(y, [r["centroid"] or 0 for r in ways], color="tab:blue")
        for (way, row), style in zip(lines.items(), ("--", ":")):
            left.axvline(row["centroid"], color="black", linestyle=style, label=row["label"])
        left.set_yticks(list(y), [r["label"].split(" (not run")[0] + (" (not run)" if r["centroid"] is None else "")
                                  for r in ways], fontsize=8)
        left.invert_yaxis()
        left.set_xlabel(f"centroid merge: test {metric}" + (" (%)" if metric == "accuracy" else ""))
        left.legend(loc="lower right", fontsize=8)
        left.set_title(f"k = {ways[0]['k']} end models into one ({ways[0]['task']})", fontsize=10)
        right.barh(y, [r["simplex_barrier"] or 0 for r in ways], color="tab:red")
        right.set_yticks(list(y), [""] * len(ways))
        right.invert_yaxis()
        right.set_xlabel("simplex barrier (test loss above the end models' mixture)")
    fig.tight_layout()
    return fig


def summary(csv_path: Path, experiment: Experiment) -> list[str]:
    """The table's lines in report.md (the figure shows the same rows): per section, each way's centroid and
    barrier."""
    if experiment.kind == "figure":
        return []
    lines = []
    for task, rows in by_task(read_csv_rows(csv_path)).items():
        ways = [r for r in rows if r["way"] not in ("best", "ensemble") and r["centroid"] not in ("", None)]
        ends = {r["way"]: r for r in rows if r["way"] in ("best", "ensemble")}
        if not ways:
            continue
        cells = "; ".join(f"{r['label']} {float(r['centroid']):.2f} / {float(r['simplex_barrier']):.3f}" for r in ways)
        tail = ", ".join(f"{r['label']} {float(r['centroid']):.2f}" for r in ends.values())
        lines.append(f"k models into one (k = {ways[0]['k']}, {task}): centroid {ways[0]['metric']} / simplex barrier "
                     f"per way: {cells}; {tail}.")
    return lines
