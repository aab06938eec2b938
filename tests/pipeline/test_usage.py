"""Every pipeline job's exact CPU seconds: the commands' usage line, and bench_pipeline reading it."""
import os
import subprocess
import sys
from pathlib import Path

from benchmark_scripts import load_benchmark


BENCH = load_benchmark("bench_pipeline")


def run_report_help(env_extra: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SYMFUSION_USAGE"}
    env.update(env_extra)
    code = "import sys; from symfusion.pipeline.cli import report_main; report_main(['--cfg'])"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


def test_a_command_ends_with_its_usage_line_only_when_asked():
    quiet = run_report_help({})
    assert quiet.returncode == 0 and "usage:" not in quiet.stderr
    loud = run_report_help({"SYMFUSION_USAGE": "1"})
    assert loud.returncode == 0
    line = loud.stderr.strip().splitlines()[-1]
    assert BENCH.USAGE.match(line), line
    assert line.startswith("usage: symfusion-report user ")


def test_bench_pipeline_takes_a_jobs_cpu_from_its_log_and_falls_back_to_the_sample(tmp_path):
    run = tmp_path / "results" / "mini"
    for name, usage in (("a", "usage: symfusion-merge user 40.50 s, system 2.25 s, wall 50.00 s, peak RSS 900 MiB"),
                        ("b", None)):
        bench = run / "benchmarks" / "vision" / "task" / "merge" / f"{name}.tsv"
        bench.parent.mkdir(parents=True, exist_ok=True)
        bench.write_text("s\th:m:s\tmax_rss\tcpu_time\n50.0\t0:00:50\t900\t30.0\n")
        log = run / "logs" / "vision" / "task" / "merge" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("some output\n" + (usage + "\n" if usage else ""))
    rows = {Path(r["job"]).stem: r for r in BENCH.benchmark_rows(run)}
    assert rows["a"]["cpu_exact"] and abs(rows["a"]["cpu"] - 42.75) < 1e-9 and rows["a"]["system"] == 2.25
    assert not rows["b"]["cpu_exact"] and rows["b"]["cpu"] == 30.0
    assert {r["rule"] for r in rows.values()} == {"merge"}


def test_the_calibration_says_how_busy_the_machine_was(tmp_path):
    stat = tmp_path / "stat"
    ticks = BENCH.os.sysconf("SC_CLK_TCK")
    stat.write_text(f"cpu  {3 * ticks} 0 {ticks} 500 7 0 0 0 0 0\ncpu0 1 2 3\n")
    assert BENCH.busy_cpu_seconds(stat) == 4.0                 # user + system; idle and iowait left out
    assert BENCH.busy_cpu_seconds(tmp_path / "missing") is None
    readings = iter([10.0, 13.0])                              # 3 busy seconds across the machine
    result, others = BENCH.while_measuring(lambda: BENCH.time.sleep(0.2) or "done", busy=lambda: next(readings))
    assert result == "done"
    assert 3.0 / 2.0 < others <= 3.0 / 0.2                     # 3 s over >= 0.2 s of wall (own CPU ~0)
    _, unknown = BENCH.while_measuring(lambda: None, busy=lambda: None)
    assert unknown is None


def test_bench_pipeline_reads_the_warm_workers_last_run(tmp_path):
    log = tmp_path / "logs" / "worker.log"
    log.parent.mkdir(parents=True)
    assert BENCH.worker_usage(tmp_path) is None
    log.write_text("worker 1 serving /tmp/a/socket\njob 2: symfusion-data x\njob 2 (data): exit 0 after 1.0 s\n"
                   "usage: symfusion-worker user 10.00 s, system 1.00 s (its jobs included)\n"
                   "worker 5 serving /tmp/b/socket\njob 6: symfusion-match y\njob 6 (match): exit 2 after 0.5 s\n"
                   "refused merge: another environment: FOO\njob 7 (train): exit 0 after 9.0 s\n"
                   "usage: symfusion-worker user 20.50 s, system 2.25 s (its jobs included)\n")
    assert BENCH.worker_usage(tmp_path) == {"jobs": 2, "refused": 1, "cpu": 22.75}


def test_the_prediction_scales_the_mini_profiles_cost_by_this_machines_rate():
    low, high = BENCH.MINI_COST_TFLOP
    fast, slow = BENCH.predict(2 * low, None, 2), BENCH.predict(low, None, 2)
    assert f"about {500:,.0f}-{1e3 * high / (2 * low):,.0f} CPU s here" in fast      # TFLOP / (GFLOP/s) = 1e3 s
    assert f"about {1000:,.0f}-{1e3 * high / low:,.0f} CPU s here" in slow
    minutes = round(1e3 / (BENCH.BUSY_PER_CORE * 2) / 60)
    assert f", {minutes}-" in slow and "busy" not in slow
    shared = BENCH.predict(low, 1.0, 2)                                           # half of the 2 cores taken
    assert "the rate reads low" in shared and f"at least {2 * 1e3 / (BENCH.BUSY_PER_CORE * 2) / 60:.0f}-" in shared
    assert "longest chain" in BENCH.predict(low, None, 8) and "longest chain" not in slow


def test_the_calibration_is_timed_with_the_jobs_kernels(tmp_path):
    """The GEMM is timed under the settings the run's jobs get (MKL reads them when it loads: a child process),
    and a finished run's `portable` comes from its provenance."""
    capped, native, vendors = (BENCH.job_kernels(p) for p in ("true", "false", "vendors"))
    assert "SYMFUSION_USAGE" not in capped and not any(k.startswith("MKL_") for k in native)
    if capped:                                                  # an x86-64 CPU with AVX2 and FMA
        assert capped["MKL_ENABLE_INSTRUCTIONS"] == "AVX2" and "MKL_CBWR" not in capped
        assert vendors["MKL_CBWR"] == "COMPATIBLE" and vendors["ATEN_CPU_CAPABILITY"] == "avx2"
    assert BENCH.calibration_under("true", repeats=1) > 0
    (tmp_path / "provenance.json").write_text('{"config": {"portable": "vendors"}}')
    assert BENCH.run_portable(tmp_path) == "vendors"
    (tmp_path / "provenance.json").write_text('{"config": {"portable": false}}')
    assert BENCH.run_portable(tmp_path) == "false"
    assert BENCH.run_portable(tmp_path / "missing") == "true"
