"""Every setup path installs torch's CPU build, at the pinned version, before anything that depends on torch.

PyPI's Linux wheel of torch is the CUDA build (several GB with its NVIDIA libraries), and the project's own
`torch>=2.4` would let pip pick it: scripts/setup.sh (the README's quick start and CI), the README's by-hand
install and environment.yml must each name the CPU build first. The last test shows the check failing on each
kind of mistake.
"""
from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
FENCE = re.compile(r"^```bash\n(.*?)^```", re.M | re.S)


def pinned_version() -> str:
    """setup.sh's TORCH_VERSION: the one version every path pins."""
    return re.search(r"(?m)^TORCH_VERSION=(\S+)$", (ROOT / "scripts" / "setup.sh").read_text()).group(1)


def install_problems(lines: list[str], version: str) -> list[str]:
    """What is wrong with a sequence of install lines (pip commands, or a requirements list): the first line that
    installs torch or the project must install torch=={version} from the CPU index (or as its +cpu build)."""
    installs = [line for line in lines if re.search(r"\btorch\b|(^|\s)(-e\s+)?\.(\[|\s|$)|'\.\[", line)]
    if not installs:
        return ["installs neither torch nor the project"]
    first = installs[0]
    if not re.search(rf"\btorch=={re.escape(version)}(\+cpu)?(\s|$)", first):
        return [f"the first install is not torch=={version}: {first!r}"]
    cpu = first.endswith("+cpu") or f"torch=={version}+cpu" in first or CPU_INDEX in first
    if not cpu or not any(CPU_INDEX in line for line in lines[:lines.index(first) + 1]):
        return [f"torch=={version} is not the CPU build from {CPU_INDEX}: {first!r}"]
    return []


def readme_by_hand() -> list[str]:
    """The README's by-hand install block: the fenced bash block whose lines start with `pip install`."""
    readme = (ROOT / "README.md").read_text()
    blocks = [block.splitlines() for block in FENCE.findall(readme)]
    return next(lines for lines in blocks if lines and all(line.startswith("pip install") for line in lines))


def environment_pip() -> list[str]:
    """environment.yml's pip list, as conda hands it to pip (one requirements line each)."""
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    return next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)


def test_setup_sh_installs_the_cpu_build_before_the_project():
    text = (ROOT / "scripts" / "setup.sh").read_text()
    torch_line = text.index('"torch==$TORCH_VERSION" $(torch_cpu_index python)')
    assert torch_line < text.index('pip install --quiet -e ".[pipeline,merge,dev]"')
    assert CPU_INDEX in (ROOT / "scripts" / "torch_cpu_index.sh").read_text()


def test_the_readme_by_hand_install_pins_the_cpu_build_first():
    assert install_problems(readme_by_hand(), pinned_version()) == []


def test_environment_yml_pins_the_cpu_build_first():
    assert install_problems(environment_pip(), pinned_version()) == []


def test_the_check_fails_on_each_kind_of_mistake():
    version = pinned_version()
    assert install_problems(["pip install .", f"pip install torch=={version} --index-url {CPU_INDEX}"], version)
    assert install_problems(["pip install torch", "pip install ."], version)
    assert install_problems([f"pip install torch=={version}", "pip install ."], version)     # PyPI: the CUDA build
    assert install_problems(["pip install torch==2.0.0 --index-url " + CPU_INDEX, "pip install ."], version)
    assert install_problems([f"torch=={version}", "-e .[pipeline]"], version)                 # environment.yml, no index
    assert install_problems(["pip install numpy"], version)
    assert not install_problems([f"--extra-index-url {CPU_INDEX}", f"torch=={version}+cpu", "-e .[dev]"], version)
