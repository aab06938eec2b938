"""scripts/check_slurm_prefill.py: which jobs of a slice run through SLURM, and the copies of the others' outputs."""
import importlib.util
import itertools
import os
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_slurm_prefill.py"
spec = importlib.util.spec_from_file_location("check_slurm_prefill", SCRIPT)
prefill = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prefill)

# A dry run's blocks as Snakemake 9 writes them: data -> train (two models) -> statistics (a temp() file, gone from
# the local run) -> merge -> table (the target); train -> evaluate (not needed by the target, cheap or dear).
JOBS = [  # (jobid, rule, inputs, outputs)
    ("1", "data", [], ["R/data/a.json"]),
    ("2", "train", ["R/data/a.json"], ["R/models/m0"]),
    ("3", "train", ["R/data/a.json"], ["R/models/m1"]),
    ("4", "statistics", ["R/models/m0"], ["R/statistics/m0.safetensors"]),
    ("5", "merge", ["R/models/m0", "R/models/m1", "R/statistics/m0.safetensors"], ["R/eval/merge.json"]),
    ("6", "evaluate", ["R/models/m0"], ["R/eval/end/m0.json"]),
    ("7", "evaluate", ["R/models/m1"], ["R/eval/end/m1.json"]),
    ("8", "table", ["R/eval/merge.json", "R/eval/end/m0.json", "R/eval/end/m1.json"], ["R/table.csv", "F/fig.csv"]),
]
SECONDS = {"1": 1, "2": 50, "3": 5, "4": 3, "5": 4, "6": 2, "7": 1, "8": 1}


def dry_run(run: Path, figures: Path) -> str:
    blocks = []
    for jobid, rule, inputs, outputs in JOBS:
        def real(path):
            return str(run / path[2:]) if path.startswith("R/") else str(figures / path[2:])
        lines = ["[Sun Nov 29 09:30:39 2026]", f"rule {rule}:"]
        if inputs:
            lines.append("    input: " + ", ".join(real(p) for p in inputs))
        lines += ["    output: " + ", ".join(real(p) for p in outputs),
                  f"    log: {run}/logs/{jobid}.log", f"    jobid: {jobid}",
                  f"    benchmark: {run}/benchmarks/{jobid}.tsv", "    reason: Missing output files: x",
                  "    resources: tmpdir=/tmp", ""]
        blocks.append("\n".join(lines))
    return "\n".join(blocks) + "\nJob stats:\n"


@pytest.fixture
def local(tmp_path):
    """The local run: every output but the temp() statistics file, each with a distinct old time."""
    reference, reference_figures = tmp_path / "local" / "results", tmp_path / "local" / "figures"
    stamp = 1_700_000_000
    for jobid, _, _, outputs in JOBS:
        for path in outputs:
            if "statistics" in path:
                continue
            target = (reference if path.startswith("R/") else reference_figures) / path[2:]
            if "models/" in path:
                target.mkdir(parents=True)
                (target / "model.safetensors").write_bytes(b"weights of " + path.encode())
                (target / ".snakemake_timestamp").touch()
                for inner in target.iterdir():
                    os.utime(inner, (stamp, stamp))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(f"numbers of {path}\n")
            os.utime(target, (stamp, stamp))
            stamp += 10
        bench = reference / "benchmarks" / f"{jobid}.tsv"
        bench.parent.mkdir(parents=True, exist_ok=True)
        bench.write_text(f"s\th:m:s\n{SECONDS[jobid]}\t0:00:01\n")
    return reference, reference_figures


def fill(tmp_path, local, rules, targets=("R/table.csv", "F/fig.csv")):
    reference, reference_figures = local
    run, figures = tmp_path / "slurm" / "results", tmp_path / "slurm" / "figures"
    log = tmp_path / "dry_run.log"
    log.write_text(dry_run(run, figures))
    real = [str(run / t[2:]) if t.startswith("R/") else str(figures / t[2:]) for t in targets]
    code = prefill.main([str(log), str(run), str(figures), str(reference), str(reference_figures), rules, *real])
    return code, run, figures


def test_jobs_kept(tmp_path, local):
    """The target's job, its producers of files the local run no longer holds, one job per rule (the cheapest
    with what it drags along), and everything downstream of a kept job."""
    jobs = prefill.dry_run_jobs(dry_run(Path("R"), Path("F")))
    assert [jobs[j]["rule"] for j in sorted(jobs)] == [job[1] for job in JOBS]
    assert jobs["5"]["input"] == ["R/models/m0", "R/models/m1", "R/statistics/m0.safetensors"]
    held = {p for _, _, _, outputs in JOBS for p in outputs if "statistics" not in p}
    cost = {jobid: float(s) for jobid, s in SECONDS.items()}
    targets = {"R/table.csv"}
    # The target's job needs merge (downstream of the temp file's producer): table, merge, statistics.
    assert prefill.choose(jobs, ["table", "merge", "statistics"], targets, held, cost)[0] == {"8", "5", "4"}
    # evaluate: job 7 (1 s) rather than 6 (2 s); train: job 3 (5 s, with 7 and merge) rather than 2 (50 s).
    assert prefill.choose(jobs, ["table", "evaluate", "train"], targets, held, cost)[0] == {"8", "5", "4", "7", "3"}
    # data: every job downstream of it.
    assert prefill.choose(jobs, ["data"], targets, held, cost)[0] == set(jobs)
    # Had the local run kept the temp file, the target alone runs.
    assert prefill.choose(jobs, ["table"], targets, held | {"R/statistics/m0.safetensors"}, cost)[0] == {"8"}


def test_targets_chosen(tmp_path, local):
    """No targets (the whole DAG): every rule gets exactly one chosen job, of that rule, the cheapest by the local
    run's seconds with what it drags along; only the chosen jobs' DAG counts (a job no chosen job needs does not
    rerun though its input does)."""
    jobs = prefill.dry_run_jobs(dry_run(Path("R"), Path("F")))
    held = {p for _, _, _, outputs in JOBS for p in outputs if "statistics" not in p}
    cost = {jobid: float(s) for jobid, s in SECONDS.items()}
    for rules, want, runs in [
        # evaluate: 7 (1 s) rather than 6 (2 s); table: 8 (1 s, its inputs held); train: 3 (5 s, with 7 and merge,
        # which needs the temp file's producer) rather than 2 (50 s).
        (["train", "evaluate", "table"], {"evaluate": "7", "table": "8", "train": "3"}, {"7", "8", "3", "5", "4"}),
        # data drags every job along; each other rule's chosen job: its cheapest kept one.
        (["data", "train", "statistics", "merge", "evaluate", "table"],
         {"data": "1", "train": "3", "statistics": "4", "merge": "5", "evaluate": "7", "table": "8"}, set(jobs)),
        # train alone: job 3 (5 s), its consumers 5, 7 and 8 outside its DAG.
        (["train"], {"train": "3"}, {"3"}),
    ]:
        run, chosen = prefill.choose(jobs, rules, set(), held, cost)
        assert chosen == want and run == runs
        assert sorted(chosen) == sorted(rules) and all(jobs[j]["rule"] == rule for rule, j in chosen.items())
        for rule, jobid in chosen.items():     # no job of the rule in the slice is cheaper
            assert cost[jobid] == min(cost[j] for j in run if jobs[j]["rule"] == rule)


def test_choice_sees_the_whole_slice():
    """A cheap upstream pick can drag a downstream pick's whole DAG along (in CI a data job chosen before a table
    reading 324 files made 71 jobs of a slice that 20 cover): the choice is the cheapest whole slice, as a brute
    force over one job per rule finds it, where the greedy by cost per covered rule alone pays half as much again.
    Data d1 -> train t1 -> four merges -> the one table; data d2 (dearer) -> train t2 -> one merge the table does
    not read. Every output is held by the local run."""
    spec = [("1", "data", [], ["a"]), ("2", "data", [], ["b"]), ("3", "train", ["a"], ["ma"]),
            ("4", "train", ["b"], ["mb"])]
    spec += [(str(5 + i), "merge", ["ma"], [f"e{i}"]) for i in range(4)] + [("9", "merge", ["mb"], ["e4"])]
    spec += [("10", "table", ["e0", "e1", "e2", "e3"], ["table.csv"])]
    jobs = {jobid: {"rule": rule, "input": inputs, "output": outputs, "benchmark": None, "jobid": jobid}
            for jobid, rule, inputs, outputs in spec}
    cost = {"1": 1.0, "2": 5.0, "3": 1.0, "4": 1.0, "5": 3.0, "6": 3.0, "7": 3.0, "8": 3.0, "9": 3.0, "10": 1.0}
    held = {path for job in jobs.values() for path in job["output"]}
    rules = ["data", "train", "merge", "table"]

    def whole(picks):
        return sum(cost[j] for j in prefill.kept(jobs, set(picks), held))
    options = [[j for j in jobs if jobs[j]["rule"] == rule] for rule in rules]
    cheapest = min(whole(picks) for picks in itertools.product(*options))
    greedy = prefill.completed(jobs, rules, set(), {}, held, cost, None)
    assert whole(greedy.values()) == 15.0 and cheapest == 10.0     # d1, t1 and a merge drag all four merges
    run, chosen = prefill.choose(jobs, rules, set(), held, cost)
    assert sum(cost[j] for j in run) == cheapest
    assert chosen == {"data": "2", "train": "4", "merge": "5", "table": "10"} and run == set(chosen.values())


def test_choose_writes_targets(tmp_path, local, capsys):
    """--choose: the chosen jobs' outputs written as the slice's targets, only the chosen jobs' DAG pre-filled;
    with TARGET files given: refused."""
    reference, reference_figures = local
    run, figures = tmp_path / "slurm" / "results", tmp_path / "slurm" / "figures"
    log, chosen = tmp_path / "dry_run.log", tmp_path / "targets.txt"
    log.write_text(dry_run(run, figures))
    args = [str(log), str(run), str(figures), str(reference), str(reference_figures), "train,evaluate"]
    with pytest.raises(SystemExit, match="--choose picks the targets itself"):
        prefill.main(["--choose", str(chosen), *args, str(run / "table.csv")])
    assert not chosen.exists() and not run.exists()
    assert prefill.main(["--choose", str(chosen), *args]) == 0
    assert chosen.read_text().splitlines() == [str(run / "eval/end/m1.json"), str(run / "models/m1")]
    out = capsys.readouterr().out
    assert "2 jobs to run through SLURM" in out and "chose evaluate job 7" in out and "chose train job 3" in out
    # The DAG of jobs 3 and 7: data (copied), train m1 and evaluate m1 (run); nothing else written.
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == ["data", "data/a.json"]
    assert not figures.exists()


def test_copies(tmp_path, local, capsys):
    """The others' outputs copied with their bytes and times, directories whole; the kept jobs' outputs absent;
    the local run untouched."""
    reference, reference_figures = local
    before = {p: (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
              for p in sorted(tmp_path.joinpath("local").rglob("*"))}
    code, run, figures = fill(tmp_path, local, "table,evaluate,train")
    assert code == 0
    assert ("pre-filled 3 outputs of 3 of the slice's 8 jobs" in (out := capsys.readouterr().out)
            and "5 jobs to run through SLURM" in out and "evaluate 1, merge 1, statistics 1, table 1, train 1" in out)
    for copied in ("data/a.json", "models/m0", "models/m0/model.safetensors", "models/m0/.snakemake_timestamp",
                   "eval/end/m0.json"):
        assert (run / copied).stat().st_mtime_ns == (reference / copied).stat().st_mtime_ns, copied
        if (run / copied).is_file():
            assert (run / copied).read_bytes() == (reference / copied).read_bytes()
    for kept in ("models/m1", "statistics/m0.safetensors", "eval/merge.json", "eval/end/m1.json", "table.csv"):
        assert not (run / kept).exists(), kept
    assert not (figures / "fig.csv").exists() and not (run / "benchmarks").exists()
    after = {p: (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
             for p in sorted(tmp_path.joinpath("local").rglob("*"))}
    assert after == before


def test_refusals(tmp_path, local):
    """A run folder that exists already, or a rule the slice has no job of: an error, nothing copied."""
    (tmp_path / "slurm" / "results").mkdir(parents=True)
    with pytest.raises(SystemExit, match="exists: the pre-fill writes only into a fresh run folder"):
        fill(tmp_path, local, "table")
    (tmp_path / "slurm" / "results").rmdir()
    with pytest.raises(SystemExit, match="no job of rule.s. layer_sweep"):
        fill(tmp_path, local, "table,layer_sweep")
    assert not (tmp_path / "slurm" / "results").exists()
