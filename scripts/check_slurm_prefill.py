"""Pre-fill a SLURM slice's results with a local run's outputs of its upstream jobs (scripts/check_slurm.sh --prefill).

    python scripts/check_slurm_prefill.py DRY_RUN_LOG RUN_RESULTS RUN_FIGURES REFERENCE REFERENCE_FIGURES
                                          RULE,RULE,... [TARGET_FILE ...]

DRY_RUN_LOG is `snakemake -n` of the slice into the empty RUN_RESULTS and RUN_FIGURES (each job's block: "rule
NAME:", "input: ...", "output: ...", "jobid: N", "benchmark: ..."). The jobs kept to run through SLURM are the
targets' jobs and, for every RULE the slice must still take through SLURM, one of its jobs chosen greedily by
cost (the local run's benchmark seconds plus the ~20 s a SLURM job pays to start), with everything Snakemake
then reruns too: every job downstream of a kept one (its input is updated) and the producer of a kept job's
input that the local run no longer holds (a temp() file). Every other job's outputs are copied (never moved)
from REFERENCE / REFERENCE_FIGURES with their modification times, so Snakemake's mtime trigger finds them up to
date (copies carry no .snakemake metadata, so its code, params, input and software-env triggers have no record
to compare and do not fire). Writes only into RUN_RESULTS and RUN_FIGURES, which must not exist yet. Prints the
jobs kept per rule; exit 1 with an `error:` line.
"""
from __future__ import annotations

import collections
import csv
import os
import re
import shutil
import sys

START_SECONDS = 20.0          # what a SLURM job pays beyond its work on this test cluster: Python and Snakemake start


def dry_run_jobs(log: str) -> dict[str, dict]:
    """Snakemake job id -> {rule, input, output, benchmark} from the job blocks of a dry run."""
    jobs, job = {}, None
    for line in log.splitlines() + [""]:
        start = re.match(r"^(?:local)?rule (\w+):$", line)
        if start:
            job = {"rule": start.group(1), "input": [], "output": [], "benchmark": None, "jobid": None}
        elif job and line.startswith("    "):
            key, _, value = line.strip().partition(": ")
            if key in ("input", "output"):
                job[key] = [path.strip() for path in value.split(", ") if path.strip()]
            elif key in ("jobid", "benchmark"):
                job[key] = value.strip()
        elif job:
            if job["jobid"] is not None:
                jobs[job["jobid"]] = job
            job = None
    return jobs


def local_path(path: str, folders: list[tuple[str, str]]) -> str:
    """The local run's file of the SLURM run's `path`."""
    for run, reference in folders:
        if path == run or path.startswith(run + "/"):
            return reference + path[len(run):]
    sys.exit(f"error: {path} is in neither of the SLURM run's folders ({', '.join(run for run, _ in folders)})")


def seconds(job: dict, folders: list[tuple[str, str]]) -> float:
    """The job's cost through SLURM: its local run's benchmark seconds plus the start."""
    try:
        with open(local_path(job["benchmark"], folders)) as handle:
            return START_SECONDS + float(next(csv.DictReader(handle, delimiter="\t"))["s"])
    except (TypeError, OSError, StopIteration, KeyError, ValueError):
        return START_SECONDS + 60.0


def kept(jobs: dict[str, dict], seeds: set[str], held: set[str]) -> set[str]:
    """The jobs Snakemake runs when the seeds' outputs are missing and the local run's `held` paths are copied."""
    producer = {path: jobid for jobid, job in jobs.items() for path in job["output"]}
    consumers = collections.defaultdict(set)
    for jobid, job in jobs.items():
        for path in job["input"]:
            if path in producer:
                consumers[producer[path]].add(jobid)
    run, todo = set(seeds), list(seeds)
    while todo:
        jobid = todo.pop()
        upstream = {producer[p] for p in jobs[jobid]["input"] if p in producer and p not in held}
        for other in consumers[jobid] | upstream:
            if other not in run:
                run.add(other)
                todo.append(other)
    return run


def choose(jobs: dict[str, dict], rules: list[str], targets: set[str], held: set[str], cost: dict[str, float]):
    """The jobs to run: the targets' and, greedily by cost per newly covered rule, one job of each rule."""
    run = kept(jobs, {j for j, job in jobs.items() if set(job["output"]) & targets}, held)
    while missing := set(rules) - {jobs[j]["rule"] for j in run}:
        def price(jobid):
            more = kept(jobs, run | {jobid}, held)
            covered = len(missing & {jobs[j]["rule"] for j in more})
            return sum(cost[j] for j in more - run) / covered, int(jobid)
        candidates = [jobid for jobid, job in jobs.items() if job["rule"] in missing]
        if not candidates:
            sys.exit(f"error: the slice has no job of rule(s) {', '.join(sorted(missing))}: add a target that needs one")
        run = kept(jobs, run | {min(candidates, key=price)}, held)
    return run


def copy(source: str, destination: str):
    """A copy with modification times (shutil.copy2; a directory output with its .snakemake_timestamp)."""
    if os.path.lexists(destination):
        sys.exit(f"error: {destination} exists already: the pre-fill writes only into a fresh run folder")
    os.makedirs(os.path.dirname(destination), exist_ok=True)
    if os.path.isdir(source):
        shutil.copytree(source, destination, copy_function=shutil.copy2, symlinks=True)
    else:
        shutil.copy2(source, destination, follow_symlinks=False)


def main(argv: list[str]) -> int:
    dry_run, results, figures, reference, reference_figures, rules, *targets = argv
    folders = [(results.rstrip("/"), reference.rstrip("/")), (figures.rstrip("/"), reference_figures.rstrip("/"))]
    for run, _ in folders:
        if os.path.lexists(run):
            sys.exit(f"error: {run} exists: the pre-fill writes only into a fresh run folder")
    with open(dry_run) as handle:
        jobs = dry_run_jobs(handle.read())
    if not jobs:
        sys.exit(f"error: {dry_run} lists no jobs")
    paths = {path for job in jobs.values() for path in job["output"]}
    held = {path for path in paths if os.path.exists(local_path(path, folders))}
    cost = {jobid: seconds(job, folders) for jobid, job in jobs.items()}
    run = choose(jobs, [rule for rule in rules.split(",") if rule], set(targets), held, cost)
    copied = 0
    for jobid, job in jobs.items():
        if jobid not in run:
            for path in job["output"]:
                if path in held:
                    copy(local_path(path, folders), path)
                    copied += 1
    counts = collections.Counter(jobs[j]["rule"] for j in run)
    print(f"check_slurm: pre-filled {copied} outputs of {len(jobs) - len(run)} of the slice's {len(jobs)} jobs "
          f"from {reference} (copies with their times); {len(run)} jobs to run through SLURM, "
          f"~{sum(cost[j] for j in run):.0f} s of work: "
          + ", ".join(f"{rule} {n}" for rule, n in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
