"""The environment every job of a run shares: the Hub's offline switches, the usage line, the instruction-set cap.

The Snakefile exports it before every job's command and starts the warm worker with it (warm.py refuses a job
whose environment differs from the worker's, so both must get it from here). Plain Python without symfusion:
the Snakefile runs where the package may be absent (tests/workflow/test_portable.py imports this file by its path).
"""
from __future__ import annotations

import platform

# A portable run computes with the kernels an x86-64 CPU with AVX2 and no AVX-512 would use (reference/mini was
# made on one, an AMD EPYC Zen 3), whatever the AMD CPU: measured on a Zen 5 with AVX-512, its ViTs, tiny Llamas,
# merges and loss paths equal the Zen 3 reference's bit for bit, at no detectable CPU cost; without the cap an
# AVX-512 CPU trains other end models (last-bit differences from the first training step on). An Intel CPU trains
# other end models even capped: MKL's SGEMM takes a code path per vendor that no MKL setting aligns (measured,
# docs/reproduce.md#determinism). Each variable is read when its library loads (ATEN_CPU_CAPABILITY when torch is
# imported): a process must start with it.
PORTABLE = {
    "ATEN_CPU_CAPABILITY": "avx2",            # torch's own vectorised kernels: softmax, attention, fused AdamW
    "ONEDNN_MAX_CPU_ISA": "AVX2",             # oneDNN inside torch: convolutions (the ViT's patches), GELU
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",        # MKL's instruction set on Intel CPUs (its code path stays Intel's own)
    "NPY_DISABLE_CPU_FEATURES": "X86_V4,AVX512_ICL,AVX512_SPR",   # numpy's AVX-512 loops
    "OPENBLAS_CORETYPE": "Haswell",           # the OpenBLAS of numpy and scipy: its AVX2 kernels
}
# the cap needs these (a CPU without them computes otherwise, capped or not; OpenBLAS's Haswell kernels need them)
PORTABLE_NEEDS = ("avx2", "fma")
# portable=vendors adds MKL's vendor-neutral code path (MKL's conditional numerical reproducibility): its routines
# then take the same code on Intel and AMD CPUs (measured: a decoder trained and scored to the same 16 digits on an
# Intel Xeon and an AMD EPYC Zen 5; docs/reproduce.md#determinism), at 1.8x the mini's CPU seconds
ACROSS_VENDORS = {"MKL_CBWR": "COMPATIBLE"}
PORTABLE_LEVELS = {"true": "avx2", "false": None, "vendors": "vendors"}


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """This machine's x86 CPU flags (empty where there is no /proc/cpuinfo or another architecture)."""
    try:
        with open(cpuinfo) as handle:
            for line in handle:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def portable_environment(machine: str | None = None, flags: set[str] | None = None) -> dict[str, str]:
    """PORTABLE where the machine can take it (x86-64 with AVX2 and FMA), else nothing: another architecture
    cannot compute as an AVX2 CPU does, and forcing OpenBLAS's Haswell kernels on a CPU without AVX2 would crash."""
    machine = platform.machine() if machine is None else machine
    flags = cpu_flags() if flags is None else flags
    if machine.lower() not in ("x86_64", "amd64") or not all(f in flags for f in PORTABLE_NEEDS):
        return {}
    return dict(PORTABLE)


def portable_level(value) -> str | None:
    """The config's `portable` (true, false or vendors; a bool or its spelling on the command line) as None (the
    machine's own kernels), "avx2" or "vendors" (AVX2 and MKL's vendor-neutral path)."""
    return PORTABLE_LEVELS[str(value).lower()]


def job_environment(hub_offline: bool, portable: str | None, **machine) -> dict[str, str]:
    """The variables every job's command starts with (`portable`: portable_level's; `machine`:
    portable_environment's, for tests)."""
    environment = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"} if hub_offline else {}
    environment["SYMFUSION_USAGE"] = "1"        # every job's log ends with its command's CPU usage line
    if portable:
        capped = portable_environment(**machine)
        environment.update(capped)
        if portable == "vendors" and capped:
            environment.update(ACROSS_VENDORS)
    return environment
