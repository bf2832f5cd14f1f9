#!/usr/bin/env bash
# The GPU proof, in one command on a machine with an NVIDIA GPU and PyTorch (at most ~8 minutes):
# builds the shim there, then runs bench/gpu_check.py (overhead; absolute shares under one
# capacity with the closed loop on NVML: two matmuls at 30/70, two different models at 30/70, a
# DataLoader-fed training loop at 50 %; latency p99 alone / collocated without control /
# collocated with Dilu's control).
#   bash bench/gpu_check.sh [--seconds 10]
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ -z "${CUDA_HOME:-}" ]; then
  if command -v nvcc >/dev/null; then CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")"); else CUDA_HOME=/usr/local/cuda; fi
fi
make -s -C shim CUDA_HOME="$CUDA_HOME" all check >/dev/null
echo "shim built against $CUDA_HOME/include/cuda.h; exports: $(wc -l < shim/build/exports.txt) entry points"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0))'
# A GPU worker's runtime pool starts spares with the shim preloaded and tells each its instance
# later; that works only if importing torch makes no driver call (the shim reads its
# configuration at the first one).
probe=$(LD_PRELOAD="$PWD/shim/build/libdilu_shim.so" DILU_SHIM_LOG=2 \
  python3 -c 'import sys, torch; print("imported", file=sys.stderr)' 2>&1 | grep -E "configured|imported" | head -1 || true)
case "$probe" in
  imported) echo "runtime pool: importing torch left the shim unconfigured (a spare can become any GPU instance)" ;;
  *) echo "WARNING: importing torch made the shim read its configuration ($probe): GPU spares would run ungated" ;;
esac
PYTHONUNBUFFERED=1 exec python3 bench/gpu_check.py "$@"
