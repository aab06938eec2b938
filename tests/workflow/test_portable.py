"""A portable run (workflow/job_environment.py): every library reads its cap, and every job, forked from the warm
worker or not, computes with torch's AVX2 kernels; portable=false leaves the machine's own."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from symfusion.pipeline import warm
from workflow_copy import ROOT, scratch_workflow, snakemake

spec = importlib.util.spec_from_file_location("job_environment", ROOT / "workflow" / "job_environment.py")
job_environment = importlib.util.module_from_spec(spec)
spec.loader.exec_module(job_environment)
PORTABLE = job_environment.PORTABLE
CAPPED_HERE = job_environment.portable_environment() != {}
needs_avx2 = pytest.mark.skipif(not CAPPED_HERE, reason="the cap applies on x86-64 CPUs with AVX2 and FMA only")

PROBE = """
import json, numpy, torch
from numpy._core._multiarray_umath import __cpu_features__
from threadpoolctl import threadpool_info
torch.nn.functional.conv2d(torch.ones(1, 1, 8, 8), torch.ones(2, 1, 4, 4), stride=4)   # a oneDNN primitive
print(json.dumps({"torch": torch.backends.cpu.get_cpu_capability(),
                  "numpy_avx512": bool(__cpu_features__.get("X86_V4") or __cpu_features__.get("AVX512_ICL")),
                  "openblas": sorted({i.get("architecture") for i in threadpool_info() if i["internal_api"] == "openblas"})}))
"""


def probe(extra: dict) -> tuple[dict, str]:
    """What a fresh Python with the environment (without any cap of ours inherited) computes with."""
    environment = {k: v for k, v in os.environ.items() if k not in PORTABLE}
    result = subprocess.run([sys.executable, "-c", PROBE], env={**environment, "DNNL_VERBOSE": "1", **extra},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    onednn_isa = next(line for line in lines if ",info,cpu,isa:" in line)
    return json.loads(lines[-1]), onednn_isa


@needs_avx2
def test_every_library_reads_its_cap():
    """A misspelt variable or value would leave its library on the machine's widest kernels."""
    capped, onednn_isa = probe(PORTABLE)
    assert capped["torch"] == "AVX2"
    assert "AVX2" in onednn_isa and "AVX-512" not in onednn_isa
    assert capped["numpy_avx512"] is False
    assert capped["openblas"] == ["Haswell"]


@needs_avx2
def test_without_the_cap_a_fresh_process_computes_as_this_one():
    """The cap is what changes the kernels (this test process runs uncapped unless its caller set a cap)."""
    if "ATEN_CPU_CAPABILITY" in os.environ:
        pytest.skip("this test process was started with a torch cap of its own")
    uncapped, _ = probe({})
    assert uncapped["torch"] == torch.backends.cpu.get_cpu_capability()


def test_the_cap_is_offered_only_where_a_cpu_can_take_it():
    assert job_environment.portable_environment("x86_64", {"avx2", "fma", "sse2"}) == PORTABLE
    assert job_environment.portable_environment("x86_64", {"avx", "sse2"}) == {}       # no AVX2: OpenBLAS would crash
    assert job_environment.portable_environment("arm64", {"avx2", "fma"}) == {}
    everything = job_environment.job_environment(True, "avx2", machine="AMD64", flags={"avx2", "fma"})
    assert everything == {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                          "SYMFUSION_USAGE": "1", **PORTABLE}
    assert job_environment.job_environment(False, None, machine="x86_64", flags={"avx2", "fma"}) \
        == {"SYMFUSION_USAGE": "1"}


def test_portable_across_vendors_adds_mkls_vendor_neutral_path():
    """portable=vendors: the AVX2 caps and MKL_CBWR=COMPATIBLE (MKL's one code path alike on Intel and AMD); the
    config's spellings of each level as Snakemake's --config and the YAML file give them."""
    level = job_environment.portable_level
    assert [level(v) for v in (True, "true", "True", False, "false", "vendors")] \
        == ["avx2", "avx2", "avx2", None, None, "vendors"]
    both = job_environment.job_environment(False, "vendors", machine="x86_64", flags={"avx2", "fma"})
    assert both == {"SYMFUSION_USAGE": "1", **PORTABLE, "MKL_CBWR": "COMPATIBLE"}
    assert "MKL_CBWR" not in job_environment.job_environment(False, "avx2", machine="x86_64", flags={"avx2", "fma"})
    assert job_environment.job_environment(False, "vendors", machine="arm64", flags=set()) == {"SYMFUSION_USAGE": "1"}
    assert not set(job_environment.ACROSS_VENDORS) & warm.PER_JOB      # a worker never serves another MKL path


def test_a_worker_never_serves_a_job_with_another_cap():
    """torch reads ATEN_CPU_CAPABILITY when it is imported: a worker that imported it under one cap cannot run a job
    under another, so no cap variable may count as a per-job variable (the workflow gives both the same)."""
    assert not set(PORTABLE) & warm.PER_JOB
    own = {"executable": "/py", "installation": "/site/symfusion"}
    request = {**own, "environment": {"PATH": "/bin", "ATEN_CPU_CAPABILITY": "avx2"}}
    assert warm.refusal(request, environment={"PATH": "/bin"}, **own) == "another environment: ATEN_CPU_CAPABILITY"
    assert warm.refusal(request, environment={"PATH": "/bin", "ATEN_CPU_CAPABILITY": "avx2"}, **own) is None


def machine_of_a_real_job(tmp_path, monkeypatch, *config: str) -> dict:
    """Run the smoke profile's first data job through Snakemake (in the warm worker): the machine its result's
    provenance records (torch's capability, MKL's code path)."""
    for key in (*PORTABLE, *job_environment.ACROSS_VENDORS):
        monkeypatch.delenv(key, raising=False)                    # no cap inherited from whoever runs the tests
    folder = scratch_workflow(tmp_path / "checkout")
    results = tmp_path / "results"
    run = snakemake(folder, "--cores", "1", f"{results}/smoke/data/digits.json", "--config", "profile=smoke",
                    f"results_dir={results}", f"figures_dir={tmp_path / 'figures'}", *config)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "): exit 0 after" in (results / "smoke" / "logs" / "worker.log").read_text()   # it ran in the worker
    report = json.loads((results / "smoke" / "data" / "digits.json").read_text())
    return report["provenance"]["machine"]


@pytest.mark.slow
@needs_avx2
def test_a_portable_run_forks_its_jobs_from_a_capped_worker(tmp_path, monkeypatch):
    machine = machine_of_a_real_job(tmp_path, monkeypatch)           # conf/pipeline.yaml: portable: true
    assert (machine["cpu_capability"], machine["mkl_cbwr"]) == ("AVX2", None)


@pytest.mark.slow
@needs_avx2
def test_a_run_portable_across_vendors_takes_mkls_compatible_path(tmp_path, monkeypatch):
    machine = machine_of_a_real_job(tmp_path, monkeypatch, "portable=vendors")
    assert (machine["cpu_capability"], machine["mkl_cbwr"]) == ("AVX2", "COMPATIBLE")


@pytest.mark.slow
def test_portable_false_leaves_the_machines_kernels(tmp_path, monkeypatch):
    assert machine_of_a_real_job(tmp_path, monkeypatch, "portable=false")["cpu_capability"] == probe({})[0]["torch"]
