"""What a pipeline run cost, per stage and per rule: CPU and wall seconds, the critical path, and this machine's rate.

    python benchmarks/bench_pipeline.py RUN_DIR [--log SNAKEMAKE_LOG] [--time GNU_TIME_OUTPUT] [--json OUT]
    python benchmarks/bench_pipeline.py --predict [--cores N]    # before a run: what the mini profile will cost here

RUN_DIR is results/<profile> of a finished run (its benchmarks/ folder holds Snakemake's per-job
benchmark files: wall seconds `s` and `cpu_time`, user + system of the job's process tree, sampled by
Snakemake every 30 s; its logs/ folder the jobs' logs, each ending with the command's exact `usage:`
line, which is preferred). --log is the run's Snakemake log (.snakemake/log/*.log of the run's folder; default: the
newest one beside RUN_DIR's repository): job start/end times and inputs/outputs give the critical path.
--time is the output of `/usr/bin/time -v snakemake ...`: the run's exact user + system seconds,
including Snakemake itself. The stages' own timers (train.json, match.json, merged models' merge
seconds) are summed beside. The calibration rate is the GFLOP/s of one fixed float32 GEMM (2048^3,
torch, 1 thread) measured now, so runs on different machines compare as ratios: cpu seconds x GFLOP/s = the
run's cost in units of this GEMM's work. It is timed in a child process started with the jobs' own kernel
settings (workflow/job_environment.py for the run's `portable`, read from its provenance.json; --portable
before a run, default the pipeline's `true`), which MKL reads when it loads: on an Intel CPU with AVX-512
the portable cap (MKL_ENABLE_INSTRUCTIONS=AVX2) makes the jobs' GEMMs ~0.6x the uncapped rate, and a
calibration timed without it would price the run's work at a rate its jobs never get (docs/costs.md).
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

GEMM_N = 2048
# The mini profile's cost in units of the calibration GEMM's work (CPU seconds x GFLOP/s, in TFLOP): the range
# measured from clean clones on machines of this kind (docs/costs.md, "Runs of the mini profile": 209 on an AMD EPYC Zen 5 for
# today's 179 jobs, 205 before the ViT's learned refinement distilled; the previous 117 jobs: 167 on a Zen 4, 211-232 on a Zen 3, which pays more per GEMM-equivalent and
# whose rate varies 67-85 GFLOP/s); on 2 cores a run keeps 1.9 busy.
MINI_COST_TFLOP = (195.0, 260.0)
BUSY_PER_CORE = 0.95


def job_kernels(portable: str) -> dict[str, str]:
    """The kernel settings a run's jobs compute with (`portable`: true, false or vendors, the config's value):
    workflow/job_environment.py's, read by its path as the Snakefile reads it (plain Python, no symfusion)."""
    spec = importlib.util.spec_from_file_location("job_environment", ROOT / "workflow" / "job_environment.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    environment = module.job_environment(False, module.portable_level(portable))
    return {k: v for k, v in environment.items() if k != "SYMFUSION_USAGE"}


def calibration_under(portable: str, repeats: int = 5) -> float:
    """calibration_gflops timed in a child process that starts with the jobs' kernel settings (MKL, oneDNN and
    torch read them when they load, so this process, torch already loaded, cannot take them on)."""
    environment = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    environment.update(job_kernels(portable))
    code = (f"import importlib.util as u; s = u.spec_from_file_location('bench_pipeline', {str(Path(__file__))!r}); "
            f"m = u.module_from_spec(s); s.loader.exec_module(m); print(m.calibration_gflops({repeats}))")
    done = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def run_portable(run_dir: Path) -> str:
    """The `portable` a finished run computed with (its provenance.json's config; the default `true` where the
    file or the key is missing)."""
    try:
        return str(json.loads((run_dir / "provenance.json").read_text())["config"].get("portable", True)).lower()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "true"


def calibration_gflops(repeats: int = 5) -> float:
    """GFLOP/s of a float32 (2048 x 2048) @ (2048 x 2048) product on one thread: the best of `repeats`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(GEMM_N, GEMM_N), torch.randn(GEMM_N, GEMM_N)
        a @ b
        best = min(_timed(lambda: a @ b) for _ in range(repeats))
    finally:
        torch.set_num_threads(threads)
    return 2 * GEMM_N ** 3 / best / 1e9


def busy_cpu_seconds(stat: Path = Path("/proc/stat")) -> float | None:
    """CPU seconds the whole machine has spent busy since boot (all CPUs, idle and iowait excluded), from
    /proc/stat's first line; None where there is no /proc/stat."""
    try:
        fields = [int(v) for v in stat.read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = fields + [0] * (8 - len(fields))
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def while_measuring(function, busy=busy_cpu_seconds):
    """(function(), how many CPUs other processes kept busy meanwhile): the machine's busy seconds over the
    call, less this process's and its children's CPU seconds, per second of wall time (None where it cannot be read).
    A calibration taken beside other work reads low; this says so."""
    before, own, start = busy(), _own_cpu(), time.perf_counter()
    result = function()
    after, own, wall = busy(), _own_cpu() - own, time.perf_counter() - start
    if before is None or after is None or wall <= 0:
        return result, None
    return result, max(0.0, (after - before - own) / wall)


def _own_cpu() -> float:
    """CPU seconds of this process and its finished children (the calibration's child process)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def rule_of(benchmark: Path, root: Path) -> str:
    """The rule a benchmark file belongs to, from its place under benchmarks/ (the rule files name them so)."""
    parts = benchmark.relative_to(root).parts
    if parts[0] in ("vision", "lang"):          # <track>/<group>/<rule>/... or <track>/<group>/<rule>.tsv
        return Path(parts[2]).stem
    return parts[0] if parts[0] != "report" else f"report:{Path(parts[-1]).stem}"


USAGE = re.compile(r"^usage: (\S+) user ([\d.]+) s, system ([\d.]+) s")


def job_usage(log: Path) -> tuple[float, float] | None:
    """(user, system) seconds from the last `usage:` line a symfusion command wrote to a job's log, if any."""
    if not log.is_file():
        return None
    found = None
    for line in log.read_text(errors="replace").splitlines():
        match = USAGE.match(line)
        if match:
            found = (float(match.group(2)), float(match.group(3)))
    return found


WORKER_USAGE = re.compile(r"^usage: symfusion-worker user ([\d.]+) s, system ([\d.]+) s")


def worker_usage(run_dir: Path) -> dict | None:
    """The warm worker's last run in logs/worker.log: jobs it forked, its CPU seconds with theirs (None: no worker)."""
    log = run_dir / "logs" / "worker.log"
    if not log.is_file():
        return None
    lines = log.read_text(errors="replace").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("worker ") and " serving " in line]
    if not starts:
        return None
    last = lines[starts[-1]:]
    usage = [WORKER_USAGE.match(line) for line in last]
    usage = [m for m in usage if m]
    return {"jobs": sum(1 for line in last if line.startswith("job ") and "): exit " in line),
            "refused": sum(1 for line in last if line.startswith("refused ")),
            "cpu": float(usage[-1].group(1)) + float(usage[-1].group(2)) if usage else None}


def benchmark_rows(run_dir: Path) -> list[dict]:
    """One row per job: wall seconds from Snakemake's benchmark file; CPU seconds exact from the job's log
    (its command's `usage:` line, logs/ mirrors benchmarks/) or else Snakemake's sample, which misses up
    to its 30-second interval of every process."""
    root = run_dir / "benchmarks"
    rows = []
    for path in sorted(root.rglob("*.tsv")):
        with open(path) as handle:
            records = list(csv.DictReader(handle, delimiter="\t"))
        usage = job_usage(run_dir / "logs" / path.relative_to(root).with_suffix(".log"))
        for record in records:
            sampled = float(record["cpu_time"]) if record.get("cpu_time") not in (None, "", "NA") else 0.0
            rows.append({"rule": rule_of(path, root), "job": str(path.relative_to(root)),
                         "wall": float(record["s"]), "cpu": sum(usage) if usage else sampled,
                         "user": usage[0] if usage else None, "system": usage[1] if usage else None,
                         "cpu_exact": usage is not None, "cpu_sampled": sampled,
                         "max_rss_mb": float(record.get("max_rss") or 0.0)})
    return rows


# ---------------------------------------------------------------- the Snakemake log: jobs, times, dependencies

STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")


def parse_log(log: Path) -> dict[int, dict]:
    """jobid -> {rule, start, end, inputs, outputs} from a Snakemake log."""
    jobs, stamp, current = {}, None, None
    for line in log.read_text(errors="replace").splitlines():
        match = STAMP.match(line.strip())
        if match:
            stamp = datetime.strptime(match.group(1), "%a %b %d %H:%M:%S %Y")
            continue
        rule = re.match(r"^(?:local)?rule (\w+):$", line.strip())
        if rule:
            current = {"rule": rule.group(1), "start": stamp, "inputs": [], "outputs": []}
            continue
        if current is not None:
            field = re.match(r"^\s+(input|output|jobid): (.*)$", line)
            if field:
                key, value = field.groups()
                if key == "jobid":
                    jobs[int(value)] = current
                else:
                    current[key + "s"] = [v.strip() for v in value.split(",")]
                continue
            if line.strip() == "" or not line.startswith(" "):
                current = None
        done = re.match(r"^Finished jobid: (\d+)", line.strip())
        if done and int(done.group(1)) in jobs:
            jobs[int(done.group(1))]["end"] = stamp
    return {k: v for k, v in jobs.items() if v.get("end") and v.get("start")}


def critical_path(jobs: dict[int, dict]) -> tuple[float, list[dict]]:
    """(seconds, jobs) of the longest chain of dependent jobs by their wall time."""
    producer = {out: jobid for jobid, job in jobs.items() for out in job["outputs"]}
    order = sorted(jobs, key=lambda j: jobs[j]["start"])
    best: dict[int, tuple[float, int | None]] = {}
    for jobid in order:
        job = jobs[jobid]
        wall = (job["end"] - job["start"]).total_seconds()
        parents = [producer[i] for i in job["inputs"] if i in producer and producer[i] in best]
        parent = max(parents, key=lambda p: best[p][0], default=None)
        best[jobid] = (wall + (best[parent][0] if parent is not None else 0.0), parent)
    if not best:
        return 0.0, []
    last = max(best, key=lambda j: best[j][0])
    chain, node = [], last
    while node is not None:
        chain.append({"rule": jobs[node]["rule"], "seconds": (jobs[node]["end"] - jobs[node]["start"]).total_seconds(),
                      "output": jobs[node]["outputs"][0] if jobs[node]["outputs"] else ""})
        node = best[node][1]
    return best[last][0], chain[::-1]


# ---------------------------------------------------------------- the stages' own timers and GNU time

def stage_timers(run_dir: Path) -> dict[str, float]:
    """Seconds the stages report themselves: training, matching, merging (not counting loading or imports)."""
    totals = defaultdict(float)
    for path in run_dir.rglob("train.json"):
        totals["train (train.json seconds)"] += json.loads(path.read_text()).get("seconds") or 0.0
    for path in run_dir.rglob("match.json"):
        totals["match (match.json seconds)"] += json.loads(path.read_text()).get("seconds") or 0.0
    for path in run_dir.rglob("*.json"):
        if "benchmarks" in path.parts or "logs" in path.parts or path.name in ("train.json", "match.json"):
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("merge_seconds") is not None:
            totals["merge (merge_seconds)"] += data["merge_seconds"]
    return dict(totals)


def gnu_time(path: Path) -> dict[str, float]:
    """User, system and wall seconds from /usr/bin/time -v output."""
    text = path.read_text(errors="replace")
    found = {}
    for key, label in (("user", "User time (seconds)"), ("system", "System time (seconds)")):
        match = re.search(re.escape(label) + r": ([\d.]+)", text)
        if match:
            found[key] = float(match.group(1))
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    if wall:
        parts = [float(p) for p in wall.group(1).split(":")]
        found["wall"] = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
    return found


def newest_log(run_dir: Path) -> Path | None:
    for folder in [run_dir.resolve(), *run_dir.resolve().parents]:
        logs = sorted((folder / ".snakemake" / "log").glob("*.snakemake.log"))
        if logs:
            return logs[-1]
    return None


def table(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [f"{row[c]:.1f}" if isinstance(row[c], float) else str(row[c]) for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def predict(rate: float, others: float | None, cores: int, portable: str = "true") -> str:
    """The mini profile's CPU seconds and wall minutes on `cores` idle cores at this calibration rate."""
    cpu = [cost * 1e3 / rate for cost in MINI_COST_TFLOP]
    wall = [c / (BUSY_PER_CORE * cores) / 60 for c in cpu]
    text = (f"calibration: float32 {GEMM_N}^3 GEMM, 1 thread, the jobs' kernels (portable={portable}): "
            f"{rate:.1f} GFLOP/s\n"
            f"mini profile ({MINI_COST_TFLOP[0]:.0f}-{MINI_COST_TFLOP[1]:.0f} TFLOP-equivalents of this GEMM): about "
            f"{cpu[0]:,.0f}-{cpu[1]:,.0f} CPU s here, {wall[0]:.0f}-{wall[1]:.0f} min of wall on {cores} idle cores"
            + (" (from 8 cores on, the longest chain bounds it at about 4-6 min)" if cores > 2 else ""))
    if others is not None and others > 0.25:        # the machine is shared: the run gets what the others leave
        share = max(cores - others, 0.5) / cores
        text += (f"\nother processes kept {others:.2f} CPUs busy while the GEMM was timed (the rate reads low); "
                 f"with them running on, at least {wall[0] / share:.0f}-{wall[1] / share:.0f} min (contention also "
                 "inflates the CPU seconds)")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, nargs="?", help="results/<profile> of a finished run")
    parser.add_argument("--predict", action="store_true",
                        help="time the calibration GEMM and predict the mini profile's CPU and wall time here")
    parser.add_argument("--cores", type=int, default=2, help="with --predict: the cores the run gets (default 2)")
    parser.add_argument("--log", type=Path, help="the run's Snakemake log (default: the newest .snakemake/log)")
    parser.add_argument("--time", type=Path, help="/usr/bin/time -v output of the run")
    parser.add_argument("--json", type=Path, help="also write the numbers as JSON here")
    parser.add_argument("--portable", default="true", choices=["true", "false", "vendors"],
                        help="with --predict: the run's `portable` (the jobs' kernels the calibration is timed with; "
                             "default true, the pipeline's)")
    args = parser.parse_args(argv)
    if args.predict == (args.run_dir is not None) or args.cores < 1:
        parser.error("give RUN_DIR (a finished run's cost) or --predict [--cores N >= 1] (a run's cost here, before it)")
    portable = args.portable if args.predict else run_portable(args.run_dir)
    rate, others = while_measuring(lambda: calibration_under(portable))
    if args.predict:
        print(predict(rate, others, args.cores, portable))
        return 0
    rows = benchmark_rows(args.run_dir)
    per_rule = defaultdict(lambda: {"jobs": 0, "wall": 0.0, "cpu": 0.0, "system": 0.0})
    for row in rows:
        per_rule[row["rule"]]["jobs"] += 1
        per_rule[row["rule"]]["wall"] += row["wall"]
        per_rule[row["rule"]]["cpu"] += row["cpu"]
        per_rule[row["rule"]]["system"] += row["system"] or 0.0
    rule_rows = sorted(({"rule": r, **v, "cpu_per_job": v["cpu"] / v["jobs"]} for r, v in per_rule.items()),
                       key=lambda r: -r["cpu"])
    total_cpu = sum(r["cpu"] for r in rule_rows)
    exact = sum(row["cpu_exact"] for row in rows)
    source = ("each job's own usage line (user + system of its command and children)" if exact == len(rows) else
              f"{exact} jobs' own usage lines, the other {len(rows) - exact} Snakemake's sampled user + system")
    beside = ("" if others is None else f"; other processes kept {others:.2f} CPUs busy meanwhile" +
              (" (the rate reads low: calibrate on an idle machine)" if others > 0.25 else ""))
    print(f"calibration: float32 {GEMM_N}^3 GEMM, 1 thread, the jobs' kernels (portable={portable}): "
          f"{rate:.1f} GFLOP/s{beside}\n")
    print(f"per rule ({len(rows)} jobs; cpu from {source}; system = its system part where known):\n")
    print(table(rule_rows, ["rule", "jobs", "cpu", "system", "wall", "cpu_per_job"]))
    print(f"\njobs' CPU seconds: {total_cpu:.0f} (= {total_cpu * rate / 1e3:.1f} TFLOP of the calibration GEMM; "
          f"{total_cpu * rate / 60 / 150:.1f} min at 150 GFLOP/s)")
    result = {"calibration_gflops": rate, "calibration_portable": portable, "calibration_other_cpus": others,
              "rules": rule_rows,
              "jobs_cpu_seconds": total_cpu}
    if args.time:
        measured = gnu_time(args.time)
        result["gnu_time"] = measured
        if "user" in measured:
            cpu = measured["user"] + measured.get("system", 0.0)
            print(f"whole run (GNU time): user {measured['user']:.0f} s + system {measured.get('system', 0):.0f} s "
                  f"= {cpu:.0f} CPU s, wall {measured.get('wall', float('nan')):.0f} s; x rate: "
                  f"{cpu * rate / 1e3:.1f} TFLOP-equivalents")
    worker = worker_usage(args.run_dir)
    result["worker"] = worker
    if worker and worker["cpu"] is not None:
        print(f"warm worker: {worker['jobs']} jobs forked from it ({worker['refused']} refused), "
              f"{worker['cpu']:.0f} CPU s with its jobs; its own imports and forks: {worker['cpu'] - total_cpu:.0f} s "
              "(less where jobs ran in their own processes)")
    timers = stage_timers(args.run_dir)
    result["stage_timers"] = timers
    print("\nstages' own timers (seconds of work, without loading and imports): "
          + ", ".join(f"{k} {v:.0f}" for k, v in timers.items()))
    log = args.log or newest_log(args.run_dir)
    if log is not None and log.is_file():
        jobs = parse_log(log)
        length, chain = critical_path(jobs)
        span = (max(j["end"] for j in jobs.values()) - min(j["start"] for j in jobs.values())).total_seconds() \
            if jobs else 0.0
        result.update({"critical_path_seconds": length, "critical_path": chain, "span_seconds": span})
        print(f"\ncritical path ({log.name}): {length:.0f} s of a {span:.0f} s run; "
              f"{len(chain)} jobs: " + " -> ".join(f"{c['rule']} {c['seconds']:.0f}s" for c in chain))
        busiest = statistics.fmean([(j["end"] - j["start"]).total_seconds() for j in jobs.values()]) if jobs else 0
        print(f"mean job wall time {busiest:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
