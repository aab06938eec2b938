"""The experiment registry as the report reads it: every table and figure of conf/experiments.yaml, and the labels of what they show.

One entry per artefact (its kind, track, writer module, title, caption, paper table, order of methods, the
matchings its inputs declare); the workflow builds the same entries' inputs (workflow/rules/experiments.smk).
Labels live with what they label: a matching's in its presets/matching/<name>.yaml (`label:`, read here), a
fusion method's on its declaration (FusionMethod.label, read by results.method_label); an entry may rename
a matching for itself (`labels:`). A missing label is an error, never a silent drop. (No torch here:
symfusion-compare reads the registry too.)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import jsonschema
import yaml

from symfusion.pipeline.config import CONF_DIR, load_group
from symfusion.errors import SymfusionError
from symfusion.pipeline.tracks import entry_problems

REGISTRY_FILE = CONF_DIR / "experiments.yaml"
# its schema, which the workflow checks it against too (a checkout's workflow/; an installed package has none)
SCHEMA_FILE = CONF_DIR.resolve().parent / "workflow" / "schemas" / "experiments.schema.yaml"
REPORT = "report"         # symfusion-report's name for the audit report (report.md), which is no entry
KIND_FILES = {"table": (".csv", ".md"), "figure": (".png", ".pdf", ".csv")}   # first: what output= names


@dataclass(frozen=True)
class Experiment:
    """One table or figure of the registry."""

    name: str
    kind: str
    track: str
    writer: str
    title: str
    caption: str
    paper: str | None
    compare: bool
    inputs: dict
    methods: tuple = ()
    labels: dict = field(default_factory=dict)
    paper_columns: dict = field(default_factory=dict)
    effect: dict | None = None
    on_demand: bool = False       # built only when asked for by name, not by the default target (report.md says how)

    def matchings(self, kind: str) -> list[str]:
        """The matchings its inputs of `kind` declare, in order (its columns, bars or curves)."""
        found = [m for kinds in self.inputs.values() for k, spec in kinds.items() if k == kind
                 for m in spec.get("matchings", [])]
        return list(dict.fromkeys(found))

    def check_shown(self, kind: str, found) -> None:
        """Refuse inputs of a matching this artefact does not declare (it would not show them), or none it does."""
        declared = self.matchings(kind)
        extra = [m for m in dict.fromkeys(found) if m not in declared]
        if extra:
            raise SymfusionError(f"{self.name}: an input is of matching {extra[0]!r}, which its entry in "
                                 f"{REGISTRY_FILE.name} does not declare ({', '.join(declared)}); declare it there")
        if not any(m in declared for m in found):
            raise SymfusionError(f"{self.name}: no input is of a matching its entry declares ({', '.join(declared)})")

    def label(self, matching: str) -> str:
        """What this artefact calls a matching: its own name for it, else the matching's label."""
        return self.labels.get(matching) or matching_label(matching)

    def ordered_methods(self, present) -> list[str]:
        """The fusion methods among `present` in this artefact's order; any it does not order follow, in their
        own order (a new method shows up, never drops out)."""
        present = list(dict.fromkeys(present))
        return [m for m in self.methods if m in present] + [m for m in present if m not in self.methods]

    @property
    def suffix(self) -> str:
        """The suffix of the output= path symfusion-report is given (.csv for a table, .png for a figure)."""
        return KIND_FILES[self.kind][0]

    def files(self, output: Path) -> list[Path]:
        """Every file it writes, from the output= path: a table's CSV and Markdown, a figure's PNG, PDF and CSV."""
        return [output.with_suffix(s) for s in KIND_FILES[self.kind]]


@lru_cache(maxsize=None)
def experiments() -> dict[str, Experiment]:
    """Every entry of conf/experiments.yaml, in its order (report.md's order)."""
    try:
        data = yaml.safe_load(REGISTRY_FILE.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise SymfusionError(f"cannot read the experiment registry {REGISTRY_FILE} ({str(error).splitlines()[0]})") from error
    if SCHEMA_FILE.is_file():
        schema = yaml.safe_load(SCHEMA_FILE.read_text())
        problem = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(data))
        if problem is not None:
            where = ".".join(str(p) for p in problem.absolute_path)
            raise SymfusionError(f"{REGISTRY_FILE}: {where}: {problem.message}")
    if not isinstance(data, dict) or not data:
        raise SymfusionError(f"{REGISTRY_FILE} holds no experiments")
    found = {}
    for name, entry in data.items():
        problems = entry_problems(name, entry) if isinstance(entry, dict) and "track" in entry else []
        if problems:
            raise SymfusionError(f"{REGISTRY_FILE}: {problems[0]}")
        try:
            found[name] = Experiment(name=name, methods=tuple(entry.pop("methods", ())), **entry)
        except TypeError as error:
            raise SymfusionError(f"{REGISTRY_FILE}: {name}: {error}") from error
    return found


def experiment(artefact: str) -> Experiment:
    """An entry by its name, or by the name of its writer when one entry alone has that writer (artefact=fig3)."""
    entries = experiments()
    if artefact in entries:
        return entries[artefact]
    by_writer = [e for e in entries.values() if e.writer == artefact]
    if len(by_writer) == 1:
        return by_writer[0]
    raise SymfusionError(f"unknown artefact {artefact!r}; choose one of {', '.join([*entries, REPORT])}")


@lru_cache(maxsize=None)
def matching_label(name: str) -> str:
    """The `label:` of presets/matching/<name>.yaml: what tables and figures call the matching."""
    label = load_group("matching", name).get("label")
    if not isinstance(label, str) or not label.strip():
        raise SymfusionError(f"presets/matching/{name}.yaml has no label: (its name in tables and figures); add one")
    return label
