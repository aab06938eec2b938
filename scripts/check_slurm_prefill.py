"""Pre-fill a SLURM slice's results with a local run's outputs of its upstream jobs (scripts/check_slurm.sh --prefill).

    python scripts/check_slurm_prefill.py [--choose TARGETS_OUT] DRY_RUN_LOG RUN_RESULTS RUN_FIGURES REFERENCE
                                          REFERENCE_FIGURES RULE,RULE,... [TARGET_FILE ...]

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

--choose (no TARGET_FILE; DRY_RUN_LOG is then of the whole DAG): the targets are chosen, one job of every RULE by
the same cost, and their outputs written to TARGETS_OUT, one a line; only the chosen jobs' DAG counts (a job no
chosen job needs is not in the slice) and gets copies.
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
    if job["benchmark"] is None:                # `all`, `report`: no benchmark
        return START_SECONDS + 60.0
    try:
        with open(local_path(job["benchmark"], folders)) as handle:
            return START_SECONDS + float(next(csv.DictReader(handle, delimiter="\t"))["s"])
    except (TypeError, OSError, StopIteration, KeyError, ValueError):
        return START_SECONDS + 60.0


def ancestors(jobs: dict[str, dict], seeds: set[str]) -> set[str]:
    """The seeds and every job they need: the DAG Snakemake builds for the seeds' outputs as targets."""
    producer = {path: jobid for jobid, job in jobs.items() for path in job["output"]}
    dag, todo = set(seeds), list(seeds)
    while todo:
        for path in jobs[todo.pop()]["input"]:
            if path in producer and producer[path] not in dag:
                dag.add(producer[path])
                todo.append(producer[path])
    return dag


def kept(jobs: dict[str, dict], seeds: set[str], held: set[str]) -> set[str]:
    """The jobs Snakemake runs for the seeds' outputs as targets when these are missing and the local run's `held`
    paths are copied: the seeds, every job of their DAG downstream of a kept one (its input is updated) and the
    producer of a kept job's input that the local run no longer holds (a temp() file)."""
    dag = ancestors(jobs, seeds)
    producer = {path: jobid for jobid in dag for path in jobs[jobid]["output"]}
    consumers = collections.defaultdict(set)
    for jobid in dag:
        for path in jobs[jobid]["input"]:
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
    """The jobs to run and each rule's chosen job: the targets' jobs and, greedily by cost per newly covered rule,
    one job of each rule (a rule the kept jobs cover already: its cheapest kept job)."""
    seeds = {j for j, job in jobs.items() if set(job["output"]) & targets}
    run, chosen = kept(jobs, seeds, held), {}
    while missing := set(rules) - {jobs[j]["rule"] for j in run}:
        def price(jobid):
            more = kept(jobs, seeds | {jobid}, held)
            covered = len(missing & {jobs[j]["rule"] for j in more})
            return sum(cost[j] for j in more - run) / covered, int(jobid)
        candidates = [jobid for jobid, job in jobs.items() if job["rule"] in missing]
        if not candidates:
            sys.exit(f"error: the slice has no job of rule(s) {', '.join(sorted(missing))}: add a target that needs one")
        best = min(candidates, key=price)
        chosen[jobs[best]["rule"]] = best
        seeds.add(best)
        run = kept(jobs, seeds, held)
    for rule in rules:
        if rule not in chosen:
            chosen[rule] = min((j for j in run if jobs[j]["rule"] == rule), key=lambda j: (cost[j], int(j)))
    return run, chosen


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
    chosen_file = None
    if argv[:1] == ["--choose"]:
        chosen_file, argv = argv[1], argv[2:]
    dry_run, results, figures, reference, reference_figures, rules, *targets = argv
    if chosen_file and targets:
        sys.exit("error: --choose picks the targets itself: give no TARGET_FILE with it")
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
    run, chosen = choose(jobs, [rule for rule in rules.split(",") if rule], set(targets), held, cost)
    dag, copied = ancestors(jobs, run), 0          # the DAG of the targets, given or chosen
    for jobid in sorted(dag - run, key=int):
        for path in jobs[jobid]["output"]:
            if path in held:
                copy(local_path(path, folders), path)
                copied += 1
    counts = collections.Counter(jobs[j]["rule"] for j in run)
    print(f"check_slurm: pre-filled {copied} outputs of {len(dag - run)} of the slice's {len(dag)} jobs "
          f"from {reference} (copies with their times); {len(run)} jobs to run through SLURM, "
          f"~{sum(cost[j] for j in run):.0f} s of work: "
          + ", ".join(f"{rule} {n}" for rule, n in sorted(counts.items())))
    if chosen_file:
        made = {path for j in run for path in jobs[j]["output"]}
        with open(chosen_file, "w") as handle:
            for rule, jobid in sorted(chosen.items()):
                handle.write("".join(f"{path}\n" for path in jobs[jobid]["output"]))
                fresh = [p for p in jobs[jobid]["input"] if p in made]
                print(f"check_slurm: chose {rule} job {jobid} (~{cost[jobid]:.0f} s): {', '.join(jobs[jobid]['output'])}"
                      f" ({len(fresh)} of its {len(jobs[jobid]['input'])} inputs recomputed by the slice)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
