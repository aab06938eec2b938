#!/usr/bin/env bash
# Make a working tree of Generalized LMC's code (Theus et al., github antoniohonsell/Generalized-LMC-for-Transformers)
# and a Python environment that runs it, both OUTSIDE this repository, for benchmarks/bench_glmc.py.
#
#   benchmarks/glmc/setup_glmc.sh CHECKOUT_DIR VENV_DIR [GIT_SOURCE]
#
# CHECKOUT_DIR  a new folder: a clone of their repository at the pinned commit below (never vendored here: their
#               repository has no licence, so symfusion only calls it).
# VENV_DIR      a new folder: a virtual environment with what their merger imports. Their requirements.txt lists
#               torch, numpy, datasets, transformers==4.50.1, matplotlib, einops, POT, safetensors, wandb,
#               accelerate; GPTMerger (merger.py, utils.py, weight_matching.py, enums.py) needs only torch,
#               transformers 4.50.1, einops, POT (and its scipy, numpy) and safetensors, and their learned merger's
#               training (transformers' Trainer, as their train_merger.py drives it) needs accelerate, so only these
#               are installed: torch 2.13.0 first (the CPU wheel this machine's pip finds locally), then the rest.
#               wandb, datasets and matplotlib are NOT installed: the driver (benchmarks/glmc/glmc_driver.py) never
#               imports train.py, train_merger.py or eval.py (train_merger.py imports wandb and datasets at its top); it
#               builds their GPTMerger and GPTMergerWrapper itself and trains them with the Trainer arguments
#               train_merger.py sets, on our blocks (bench_glmc.py --theirs-learned).
# GIT_SOURCE    where to clone from: the fetched mirror by default, or the GitHub URL.
#
# Neither folder may exist already: the script writes nothing over anything (exit 2 with one error line).
# No patch is applied: their data-free weight matching runs on our GPT-2 folders as it is (see docs/decoders.md,
# "Beside Generalized LMC's own code").
set -euo pipefail
PINNED=8c6f323b8e1402d9c353364f27d174b0adf2e80b       # their HEAD when measured ("new exp")
fail() { echo "error: $*" >&2; exit 2; }
[ $# -ge 2 ] && [ $# -le 3 ] || fail "usage: setup_glmc.sh CHECKOUT_DIR VENV_DIR [GIT_SOURCE]"
checkout=$1; venv=$2
source=${3:-/work/.mirror/antoniohonsell+Generalized-LMC-for-Transformers/repo}
[ -e "$checkout" ] && fail "$checkout exists; give a new folder for their checkout"
[ -e "$venv" ] && fail "$venv exists; give a new folder for the environment"
here=$(cd "$(dirname "$0")/../.." && pwd)
case "$(realpath -m "$checkout")/" in "$here"/*) fail "$checkout lies inside this repository; put it outside";; esac
case "$(realpath -m "$venv")/" in "$here"/*) fail "$venv lies inside this repository; put it outside";; esac
command -v python3.11 >/dev/null || fail "python3.11 not found (their README asks for Python 3.11)"

git clone --quiet --no-checkout "$source" "$checkout"
git -C "$checkout" checkout --quiet "$PINNED"
python3.11 -m venv "$venv"
"$venv/bin/pip" install --quiet torch==2.13.0
"$venv/bin/pip" install --quiet transformers==4.50.1 einops POT safetensors numpy scipy accelerate==1.6.0
"$venv/bin/python" - "$checkout" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import torch, transformers, ot, accelerate
from merger import GPTMerger, GPTMergerWrapper   # their entry points import cleanly
print(f"Generalized LMC ready: torch {torch.__version__}, transformers {transformers.__version__}, POT {ot.__version__}, "
      f"accelerate {accelerate.__version__}")
PY
