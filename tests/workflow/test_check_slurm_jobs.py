"""scripts/check_slurm_jobs.py: the SLURM run's GPU check fails whenever SLURM did not get what Snakemake asked for."""
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_slurm_jobs.py"
spec = importlib.util.spec_from_file_location("check_slurm_jobs", SCRIPT)
check_slurm_jobs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_slurm_jobs)

# Shapes as Snakemake 9 + snakemake-executor-plugin-slurm 2.8 write them, and `scontrol show job -d -o` (SLURM 22.05).
LOG = """SLURM run ID: 3b0c6a1e-run
[Mon Nov 23 18:46:20 2026]
rule train:
    output: results/smoke/models/digits/seed0
    jobid: 7
    wildcards: task=digits, seed=0
    threads: 1
    resources: tmpdir=<TBD>, mem_mb=11028, mem=11.03 GB, slurm_partition=debug_gpu, runtime=720, gpu=1
Job 7 has been submitted with SLURM jobid 21 (log: ci_slurm/slurm_logs/rule_train/digits_0/21.log).
[Mon Nov 23 18:46:21 2026]
rule data:
    output: results/smoke/data/rt_d0.json
    jobid: 40
    wildcards: task=rt_d0
    resources: tmpdir=<TBD>, mem_mb=11028, mem=11.03 GB, slurm_partition=debug, runtime=60

Job 40 has been submitted with SLURM jobid 22 (log: ci_slurm/slurm_logs/rule_data/rt_d0/22.log).
"""
GPU_JOB = ("JobId=21 JobName=3b0c6a1e-run UserId=root(0) JobState=COMPLETED Partition=debug_gpu NumCPUs=1 "
           "TRES=cpu=1,mem=11028M,node=1,billing=1 JOB_GRES=gpu:1   Nodes=vm CPU_IDs=0 Mem=11028 GRES= "
           "WorkDir=/repo Comment=rule_train_wildcards_digits_0  StdErr=/x Power= TresPerJob=gres:gpu:1 ")
CPU_JOB = ("JobId=22 JobName=3b0c6a1e-run UserId=root(0) JobState=COMPLETED Partition=debug NumCPUs=1 "
           "TRES=cpu=1,mem=11028M,node=1,billing=1 JOB_GRES=(null)   Nodes=vm CPU_IDs=1 Mem=11028 GRES= "
           "WorkDir=/repo Comment=rule_data_wildcards_rt_d0  StdErr=/x Power= ")
OTHER_RUN = "JobId=5 JobName=wrap Partition=debug Comment=rule_x TresPerJob=gres:gpu:1 JOB_GRES=gpu:1"


def run(log=LOG, jobs=(GPU_JOB, CPU_JOB, OTHER_RUN)):
    rows, total, gpu_jobs, problems = check_slurm_jobs.check(log, "\n".join(jobs) + "\n", "debug", "debug_gpu")
    return total, gpu_jobs, problems


def test_a_run_as_asked_passes():
    total, gpu_jobs, problems = run()
    assert (total, gpu_jobs, problems) == (2, 1, [])


@pytest.mark.parametrize("broken, words", [
    (GPU_JOB.replace("TresPerJob=gres:gpu:1", ""), "requested none"),
    (GPU_JOB.replace("JOB_GRES=gpu:1", "JOB_GRES=(null)"), "allocated none"),
    (GPU_JOB.replace("Partition=debug_gpu", "Partition=debug"), "ran in partition 'debug'"),
    (GPU_JOB.replace("Comment=rule_train_wildcards", "Comment=rule_finetune_wildcards"), "not this rule's"),
])
def test_a_gpu_job_without_its_gpu_fails(broken, words):
    _, _, problems = run(jobs=(broken, CPU_JOB))
    assert len(problems) == 1 and words in problems[0], problems


def test_a_cpu_job_given_a_gpu_fails():
    broken = CPU_JOB.replace("Power= ", "Power= TresPerNode=gres:gpu:1 ").replace("JOB_GRES=(null)", "JOB_GRES=gpu:1")
    _, _, problems = run(jobs=(GPU_JOB, broken))
    assert len(problems) == 1 and "declares no GPU, but SLURM gave it one" in problems[0]


def test_a_job_scontrol_no_longer_knows_fails():
    _, _, problems = run(jobs=(GPU_JOB,))
    assert any("unknown to scontrol" in p for p in problems)


def test_a_run_without_gpu_jobs_proves_nothing():
    log = LOG.replace(", gpu=1", "")
    _, _, problems = run(log=log, jobs=(GPU_JOB, CPU_JOB))
    assert any("0 GPU and 2 CPU jobs" in p for p in problems)


def test_a_log_of_another_executor_fails():
    _, _, problems = run(log=LOG.replace("SLURM run ID", "run"))
    assert problems and "SLURM run ID" in problems[0]


def test_gres_resource_counts_as_a_gpu():
    assert check_slurm_jobs.asks_for_gpu("tmpdir=<TBD>, gres=gpu:a100:1, runtime=5")
    assert not check_slurm_jobs.asks_for_gpu("tmpdir=<TBD>, gpu=0, runtime=5")
    assert not check_slurm_jobs.asks_for_gpu("tmpdir=<TBD>, cpus_per_gpu=4")


def test_a_slice_must_take_every_named_rule_through_slurm():
    """A run of a slice of the DAG (CI: the rehearsal's slice) passes only when every required rule had a job."""
    rows, _, _, problems = check_slurm_jobs.check(LOG, "\n".join((GPU_JOB, CPU_JOB)) + "\n", "debug", "debug_gpu",
                                                  rules=("train", "data"))
    assert problems == [] and {row[0] for row in rows} == {"train", "data"}
    _, _, _, problems = check_slurm_jobs.check(LOG, "\n".join((GPU_JOB, CPU_JOB)) + "\n", "debug", "debug_gpu",
                                               rules=("train", "data", "barrier", "match"))
    assert problems == ["no job of the rule(s) barrier, match went through SLURM: add a target that needs one"]


def test_the_command_line_takes_the_rules(tmp_path, capsys):
    log, scontrol = tmp_path / "snakemake.log", tmp_path / "scontrol.txt"
    log.write_text(LOG)
    scontrol.write_text("\n".join((GPU_JOB, CPU_JOB)) + "\n")
    args = [str(log), str(scontrol), "debug", "debug_gpu", "slice", "61"]
    assert check_slurm_jobs.main(args + ["--rules", "train,data"]) == 0
    assert "SLURM run of 'slice': 2 jobs (1 with a GPU) in 1 min 1 s" in capsys.readouterr().out
    assert check_slurm_jobs.main(args + ["--rules", "train,report"]) == 1
    assert "error: no job of the rule(s) report went through SLURM" in capsys.readouterr().err
    assert check_slurm_jobs.main(args[:3]) == 2
