"""The workflow: profiles validated against their schema, and the rehearsal running exactly the paper's DAG."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from symfusion.errors import SymfusionError
from symfusion.fusion import fusion_method
from symfusion.matching import matching_config
from symfusion.pipeline import warm
from symfusion.pipeline.report.registry import experiment, experiments

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "workflow" / "schemas" / "profile.schema.yaml"
PROFILES = sorted((ROOT / "conf" / "profile").glob("*.yaml"))


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_every_profile_follows_the_schema(path):
    validate(yaml.safe_load(path.read_text()), str(SCHEMA))


@pytest.mark.parametrize("alpha", [-0.1, 0.0, 0.5, 1.0, 1.5])
def test_the_profile_schema_takes_the_regmean_alphas_that_regmean_declares(alpha):
    """The schema refuses a bad language.regmean_alpha when the workflow is read (before any fine-tuning); the one
    definition of a valid alpha is RegMean's Option (fusion/regmean.py): the schema must agree with it."""
    settings = yaml.safe_load((ROOT / "conf" / "profile" / "mini.yaml").read_text())
    settings["language"]["regmean_alpha"] = {"default": alpha}
    try:
        fusion_method("regmean").check_values({"alpha": alpha})
        declared = True
    except SymfusionError:
        declared = False
    try:
        validate(settings, str(SCHEMA))
        schema = True
    except Exception:       # noqa: BLE001 - snakemake's WorkflowError for a schema violation
        schema = False
    assert schema == declared


@pytest.mark.parametrize("section,key", [(None, "visoin"), ("vision", "fusion_method"), ("language", "regmean_alfa")])
def test_a_misspelt_key_fails_naming_it(section, key):
    settings = yaml.safe_load((ROOT / "conf" / "profile" / "mini.yaml").read_text())
    (settings if section is None else settings[section])[key] = 1
    with pytest.raises(Exception, match=key):
        validate(settings, str(SCHEMA))


def job_counts(profile: str) -> dict[str, int]:
    """Rule -> number of jobs of a dry run of the whole workflow for a profile (from scratch)."""
    result = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--config", f"profile={profile}",
                             "results_dir=/nonexistent/results", "figures_dir=/nonexistent/figures"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    table = result.stdout[result.stdout.index("Job stats"):]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m.group(1) != "total"}


@pytest.mark.slow
def test_the_rehearsal_runs_exactly_the_papers_rules_and_jobs():
    paper, rehearsal = job_counts("paper"), job_counts("rehearsal")
    assert paper == rehearsal
    merged = {m for e in experiments().values() for k, spec in e.inputs.get("vision", {}).items()
              if k == "merged_evals" for m in spec.get("matchings", [])}
    assert paper["train"] == 3 + 2 * 12 + 3 and paper["merge_evaluate"] == 3 * len(merged)  # 3 ViT seeds: 3 pairs
    decoder = {m for e in experiments().values() for k, spec in e.inputs.get("decoder", {}).items()
               if k == "merged_evals" for m in spec.get("matchings", [])}
    assert paper["decoder_merge"] == 3 * len(decoder)                                   # 3 decoder seeds: 3 pairs


def test_every_rule_that_declares_a_gpu_gets_the_gpu_partition_on_slurm():
    """scripts/check_slurm.sh finds a GPU rule missing from the SLURM profile only after the whole run: here, at once."""
    rules_text = "\n".join(p.read_text() for p in sorted((ROOT / "workflow" / "rules").glob("*.smk")))
    blocks = re.split(r"^rule (\w+):\n", rules_text, flags=re.M)[1:]
    gpu_rules = {name for name, body in zip(blocks[::2], blocks[1::2]) if re.search(r"^\s+gpu=1,?$", body, re.M)}
    gpu_rules |= {new for old, new in re.findall(r"^use rule (\w+) as (\w+) with:", rules_text, re.M)
                  if old in gpu_rules}                                    # a rule made from another keeps its resources
    assert {"train", "merge_evaluate", "lang_merge_pair", "decoder_merge", "statistics", "barrier"} <= gpu_rules
    profile = yaml.safe_load((ROOT / "workflow" / "profiles" / "slurm" / "config.yaml").read_text())
    resources = profile["set-resources"]
    missing = sorted(r for r in gpu_rules if resources.get(r, {}).get("slurm_partition") != "?repr(gpu_partition)")
    assert not missing, f"rules with gpu=1 but not the GPU partition in workflow/profiles/slurm/config.yaml: {missing}"


@pytest.mark.slow
def test_statistics_are_shared_exactly_by_the_models_several_merges_fuse_unmoved():
    """mini: each ViT is fused unmoved by several merges (seed0 anchors two pairs under every matching, seed1 anchors
    one and is the unmatched source of another, seed2 the unmatched source of two); each text model anchors a pair, or
    is the source of two unmatched pair merges (rt_d2), or is fused unmoved by the unmatched NER group merge besides
    its pair's (ner_headlines); the decoders as the ViTs: 3 + 6 + 3 files."""
    counts = job_counts("mini")
    assert counts["statistics"] == 3 + 6 + 3
    assert counts["statistics"] < counts["train"]


@pytest.mark.slow
def test_the_pairs_after_the_first_get_the_merges_and_paths_more_pairs_names():
    """mini: the first ViT or decoder pair is merged and interpolated under every matching by every method, the others
    under more_pairs' matchings by its methods, and matched by those and Figure 4's (distances)."""
    settings = yaml.safe_load((ROOT / "conf" / "profile" / "mini.yaml").read_text())
    result = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--config", "profile=mini",
                             "results_dir=/nx/results", "figures_dir=/nx/figures"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    outputs = set(re.findall(r"^\s+output: (.*)$", result.stdout, re.M))
    files = {f for line in outputs for f in line.split(", ")}
    for track, section in (("vision/fashion_mnist", settings["vision"]), ("decoder/lm_english", settings["decoder"])):
        more = section["more_pairs"]
        methods = more.get("fusion_methods", section["fusion_methods"])
        merged = {tuple(f.split("/")[-3:]) for f in files if f"/{track}/eval/" in f and "/end/" not in f
                  and "/mergekit/" not in f}
        paths = {tuple(f[:-5].split("/")[-2:]) for f in files if f"/{track}/barrier/" in f}
        matched = {tuple(f.split("/")[-2:]) for f in files if f"/{track}/matched/" in f}
        first = "seed1-onto-seed0"
        for pair in ("seed2-onto-seed0", "seed2-onto-seed1"):
            assert {m for p, m, _ in merged if p == pair} == set(more["matchings"])
            assert {f[:-5] for p, _, f in merged if p == pair} == set(methods)
            assert {m for p, m in paths if p == pair} == set(more["matchings"])
            distances = set(experiment("fig4_distance").matchings("matched")) if track.startswith("vision") else set()
            assert {m for p, m in matched if p == pair} == (distances | set(more["matchings"])) - {"none"} | (
                {"none"} & distances)
        assert {f[:-5] for p, _, f in merged if p == first} == set(section["fusion_methods"])
        assert {m for p, m, _ in merged if p == first} > set(more["matchings"])


def test_the_workflow_names_the_worker_socket_variable_the_worker_reads():
    """worker.smk cannot import symfusion (the Snakefile runs where the package may be absent): its copy of
    the variable's name must be warm.py's."""
    text = (ROOT / "workflow" / "rules" / "worker.smk").read_text()
    assert re.search(r'^WORKER_VARIABLE = "(\w+)"', text, re.M).group(1) == warm.VARIABLE


@pytest.mark.slow
def test_a_match_job_gets_data_exactly_when_its_matching_reads_data():
    """The workflow asks the library's catalogue (presets/catalog.py, loaded by its path: it runs where symfusion may
    not be installed) which match jobs get a data_task: its choice must be MatchConfig.needs_data's."""
    result = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "--config", "profile=mini",
                             "results_dir=/nonexistent/results", "figures_dir=/nonexistent/figures"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    commands = re.findall(r"symfusion-match .*?matching=(\w+) data_task=(\S+)", result.stdout)
    assert {m for m, _ in commands} >= {"rotation", "full_symmetry", "full_symmetry_learned"}
    for matching, task in commands:
        assert (task != "null") == matching_config(matching).needs_data, (matching, task)
