#!/usr/bin/env bash
# The GPU proof, in one command on a machine with an NVIDIA GPU and PyTorch (about 8 minutes):
# builds the shim there, runs bench/collocation.py on the GPU first (latency isolation: a
# ResNet-18 function's p50/p99 alone, beside ResNet-34 training without control, with token-rate
# control and with Dilu's isolation, and training's throughput in each, for two loads), then
# bench/gpu_check.py (overhead at a 100 % share; absolute shares under one capacity with the
# closed loop on NVML: two matmuls at 30/70, two different models at 30/70, a DataLoader-fed
# training loop at 50 %).
#   bash bench/gpu_check.sh [--seconds 8]       (gpu_check.py's seconds; collocation runs 5 s a case)
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
PYTHONUNBUFFERED=1 python3 bench/collocation.py --device gpu --seconds 5
PYTHONUNBUFFERED=1 exec python3 bench/gpu_check.py "$@"
