"""allocator.keep_freed_memory: freed blocks are reused instead of being faulted in afresh by the kernel."""
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from symfusion.pipeline import cli

SRC = Path(__file__).resolve().parents[2] / "src"

# Two 16 MB blocks allocated and freed 20 times: glibc's defaults trim the freed heap top each time, so
# every round faults its pages in again; with keep_freed_memory the second round on reuses the same pages.
PROGRAM = """
import resource, sys
import numpy as np
sys.path.insert(0, {src!r})
from symfusion.pipeline.allocator import keep_freed_memory
tuned = keep_freed_memory() if sys.argv[1] == "tuned" else None
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    a = np.ones(2_000_000); b = np.ones(2_000_000); del a, b
before = faults()
for _ in range(20):
    a = np.ones(2_000_000); b = np.ones(2_000_000); del a, b
print(tuned, faults() - before)
"""


def page_faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PROGRAM.format(src=str(SRC)), mode], check=True,
                         capture_output=True, text=True).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's; elsewhere keep_freed_memory is a documented no-op")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    _, default_faults = page_faults("default")
    tuned, tuned_faults = page_faults("tuned")
    assert tuned == "True"
    assert default_faults > 20 * 100        # every round faults pages in again (measured: ~1,100 a round)
    assert tuned_faults < default_faults / 20


def test_every_stage_entry_point_sets_the_allocator(monkeypatch):
    calls = []
    monkeypatch.setattr(cli, "keep_freed_memory", lambda: calls.append(1))
    with pytest.raises(SystemExit):
        cli.report_main(["--cfg"])
    assert calls == [1]
