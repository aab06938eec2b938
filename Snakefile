"""symfusion pipeline: train end models, match, merge, evaluate, interpolate, report.

    snakemake --cores 2                           # default profile: mini (offline, laptop)
    snakemake --cores 2 --config profile=smoke    # tiny, every rule (CI)
    snakemake --workflow-profile workflow/profiles/slurm --config profile=paper
    snakemake --cores 2 results/mini/table2.csv   # one table, and only what it needs
"""
import yaml


configfile: "conf/pipeline.yaml"


report: "workflow/report/workflow.rst"


PROFILE = config["profile"]
with open(f"conf/profile/{PROFILE}.yaml") as handle:
    SETTINGS = yaml.safe_load(handle)
RESULTS = f"{config['results_dir']}/{PROFILE}"
FIGURES = f"{config['figures_dir']}/{PROFILE}"
LOGS = f"{RESULTS}/logs"
BENCH = f"{RESULTS}/benchmarks"
ENV = "../../environment.yml"  # conda: paths are relative to the rule files in workflow/rules/

if SETTINGS.get("hub_offline", True):
    shell.prefix("export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1; ")

wildcard_constraints:
    task="[a-z0-9_]+",
    source="[A-Za-z0-9_]+",
    anchor="[A-Za-z0-9_]+",
    matching="[a-z_]+",
    method="[a-z_]+",
    lmodel="[a-z0-9_]+",
    dataset="[a-z0-9_]+",


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/match.smk"
include: "workflow/rules/merge.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/barrier.smk"
include: "workflow/rules/language.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        f"{RESULTS}/report.md",
    default_target: True
