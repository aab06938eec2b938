# Sourced by scripts/setup.sh and scripts/check_core_install.sh: `torch_cpu_index PYTHON` prints the pip options
# that fetch torch's CPU build. PyPI's Linux wheels of torch are the CUDA builds (several GB with their NVIDIA
# libraries); PyTorch's own index (TORCH_CPU_INDEX, default download.pytorch.org/whl/cpu) holds the CPU build and
# torch's dependencies. Where that index does not answer within 10 s (a machine that reaches only its package
# mirror, which then serves the build it has), it prints nothing and pip uses its configured index.
torch_cpu_index() {
  local index=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
  if "$1" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10)' \
       "$index" >/dev/null 2>&1; then
    echo "--index-url $index"
  fi
}
