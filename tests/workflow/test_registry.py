"""The experiment registry: every entry has a writer and every writer an entry, every matching and method it names
exists and has a label, the Snakefile builds exactly its entries per profile, and writers follow what it declares."""
import csv
import dataclasses
import re
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from symfusion.pipeline.config import CONF_DIR, group_names, load_group
from symfusion.errors import SymfusionError
from symfusion.fusion import FUSION_METHODS
from symfusion.fusion.options import FusionMethod
from symfusion.pipeline.report import artefacts, registry
from symfusion.pipeline.report.compare import compared_files
from symfusion.pipeline.report.registry import experiment, experiments
from symfusion.pipeline.report.table2 import table2_rows
from symfusion.pipeline.stages.merge import fusion_config
from test_vision_stages import merged_evaluation_files
from workflow_copy import ROOT, dry_run_jobs, edit_yaml, scratch_workflow, snakemake, stderr_lines

REPORT = ROOT / "src" / "symfusion" / "pipeline" / "report"
SHARED = {"__init__", "artefacts", "audit", "barriers", "compare", "effects", "registry", "results", "spread"}   # not writers
PROFILES = sorted(p.stem for p in (ROOT / "conf" / "profile").glob("*.yaml"))


def test_the_registry_follows_its_schema():
    validate(yaml.safe_load((CONF_DIR / "experiments.yaml").read_text()),
             str(ROOT / "workflow" / "schemas" / "experiments.schema.yaml"))


def test_every_entry_has_a_writer_and_every_writer_an_entry():
    writers = {p.stem for p in REPORT.glob("*.py")} - SHARED
    assert {e.writer for e in experiments().values()} == writers == set(artefacts.WRITERS)
    for name, module in artefacts.WRITERS.items():
        assert callable(module.build) and callable(module.summary) and isinstance(module.SHAPES, dict), name


def test_every_matching_and_method_an_entry_names_exists_with_its_label():
    for entry in experiments().values():
        for kinds in entry.inputs.values():
            for spec in kinds.values():
                for matching in spec.get("matchings", []):
                    assert matching == "profile" or matching in group_names("matching"), (entry.name, matching)
                for method in spec.get("methods", []):
                    assert method in FUSION_METHODS, (entry.name, method)
        assert set(entry.methods) <= set(FUSION_METHODS), entry.name
        shown = {m for kind in ("merged_evals", "matched", "barriers") for m in entry.matchings(kind)}
        assert set(entry.labels) | set(entry.paper_columns) <= shown, entry.name
        for matching in shown - {"profile"}:
            assert entry.label(matching).strip()
    assert all(load_group("matching", m).get("label") for m in group_names("matching"))
    assert set(FUSION_METHODS) == set(group_names("fusion")) and all(m.label for m in FUSION_METHODS.values())


def test_a_missing_label_is_an_error_not_a_silent_drop(monkeypatch):
    with pytest.raises(SymfusionError, match="declares no label"):
        FusionMethod("toy", lambda models, batches: {}, "a toy")
    registry.matching_label.cache_clear()
    monkeypatch.setattr(registry, "load_group", lambda group, name: {"name": name})
    try:
        with pytest.raises(SymfusionError, match="has no label"):
            experiment("fig3_ablation").label("ffn_only")
    finally:
        registry.matching_label.cache_clear()


def profile_tracks(settings: dict) -> dict[str, bool]:
    """Which tracks a profile has: vision always, lang with encoders, decoder with its section, decoder_ft with the
    decoder section's finetune."""
    decoder = settings.get("decoder") or {}
    return {"vision": True, "lang": bool(settings["language"]["models"]), "decoder": bool(decoder),
            "decoder_ft": bool(decoder.get("finetune"))}


def expected_targets(profile: str, results: str, figures: str, on_demand: bool = False) -> list[str]:
    """The artefacts the default target builds (on_demand: those built only when asked for by name)."""
    settings = yaml.safe_load((ROOT / "conf" / "profile" / f"{profile}.yaml").read_text())
    tracks = profile_tracks(settings)
    return [f"{results}/{profile}/{e.name}.csv" if e.kind == "table" else f"{figures}/{profile}/{e.name}.png"
            for e in experiments().values() if tracks[e.track] and e.name not in settings.get("experiments_off", [])
            and e.on_demand == on_demand]


@pytest.mark.slow
@pytest.mark.parametrize("profile", PROFILES)
def test_the_snakefile_builds_exactly_the_registry_entries(profile):
    run = snakemake(ROOT, "-n", "--config", f"profile={profile}", "results_dir=/nonexistent/results",
                    "figures_dir=/nonexistent/figures")
    assert run.returncode == 0, run.stdout[-2000:]
    jobs = dry_run_jobs(run.stdout)
    expected = expected_targets(profile, "/nonexistent/results", "/nonexistent/figures")
    assert jobs["report"][0]["input"] == expected
    built = sorted(j["output"][0] for rule in ("table", "figure") for j in jobs[rule])
    assert built == sorted(expected)
    decoder_jobs = [j for rule in ("decoder_merge", "barrier", "decoder_mergekit") for j in jobs.get(rule, [])
                    if "/decoder/" in j["output"][0]]
    assert {rule for rule in ("decoder_merge", "decoder_mergekit") if rule in jobs} == {"decoder_merge", "decoder_mergekit"}
    assert any("/barrier/" in j["output"][0] for j in decoder_jobs)                     # every profile has decoders


@pytest.mark.slow
@pytest.mark.parametrize("profile", [p for p in PROFILES if p.startswith("decoders")])
def test_a_decoders_profile_runs_the_decoder_track_alone(profile):
    """conf/profile/decoders*.yaml (docs/decoders.md "The decoders profiles") keep the mini's vision and language
    sections, which the schema requires, with every entry of theirs in experiments_off: the dry run holds the decoder
    task's data, the decoder track's jobs (one training per seed) and the decoder entries' table, figure and report,
    no job of the vision or language tracks."""
    settings = yaml.safe_load((ROOT / "conf" / "profile" / f"{profile}.yaml").read_text())
    run = snakemake(ROOT, "-n", "--config", f"profile={profile}", "results_dir=/nonexistent/results",
                    "figures_dir=/nonexistent/figures")
    assert run.returncode == 0, run.stdout[-2000:]
    jobs = dry_run_jobs(run.stdout)
    task, results = settings["decoder"]["task"], f"/nonexistent/results/{profile}"
    assert [j["output"] for j in jobs["data"]] == [[f"{results}/data/{task}.json"]]
    track_jobs = [j["output"][0] for rule, found in jobs.items() if rule not in {"data", "table", "figure", "report", "all"}
                  for j in found]
    assert track_jobs and [o for o in track_jobs if not o.startswith(f"{results}/decoder/{task}/")] == []
    assert {experiment(Path(j["output"][0]).stem).track for rule in ("table", "figure") for j in jobs[rule]} == {"decoder"}
    assert len(jobs["train"]) == len(settings["decoder"]["seeds"])


@pytest.mark.slow
def test_an_on_demand_entry_is_built_by_its_own_target_only():
    """mini's SmolLM2 table: not among the default target's inputs (above), but its target builds it with the
    decoder_ft track's jobs: two fine-tunes, scored on both domains, matched, merged by every method."""
    targets = expected_targets("mini", "/nonexistent/results", "/nonexistent/figures", on_demand=True)
    (target,) = [t for t in targets if t.endswith("/table_decoder_smollm2.csv")]
    run = snakemake(ROOT, "-n", target, "--config", "profile=mini", "results_dir=/nonexistent/results",
                    "figures_dir=/nonexistent/figures")
    assert run.returncode == 0, run.stdout[-2000:]
    jobs = dry_run_jobs(run.stdout)
    entry = experiment("table_decoder_smollm2")
    matchings = entry.matchings("merged_evals")
    assert len(jobs["train"]) == 2 and len(jobs["decoder_merge"]) == len(matchings)
    assert len(jobs["match"]) == len(matchings) - 1 and "report" not in jobs and "barrier" not in jobs
    assert all("/decoder_ft/smollm2_135m/" in j["output"][0] for rule in ("train", "match") for j in jobs[rule])


@pytest.mark.slow
def test_the_kway_entry_is_built_by_its_own_target_only():
    """mini's k-way table (issue 58): not in the default DAG (no rule of kway.smk there), but its target builds it from
    the 3 end ViTs and the 3 end decoders: per track the pairwise matchings onto the first, one align-many job per
    universe matching, the barycentric matching (ViTs only), each way scored, the end models' own scores (once per
    track, read by every way's score)."""
    default = dry_run_jobs(snakemake(ROOT, "-n", "--config", "profile=mini", "results_dir=/nonexistent/results",
                                     "figures_dir=/nonexistent/figures").stdout)
    assert not {"align_many", "kway_barycenter", "kway_score", "kway_ends"} & set(default)
    targets = expected_targets("mini", "/nonexistent/results", "/nonexistent/figures", on_demand=True)
    (table,) = [t for t in targets if t.endswith("/table_kway.csv")]
    (figure,) = [t for t in targets if t.endswith("/fig_kway.png")]
    run = snakemake(ROOT, "-n", table, figure, "--config", "profile=mini", "results_dir=/nonexistent/results",
                    "figures_dir=/nonexistent/figures")
    assert run.returncode == 0, run.stdout[-2000:]
    jobs = dry_run_jobs(run.stdout)
    inputs = experiment("table_kway").inputs
    assert set(inputs) == {"vision", "decoder"} and "barycenter" not in inputs["decoder"]["kway_evals"]
    assert len(jobs["train"]) == 6 and "report" not in jobs and len(jobs["table"]) == len(jobs["figure"]) == 1
    assert len(jobs["kway_barycenter"]) == 1 and "/vision/" in jobs["kway_barycenter"][0]["output"][0]
    for track, ways in ((t, inputs[t]["kway_evals"]) for t in ("vision", "decoder")):
        mine = {rule: [j for j in jobs[rule] if f"/{track}/" in j["output"][0]]
                for rule in ("align_many", "match", "kway_ends", "kway_score")}
        assert sorted(j["output"][0].rsplit("/", 1)[1] for j in mine["align_many"]) == sorted(ways["universe"])
        assert sorted(j["output"][0].rsplit("/", 1)[1] for j in mine["match"]) == ["full_symmetry", "full_symmetry"]
        assert all("-onto-seed0/" in j["output"][0] for j in mine["match"])
        assert len(mine["kway_ends"]) == 1 and len(mine["kway_score"]) == sum(len(m) for m in ways.values())
        assert any("full_symmetry_learned_many" in j["output"][0] for j in mine["kway_score"])
        assert all(mine["kway_ends"][0]["output"][0] in j["input"] for j in mine["kway_score"])


def missing_from_reference(reference: Path, targets: list[str]) -> list[str]:
    """What a committed reference lacks: of `targets`, each artefact's files (an on-demand one: all or none, as
    symfusion-compare checks it only when both runs have it), its provenance.json, and the files its report.md links
    (report.md sits in results/<profile> and links figures/<profile>/<name> as ../../figures/<profile>/<name>)."""
    missing = []
    for target in targets:
        entry = experiment(Path(target).stem)
        folder = reference if entry.kind == "table" else reference / "figures"
        lacking = [str(path) for path in entry.files(folder / entry.name) if not path.is_file()]
        if not entry.on_demand or len(lacking) < len(entry.files(folder / entry.name)):
            missing += lacking
    if not (reference / "provenance.json").is_file():
        missing.append(str(reference / "provenance.json"))
    links = re.findall(r"\]\((?!https?:)([^)#]+)\)", (reference / "report.md").read_text())
    here = [reference / "figures" / Path(link).name if "figures/" in link else reference / link for link in links]
    return missing + [str(path) for path in here if not path.is_file()] + ([] if here else ["report.md links nothing"])


def test_the_committed_reference_holds_every_artefact_of_the_mini_profile():
    """reference/mini is what `symfusion-compare results/mini` reads: every artefact the mini profile's default target
    builds is there with all its files, an on-demand one with all its files or none (symfusion-compare checks it only
    when both runs have it), and report.md links only files that are. (Figure D's files were once missing, so a fresh
    run's compare failed on them.)"""
    reference = ROOT / "reference" / "mini"
    assert missing_from_reference(reference, expected_targets("mini", "R", "F")
                                  + expected_targets("mini", "R", "F", on_demand=True)) == []
    assert (reference / "table_decoder_smollm2.csv").is_file()        # the on-demand table the reference has


@pytest.mark.parametrize("profile", [p for p in PROFILES if p.startswith("decoders") and (ROOT / "reference" / p).is_dir()])
def test_a_decoders_reference_holds_every_artefact_of_its_profile(profile):
    """reference/decoders* (docs/decoders.md "The decoders profiles") is what `symfusion-compare results/<profile>`
    reads: every artefact the profile's default target builds, with all its files, its provenance, and report.md's
    links resolved in it as in reference/mini."""
    targets = expected_targets(profile, "R", "F")
    assert {Path(t).stem for t in targets} == {"table_decoder", "figD_decoder_barrier"}
    assert missing_from_reference(ROOT / "reference" / profile, targets) == []


def test_the_reference_across_vendors_has_the_references_files_and_columns():
    """reference/mini_vendors (a mini run with portable=vendors, docs/reproduce.md#determinism) is what a run on the
    other vendor's CPU is compared with: the default target's tables and figure data of reference/mini, with the same
    columns and as many rows (a change to a table that remakes one reference must remake the other)."""
    vendors, reference = ROOT / "reference" / "mini_vendors", ROOT / "reference" / "mini"
    files = sorted(p.relative_to(vendors) for p in vendors.rglob("*") if p.is_file())
    assert files and all(p.suffix == ".csv" and (reference / p).is_file() for p in files)
    for path in files:
        ours, theirs = (list(csv.reader((folder / path).open())) for folder in (vendors, reference))
        assert ours[0] == theirs[0] and [row[0] for row in ours] == [row[0] for row in theirs], path
    default = {Path(t).stem for t in expected_targets("mini", "R", "F") if t.endswith(".csv") or t.endswith(".png")}
    assert {p.stem for p in files} == default - {"report"}


@pytest.mark.slow
def test_a_profile_switches_an_experiment_off_by_name(tmp_path):
    """smoke without Figure 6: no figure job and no layer sweep, and the report does not wait for it."""
    folder = scratch_workflow(tmp_path / "checkout")
    edit_yaml(folder / "conf" / "profile" / "smoke.yaml", lambda data: data.__setitem__("experiments_off", ["fig6_layers"]))
    run = snakemake(folder, "-n", "--config", "profile=smoke", "results_dir=/nonexistent/results",
                    "figures_dir=/nonexistent/figures")
    assert run.returncode == 0, run.stdout[-2000:] + "".join(stderr_lines(run))
    jobs = dry_run_jobs(run.stdout)
    figures = [t for t in expected_targets("smoke", "/nonexistent/results", "/nonexistent/figures")
               if t.endswith(".png")]
    assert "layer_sweep" not in jobs and len(jobs["figure"]) == len(figures) - 1
    assert "/nonexistent/figures/smoke/fig6_layers.png" not in jobs["report"][0]["input"]
    assert jobs["report"][0]["input"] == [t for t in expected_targets("smoke", "/nonexistent/results",
                                                                     "/nonexistent/figures") if "fig6" not in t]


ACCURACIES = {"none": 0.5, "rotation_no_rescale": 0.6, "rotation": 0.62, "attn_only": 0.58}


def paper_table2():
    """Table 2's entry declaring the paper's three columns only (the writer's behaviour, whatever else the registry
    adds beyond the paper)."""
    table2 = experiment("table2")
    inputs = {"vision": {**table2.inputs["vision"], "merged_evals": {
        "matchings": ["none", "rotation_no_rescale", "rotation"]}}}
    return dataclasses.replace(table2, inputs=inputs)


def test_a_fusion_method_the_entry_does_not_order_still_gets_its_row(tmp_path):
    paths = merged_evaluation_files(tmp_path, {m: ACCURACIES[m] for m in ("none", "rotation_no_rescale", "rotation")})
    unordered = dataclasses.replace(paper_table2(), methods=("fisher", "regmean"))
    assert [r["method"] for r in table2_rows(paths, unordered)] == ["simple"]


def test_a_matching_declared_for_table2_adds_its_column_and_effect_leaving_the_others_as_they_were(tmp_path):
    paths = merged_evaluation_files(tmp_path, ACCURACIES)
    table2 = paper_table2()
    inputs = {"vision": {**table2.inputs["vision"], "merged_evals": {
        "matchings": ["none", "rotation_no_rescale", "rotation", "attn_only"]}}}
    (plain,) = table2_rows([p for p in paths if not p.endswith("attn_only.json")], table2)
    (row,) = table2_rows(paths, dataclasses.replace(table2, inputs=inputs))
    assert {k: row[k] for k in plain} == plain
    assert list(row)[:4] == ["method", "ours_none", "ours_no_rescale", "ours_full"]
    assert row["ours_attn_only"] == pytest.approx(58.0)
    assert row["effect_attn_only"] == pytest.approx(8.0)
    assert row["effect_attn_only_low"] < 8.0 < row["effect_attn_only_high"] and row["ours_effect_attn_only"] == "helps"
    # beyond the paper's columns: its effect vs the paper's full matching too
    assert row["effect_attn_only_vs_rotation"] == pytest.approx(-4.0)
    assert row["effect_attn_only_vs_rotation_high"] < 0 and row["ours_effect_attn_only_vs_rotation"] == "hurts"


def test_a_result_of_an_undeclared_matching_is_refused_not_dropped(tmp_path):
    paths = merged_evaluation_files(tmp_path, ACCURACIES)
    with pytest.raises(SymfusionError, match="attn_only.*does not declare"):
        table2_rows(paths, paper_table2())


def test_symfusion_compare_checks_the_entries_marked_compare():
    tables, figures = compared_files()
    assert set(tables + figures) == {f"{e.name}.csv" for e in experiments().values() if e.compare}
    assert "table3.csv" not in tables and Path("table2.csv").name in tables


@pytest.mark.parametrize("name", sorted(FUSION_METHODS))
def test_the_merge_stage_fills_in_the_declared_defaults_of_a_fusion_preset(name):
    """A fusion preset states no option value; the merge stage's config (fusion_config) is the preset with every
    declared default filled in, overrides on top: what the merge reports and statistic identities record."""
    method = FUSION_METHODS[name]
    full = fusion_config(name)
    assert {k: v for k, v in full.items() if k not in ("name", "num_batches")} == method.defaults()
    assert full["name"] == name and ("num_batches" in full) == method.reads_data
    if method.options:
        option = method.options[0]
        changed = fusion_config(name, {option.name: None if option.nullable else option.default})
        assert changed[option.name] == (None if option.nullable else option.default)
