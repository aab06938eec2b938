"""What SLURM made of each job of a Snakemake run, against what Snakemake asked for (scripts/check_slurm.sh).

    python scripts/check_slurm_jobs.py SNAKEMAKE_LOG SCONTROL_OUTPUT CPU_PARTITION GPU_PARTITION [PROFILE SECONDS]
                                       [--rules RULE,RULE,...]

SNAKEMAKE_LOG is the log of a run with the slurm executor: each job's block ("rule NAME:", "jobid: N",
"resources: ..., gpu=1") and the plugin's "SLURM run ID: X" and "Job N has been submitted with SLURM jobid M"
lines. SCONTROL_OUTPUT is `scontrol show job -d -o` taken after the run (one job per line; the run's jobs
are those named X). A job whose resources ask for a GPU (gpu=N > 0, or a gres with gpu) must have requested
one from SLURM (TresPerJob/TresPerNode/TresPerTask gres:gpu), been allocated one (JOB_GRES) and run in
GPU_PARTITION; every other job none of these and CPU_PARTITION. Its SLURM comment must name its rule. The
run must have jobs of both kinds, and with --rules at least one job of every rule named there (a run of a slice
of a DAG must still take every rule through SLURM). Prints one line per rule and the totals; exit 1 with
`error:` lines.
"""
from __future__ import annotations

import collections
import re
import sys

TRES_PER = ("TresPerJob", "TresPerNode", "TresPerTask")


def snakemake_jobs(log: str) -> dict[str, tuple[str, str | None]]:
    """Snakemake job id -> (rule, its resources line) from the job blocks of a log."""
    jobs, rule, jobid, resources = {}, None, None, None
    for line in log.splitlines() + [""]:
        start = re.match(r"^(?:local)?rule (\w+):$", line)
        if start:
            rule, jobid, resources = start.group(1), None, None
        elif rule and line.startswith("    "):
            key, _, value = line.strip().partition(": ")
            if key == "jobid":
                jobid = value
            elif key == "resources":
                resources = value
        elif rule:
            if jobid is not None:
                jobs[jobid] = (rule, resources)
            rule = None
    return jobs


def field(record: str, key: str) -> str:
    found = re.search(rf"(?:^|\s){key}=(\S*)", record)
    return found.group(1) if found else ""


def asks_for_gpu(resources: str) -> bool:
    gpu = re.search(r"(?:^|, )gpu=(\d+)", resources)
    gres = re.search(r"(?:^|, )gres=([^,]*)", resources)
    return bool(gpu and int(gpu.group(1)) > 0) or bool(gres and "gpu" in gres.group(1))


def check(log: str, scontrol: str, cpu_partition: str, gpu_partition: str, rules: tuple[str, ...] = ()):
    """(rows, number of jobs, number of GPU jobs, problems); rows: (rule, gpu, partition, request, allocation) -> jobs.
    `rules`: the rules of which the run must have submitted at least one job."""
    run_id = re.search(r"SLURM run ID: (\S+)", log)
    if not run_id:
        return {}, 0, 0, ["no 'SLURM run ID' in the snakemake log: did the slurm executor run?"]
    run_id = run_id.group(1)
    submitted = re.findall(r"Job (\d+) has been submitted with SLURM jobid (\d+)", log)
    if not submitted:
        return {}, 0, 0, ["the snakemake log names no job submitted to SLURM"]
    jobs = snakemake_jobs(log)
    records = {field(line, "JobId"): line for line in scontrol.splitlines()
               if line.startswith("JobId=") and field(line, "JobName") == run_id}

    problems, rows = [], collections.Counter()
    gpu_jobs = cpu_jobs = 0
    for snakemake_id, slurm_id in submitted:
        rule, resources = jobs.get(snakemake_id, (None, None))
        if rule is None or resources is None:
            problems.append(f"job {snakemake_id} (SLURM {slurm_id}): no rule and resources for it in the snakemake log")
            continue
        record = records.get(slurm_id)
        if record is None:
            problems.append(f"{rule} (SLURM {slurm_id}): unknown to scontrol (gone after MinJobAge?)")
            continue
        wants_gpu = asks_for_gpu(resources)
        requested = " ".join(f"{key}={field(record, key)}" for key in TRES_PER if "gpu" in field(record, key))
        allocation = field(record, "JOB_GRES")
        allocated = "gpu" in allocation
        partition = field(record, "Partition")
        comment = field(record, "Comment")
        where = f"{rule} (SLURM {slurm_id})"
        if comment != f"rule_{rule}" and not comment.startswith(f"rule_{rule}_wildcards_"):
            problems.append(f"{where}: its SLURM comment is '{comment}', not this rule's")
        if wants_gpu:
            gpu_jobs += 1
            if not requested:
                problems.append(f"{where} declares a GPU, but its SLURM job requested none (no gres:gpu in TresPer*)")
            if not allocated:
                problems.append(f"{where} declares a GPU, but SLURM allocated none (JOB_GRES='{allocation}')")
            if partition != gpu_partition:
                problems.append(f"{where} declares a GPU but ran in partition '{partition}', not '{gpu_partition}': "
                                f"give it `slurm_partition: ?repr(gpu_partition)` in workflow/profiles/slurm/config.yaml")
        else:
            cpu_jobs += 1
            if requested or allocated:
                problems.append(f"{where} declares no GPU, but SLURM gave it one ({requested} JOB_GRES='{allocation}')")
            if partition != cpu_partition:
                problems.append(f"{where} declares no GPU but ran in partition '{partition}', not '{cpu_partition}'")
        rows[(rule, "yes" if wants_gpu else "no", partition, requested or "-",
              f"JOB_GRES={allocation}" if allocated else "-")] += 1
    if not gpu_jobs or not cpu_jobs:
        problems.append(f"the run has {gpu_jobs} GPU and {cpu_jobs} CPU jobs: the check needs both to mean anything")
    missing = sorted(set(rules) - {row[0] for row in rows})
    if missing:
        problems.append(f"no job of the rule(s) {', '.join(missing)} went through SLURM: add a target that needs one")
    return rows, len(submitted), gpu_jobs, problems


def main(argv: list[str]) -> int:
    rules: tuple[str, ...] = ()
    if len(argv) >= 2 and argv[-2] == "--rules":
        rules, argv = tuple(rule for rule in argv[-1].split(",") if rule), argv[:-2]
    if len(argv) not in (4, 6):
        print("usage: " + " ".join(__doc__.strip().splitlines()[2].split()) + " [--rules RULE,RULE,...]", file=sys.stderr)
        return 2
    log_path, scontrol_path, cpu_partition, gpu_partition = argv[:4]
    with open(log_path) as handle, open(scontrol_path) as other:
        rows, total, gpu_jobs, problems = check(handle.read(), other.read(), cpu_partition, gpu_partition, rules)
    if rows:
        print(f"{'rule':<24} {'jobs':>4}  {'gpu':<3} {'partition':<10} {'request (scontrol)':<22} allocation")
        for (rule, gpu, partition, requested, allocated), count in sorted(rows.items(),
                                                                           key=lambda item: (item[0][1] != "yes", item[0][0])):
            print(f"{rule:<24} {count:>4}  {gpu:<3} {partition:<10} {requested:<22} {allocated}")
    if len(argv) == 6:
        profile, seconds = argv[4], int(argv[5])
        print(f"SLURM run of '{profile}': {total} jobs ({gpu_jobs} with a GPU) in {seconds // 60} min {seconds % 60} s")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
