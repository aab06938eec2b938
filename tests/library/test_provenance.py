"""Provenance names the CPU's vendor and model: MKL computes otherwise on Intel and AMD CPUs, portable or not, so an
audit of two runs must be able to tell them apart (docs/reproduce.md#determinism)."""
from symfusion.io.provenance import cpu_model, machine

INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 167
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu avx2 avx512f

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: another
"""
AMD = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC 9R14\n"


def test_cpu_model_reads_the_first_processors_vendor_family_model_and_name(tmp_path):
    for text, expected in ((INTEL, "GenuineIntel family 6 model 167: Intel(R) Xeon(R) Processor"),
                           (AMD, "AuthenticAMD family 25 model 17: AMD EPYC 9R14")):
        (tmp_path / "cpuinfo").write_text(text)
        assert cpu_model(str(tmp_path / "cpuinfo")) == expected


def test_cpu_model_is_none_without_a_cpuinfo_or_a_vendor(tmp_path):
    assert cpu_model(str(tmp_path / "absent")) is None
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nBogoMIPS\t: 48.00\n")      # e.g. an ARM machine
    assert cpu_model(str(tmp_path / "cpuinfo")) is None


def test_every_result_records_the_cpu():
    assert "cpu" in machine()
