"""Where one job's CPU time goes: compute kernels against the framework around them, from py-spy's native samples.

    python benchmarks/bench_overhead.py --py-spy PATH symfusion-train task=fashion_mnist model=vit_mini \
        profile=mini seed=0 output=DIR threads=1
    python benchmarks/bench_overhead.py --samples RAW.txt [RAW2.txt ...]     # classify samples recorded before

py-spy (a sampling profiler, not a dependency of symfusion: `pip install --target DIR py-spy`, then --py-spy
DIR/bin/py-spy) records the command at --rate samples per second with native frames (`py-spy record --native
--format raw`); each sample is classed by its innermost frame:
    GEMM (MKL)          MKL's sgemm/dgemm kernels and their packing (mkl_*), the products themselves
    ATen kernels        torch's own loops (at::native, at::vec, Sleef, flash attention, layer norm)
    JIT code            frames without a symbol (MKL's and oneDNN's generated kernels; counted as compute)
    OpenMP              the thread pool
    framework           torch's dispatcher, autograd and allocator (c10::, torch::, other libtorch code), the
                        interpreter in a .py frame, CPython's runtime
    libc                memory copies and allocation (symbols mostly stripped: not separable here)
    other               everything else (imports, zlib, libm, the loader)
The table gives each class's share of the samples and the compute share (GEMM + ATen + JIT + OpenMP): with the
same kernels in the same order (the same results to the bit) a job cannot cost less than its compute share, so
this is the floor of a cut that keeps the results. Record a job run with one thread (threads=1): with several, py-spy
samples every thread and OpenMP's waiting counts as compute. Sampling misses bursts shorter than 1/rate; py-spy's own
errors (a sample it could not read) are left out and reported.
"""
from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

COMPUTE = ("GEMM (MKL)", "ATen kernels", "JIT code", "OpenMP")
CLASSES = COMPUTE + ("framework", "libc", "other")


def kind(leaf: str) -> str:
    """The class of a sample by its innermost frame, `name (where)` as py-spy's raw format writes it."""
    found = re.search(r"\(([^()]*)\)\s*$", leaf)
    where, name = (found.group(1), leaf[:found.start()].strip()) if found else ("", leaf.strip())
    if ".py" in where or where.startswith("<frozen"):
        return "framework"                                    # the interpreter in a Python frame
    if name.startswith("mkl_") or "gemm" in name.lower():
        return "GEMM (MKL)"
    if any(mark in name for mark in ("at::native", "at::vec", "Sleef", "dnnl::")):
        return "ATen kernels"
    if where == "?":
        return "JIT code"
    if "omp" in name.lower() or "gomp" in where or "iomp" in where:
        return "OpenMP"
    if "libpython" in where or "libtorch" in where or "libc10" in where:
        return "framework"
    if where.startswith("libc.so") or where.startswith("libc-"):
        return "libc"
    return "other"


def shares(lines) -> tuple[collections.Counter, int]:
    """Samples per class from py-spy raw lines (`frame;frame;... COUNT`), and their total."""
    counts, total = collections.Counter(), 0
    for line in lines:
        line = line.rstrip("\n")
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        counts[kind(stack.split(";")[-1])] += int(count)
        total += int(count)
    return counts, total


def table(label: str, counts: collections.Counter, total: int) -> str:
    """One markdown row per class, and the compute share."""
    rows = [f"| {label} | {name} | {100 * counts[name] / total:.1f} |" for name in CLASSES]
    compute = sum(counts[name] for name in COMPUTE)
    rows.append(f"| {label} | **compute (the floor of a cut that keeps the results)** | **{100 * compute / total:.1f}** |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--py-spy", type=Path, help="the py-spy executable (records the command after --)")
    parser.add_argument("--rate", type=int, default=50, help="samples per second")
    parser.add_argument("--samples", type=Path, nargs="+", help="raw files recorded before (py-spy --format raw)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to record (after the options; a "
                        "leading -- is dropped)")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if bool(args.samples) == bool(command) or (command and args.py_spy is None):
        print("error: give --samples RAW.txt ..., or --py-spy PATH COMMAND ...", file=sys.stderr)
        raise SystemExit(2)
    sources = [(str(p), p.read_text().splitlines()) for p in args.samples or []]
    if command:
        with tempfile.TemporaryDirectory() as work:
            raw = Path(work) / "samples.txt"
            done = subprocess.run([str(args.py_spy), "record", "-r", str(args.rate), "--native", "--format", "raw",
                                   "-o", str(raw), "--", *command], capture_output=True, text=True)
            errors = re.findall(r"Samples: (\d+) Errors: (\d+)", done.stdout + done.stderr)
            if done.returncode != 0 or not raw.exists():
                print(f"error: py-spy ended with {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}",
                      file=sys.stderr)
                raise SystemExit(2)
            if errors:
                print(f"py-spy: {errors[-1][0]} samples, {errors[-1][1]} it could not read (left out)")
            sources.append((" ".join(command)[:60], raw.read_text().splitlines()))
    print("| job | class | % of samples |\n|---|---|---|")
    for label, lines in sources:
        counts, total = shares(lines)
        print(table(label, counts, total))


if __name__ == "__main__":
    main()
