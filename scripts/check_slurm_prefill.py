"""Pre-fill a SLURM slice's results with a local run's outputs of its upstream jobs (scripts/check_slurm.sh --prefill).

    python scripts/check_slurm_prefill.py [--choose TARGETS_OUT] DRY_RUN_LOG RUN_RESULTS RUN_FIGURES REFERENCE
                                          REFERENCE_FIGURES RULE,RULE,... [TARGET_FILE ...]

DRY_RUN_LOG is `snakemake -n` of the slice into the empty RUN_RESULTS and RUN_FIGURES (each job's block: "rule
NAME:", "input: ...", "output: ...", "jobid: N", "benchmark: ..."). The jobs kept to run through SLURM are the
targets' jobs and, for every RULE the slice must still take through SLURM, one of its jobs, chosen so that the
whole slice costs least as far as a greedy choice improved rule by rule finds (`choose`; cost: the local run's
benchmark seconds plus the ~20 s a SLURM job pays to start), with everything Snakemake then reruns too: every job downstream of a kept one (its input is updated) and the producer of a kept job's
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


def depth(jobs: dict[str, dict]) -> dict[str, int]:
    """Each job's depth: the most jobs on a path from a job with no producer among the jobs to it (data 0, train 1)."""
    producer = {path: jobid for jobid, job in jobs.items() for path in job["output"]}
    depths: dict[str, int] = {}

    def of(jobid: str) -> int:
        if jobid not in depths:
            depths[jobid] = 0            # a cycle cannot occur in a DAG; this guards the recursion all the same
            depths[jobid] = 1 + max((of(producer[p]) for p in jobs[jobid]["input"] if p in producer), default=-1)
        return depths[jobid]
    for jobid in jobs:
        of(jobid)
    return depths


def completed(jobs: dict[str, dict], rules: list[str], seeds: set[str], picks: dict[str, str], held: set[str],
              cost: dict[str, float], rule_depth: dict[str, int] | None) -> dict[str, str]:
    """`picks` (rule -> job) with a job added for every rule the slice (the seeds' and the picks' kept jobs) does not
    cover yet, greedily: by cost per newly covered rule, or (given rule_depth) the deepest missing rule first (tables
    before merges before train before data), each by the cost it adds. Deepest first, an upstream job is priced with
    what it drags of the downstream picks' DAGs, so the data or train job is chosen whose descendants they read least."""
    picks = dict(picks)
    run = kept(jobs, seeds | set(picks.values()), held)
    while missing := set(rules) - {jobs[j]["rule"] for j in run}:
        if rule_depth is not None:
            missing = {max(missing, key=lambda rule: (rule_depth[rule], rule))}

        def price(jobid):
            more = kept(jobs, seeds | set(picks.values()) | {jobid}, held)
            covered = len(missing & {jobs[j]["rule"] for j in more})
            return sum(cost[j] for j in more - run) / covered, int(jobid)
        candidates = [jobid for jobid, job in jobs.items() if job["rule"] in missing]
        if not candidates:
            sys.exit(f"error: the slice has no job of rule(s) {', '.join(sorted(missing))}: add a target that needs one")
        best = min(candidates, key=price)
        picks[jobs[best]["rule"]] = best
        run = kept(jobs, seeds | set(picks.values()), held)
    return picks


def choose(jobs: dict[str, dict], rules: list[str], targets: set[str], held: set[str], cost: dict[str, float]):
    """The jobs to run and each rule's chosen job: the targets' jobs and one job of each rule. Two greedy choices
    (by cost per newly covered rule; deepest rule first), each improved one rule at a time while the slice's whole
    cost falls (a rule's job swapped for another of its rule or dropped, the rules left uncovered completed again),
    the cheaper kept. (A greedy pick is priced by what it adds to the jobs kept so far, so an early cheap pick, a
    table reading 300 files, can make a later one dear, the train job those files descend from: only the whole
    slice's cost sees that.) A rule the kept jobs cover without a pick of its own: its cheapest kept job."""
    seeds = {j for j, job in jobs.items() if set(job["output"]) & targets}

    def total(picks):
        return sum(cost[j] for j in kept(jobs, seeds | set(picks.values()), held))

    level = depth(jobs)
    rule_depth = {rule: max((level[j] for j in jobs if jobs[j]["rule"] == rule), default=0) for rule in rules}

    def improved(order):
        picks = completed(jobs, rules, seeds, {}, held, cost, order)
        best, better = total(picks), True
        while better:
            better = False
            for rule in sorted(picks):
                others = {r: j for r, j in picks.items() if r != rule}
                for option in [None] + sorted((j for j in jobs if jobs[j]["rule"] == rule and j != picks[rule]),
                                              key=int):
                    trial = completed(jobs, rules, seeds, others if option is None else {**others, rule: option},
                                      held, cost, order)
                    if (trial_total := total(trial)) < best - 1e-9:
                        picks, best, better = trial, trial_total, True
                        break
                if better:
                    break
        return best, picks
    picks = min(improved(None), improved(rule_depth), key=lambda found: found[0])[1]
    run = kept(jobs, seeds | set(picks.values()), held)
    chosen = {rule: picks.get(rule) or min((j for j in run if jobs[j]["rule"] == rule), key=lambda j: (cost[j], int(j)))
              for rule in rules}
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
