"""benchmarks/bench_overhead.py: py-spy's native samples classed by their innermost frame, and the compute floor."""
from __future__ import annotations

import pytest

from tests.benchmark_scripts import load_benchmark

bench = load_benchmark("bench_overhead")

RAW = [
    "<module> (train.py:10);forward (linear.py:130);mkl_blas_def_sgemm_kernel_0_zen (libtorch_cpu.so) 60",
    "<module> (train.py:10);at::native::(anonymous namespace)::LayerNormKernelImpl (libtorch_cpu.so) 15",
    "<module> (train.py:10);0x7f7e612c024e (?) 5",
    "<module> (train.py:10);step (adamw.py:88) 10",
    "<module> (train.py:10);c10::Dispatcher::call (libtorch_cpu.so) 5",
    "<module> (train.py:10);malloc (libc.so.6) 3",
    "<module> (train.py:10);inflate (libz.so.1.2.13) 2",
    "",
]


@pytest.mark.parametrize("leaf,expected", [
    ("mkl_blas_def_sgemm_scopy_right4_bdz (libtorch_cpu.so)", "GEMM (MKL)"),
    ("c10::function_ref<void (char**, long const*, long, long)>::callback_fn<at::native::AVX2::VectorizedLoop2d<"
     "at::native::AVX2::direct_copy_kernel(at::Tensor (libtorch_cpu.so)", "ATen kernels"),
    ("Sleef_finz_expf8_u10avx2 (libtorch_cpu.so)", "ATen kernels"),
    ("0x7f7e61640125 (?)", "JIT code"),
    ("gomp_barrier_wait_end (libgomp.so.1)", "OpenMP"),
    ("torch::autograd::Engine::evaluate_function (libtorch_cpu.so)", "framework"),
    ("gc_collect_main (libpython3.11.so.1.0)", "framework"),
    ("_create_fn (dataclasses.py:433)", "framework"),
    ("_compile_bytecode (<frozen importlib._bootstrap_external>:729)", "framework"),
    ("free (libc.so.6)", "libc"),
    ("cos (libm.so.6)", "other"),
])
def test_each_innermost_frame_has_its_class(leaf, expected):
    assert bench.kind(leaf) == expected


def test_the_shares_add_up_and_the_floor_is_the_compute_share():
    counts, total = bench.shares(RAW)
    assert total == 100 and sum(counts.values()) == 100
    assert counts["GEMM (MKL)"] == 60 and counts["ATen kernels"] == 15 and counts["JIT code"] == 5
    assert counts["framework"] == 15 and counts["libc"] == 3 and counts["other"] == 2
    rows = bench.table("job", counts, total).splitlines()
    assert len(rows) == len(bench.CLASSES) + 1
    assert rows[-1].endswith("| **80.0** |")                 # 60 + 15 + 5 + 0 of 100 samples


@pytest.mark.parametrize("argv", [[], ["--samples", "x.txt", "--", "true"], ["--", "true"]])
def test_it_needs_samples_or_a_recorder_and_a_command(monkeypatch, capsys, argv):
    monkeypatch.setattr("sys.argv", ["bench_overhead.py", *argv])
    with pytest.raises(SystemExit) as stop:
        bench.main()
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: give --samples") and err.count("\n") == 1
