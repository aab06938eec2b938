"""The profiles' tracks (pipeline/tracks.py): end models, pairs, tasks and input specs, as the workflow and the registry read them."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from symfusion.pipeline import tracks as T
from symfusion.pipeline.report.registry import experiments

ROOT = Path(__file__).resolve().parents[2]
PROFILES = sorted(p.stem for p in (ROOT / "conf" / "profile").glob("*.yaml"))


def profile(name: str) -> dict:
    return yaml.safe_load((ROOT / "conf" / "profile" / f"{name}.yaml").read_text())


def test_pairs_take_the_earlier_model_as_the_anchor():
    assert T.all_pairs(["seed0", "seed1"]) == (("seed1", "seed0"),)
    assert T.all_pairs(["seed0", "seed1", "seed2"]) == (("seed1", "seed0"), ("seed2", "seed0"), ("seed2", "seed1"))
    assert T.all_pairs(["a"]) == ()


@pytest.mark.parametrize("name", PROFILES)
def test_every_profile_gives_each_end_model_a_task_a_seed_and_what_it_is_scored_on(name):
    settings = profile(name)
    found = T.tracks(settings)
    assert tuple(found) == T.TRACK_NAMES
    vision = found["vision"]
    assert vision.models == tuple(f"seed{s}" for s in settings["vision"]["seeds"])
    assert all(vision.task(g, n) == settings["vision"]["task"] for g in vision.groups for n in vision.models)
    assert [vision.seeds[n] for n in vision.models] == settings["vision"]["seeds"]
    lang = found["lang"]
    ner, ood = settings["language"]["ner"], settings["language"]["ner_ood"]
    for group in lang.groups:
        assert lang.model_of(group) == group
        for model in lang.models:
            assert lang.task(group, model) == model
            assert lang.eval_tasks(group, model) == [model] + ([ood] if model in ner else [])
    assert lang.group == tuple(ner) and set(lang.merged) <= set(lang.models)
    for track in found.values():
        assert set(track.merged) <= set(track.models)
        assert all(s in track.merged and a in track.merged for s, a in track.pairs)
        for group in track.groups:
            assert {track.task(group, n) for n in track.models} <= set(track.tasks(group))
            for source, anchor in track.pairs:
                assert track.pair_tasks(group, source, anchor)[0] == track.task(group, anchor)


def test_a_fine_tuned_decoder_is_scored_on_every_domain_in_the_profiles_order():
    settings = profile("mini")
    track = T.tracks(settings)["decoder_ft"]
    domains = settings["decoder"]["finetune"]["domains"]
    (group,) = track.groups
    assert all(track.eval_tasks(group, d) == domains for d in domains)
    assert track.pair_tasks(group, domains[1], domains[0]) == domains


def test_a_profile_without_a_decoder_section_has_no_decoder_tracks():
    settings = profile("mini")
    del settings["decoder"]
    found = T.tracks(settings)
    assert found["decoder"].groups == () and found["decoder_ft"].groups == ()


def test_merge_options_follow_the_language_alpha_precedence():
    settings = profile("mini")
    lang = settings["language"]
    lang["regmean_alpha"] = {"default": 0.1, "minilm": 0.5, "minilm/ner": 0.9}
    track = T.tracks(settings)["lang"]
    assert T.merge_options(track, settings, "minilm", lang["ner"][0])["regmean"]["alpha"] == 0.9
    assert T.merge_options(track, settings, "minilm", lang["emotion"][0])["regmean"]["alpha"] == 0.5
    assert T.merge_options(track, settings, "other", lang["emotion"][0])["regmean"]["alpha"] == 0.1
    assert T.merge_options(T.tracks(settings)["vision"], settings, "x", "seed0") is None


def test_specs_choose_pairs_models_matchings_and_methods():
    settings = profile("paper")                                      # 3 ViT seeds: 3 pairs
    vision = T.tracks(settings)["vision"]
    assert T.spec_pairs(vision, {"pairs": "first"}) == [("seed1", "seed0")]
    assert T.spec_pairs(vision, {}) == list(vision.pairs) and len(vision.pairs) == 3
    assert T.spec_models(vision, {"models": "first_pair"}, "all") == ["seed0", "seed1"]
    assert T.spec_methods(vision, {"methods": ["ot_wts", "simple"]}) == ["simple", "ot_wts"]     # the track's order
    lang = T.tracks(settings)["lang"]
    assert T.spec_matchings(lang, {}) == ["none", settings["language"]["matching"]]


def test_registry_entries_name_only_tracks_and_kinds_that_exist():
    assert all(T.entry_problems(e.name, {"track": e.track, "inputs": e.inputs}) == [] for e in experiments().values())
    assert T.entry_problems("x", {"track": "visoin", "inputs": {}}) == ["x: unknown track 'visoin'; tracks are "
                                                                          + ", ".join(T.TRACK_NAMES)]
    (problem,) = T.entry_problems("x", {"track": "lang", "inputs": {"lang": {"barriers": {}}}})
    assert problem.startswith("x: the lang track has no barriers")


def test_the_module_imports_only_the_standard_library():
    """The workflow loads it by its path (workflow/rules/config.smk, plain_module), without the package installed."""
    tree = ast.parse((ROOT / "src" / "symfusion" / "pipeline" / "tracks.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


@pytest.mark.slow
def test_snakemake_sets_the_thread_variables_from_a_rules_threads(tmp_path):
    """No rule sets OMP/MKL/OPENBLAS_NUM_THREADS itself: Snakemake exports them from `threads` for every shell command
    (locally; under SLURM the job step runs the same shell). A job with more threads than --cores gets --cores."""
    (tmp_path / "Snakefile").write_text(
        "rule all:\n    input: 'two.txt', 'eight.txt'\n\n"
        "rule two:\n    output: 'two.txt'\n    threads: 2\n"
        "    shell: 'echo $OMP_NUM_THREADS $MKL_NUM_THREADS $OPENBLAS_NUM_THREADS > {output}'\n\n"
        "rule eight:\n    output: 'eight.txt'\n    threads: 8\n"
        "    shell: 'echo $OMP_NUM_THREADS $MKL_NUM_THREADS $OPENBLAS_NUM_THREADS > {output}'\n")
    run = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "3", "--quiet"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "two.txt").read_text().split() == ["2", "2", "2"]
    assert (tmp_path / "eight.txt").read_text().split() == ["3", "3", "3"]
    rules = "\n".join(p.read_text() for p in (ROOT / "workflow" / "rules").glob("*.smk"))
    assert "NUM_THREADS" not in rules


def test_more_pairs_limits_the_merges_and_paths_of_the_pairs_after_the_first():
    settings = profile("paper")
    settings["vision"]["more_pairs"] = {"matchings": ["none", "full_symmetry"], "fusion_methods": ["regmean", "simple"]}
    vision = T.tracks(settings)["vision"]
    spec = {"matchings": ["none", "rotation", "full_symmetry"]}
    first, second, third = vision.pairs
    assert T.pair_matchings(vision, spec, "merged_evals") == [
        (first, "none"), (first, "rotation"), (first, "full_symmetry"), (second, "none"), (second, "full_symmetry"),
        (third, "none"), (third, "full_symmetry")]
    assert T.pair_matchings(vision, spec, "barriers") == T.pair_matchings(vision, spec, "merged_evals")
    assert len(T.pair_matchings(vision, spec, "matched")) == 9                  # matching itself: every pair
    assert T.pair_methods(vision, first) == vision.methods
    assert T.pair_methods(vision, second) == ("simple", "regmean")              # the track's order
    unlimited = T.tracks(profile("paper"))["vision"]
    assert len(T.pair_matchings(unlimited, spec, "merged_evals")) == 9
    assert T.pair_methods(unlimited, second) == unlimited.methods
