#!/usr/bin/env bash
# The prepared GPU run (#44): machine facts, the emulator's FP16 errors against real CUDA FP16
# kernels (and TensorRT where it imports), and the cost model against measured kernel times.
# One folder comes back: OUT/gpu_check.md and OUT/gpu_check.json. Under 10 minutes of wall time:
# every step has its own limit and the whole run stops starting steps after --budget-s.
#   bash scripts/gpu_check.sh [OUT] [--device cpu]     (OUT defaults to $OUT, else gpu_check/)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu_check}}"
shift || true
# wheels carried in .whl (docs/tensorrt.md): onnx2torch for the real-kernel columns
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu_site .whl/*.whl \
    && export PYTHONPATH="/tmp/gpu_site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"   # trtbisect from this checkout, no install needed
timeout 590 python3 scripts/gpu_check.py --out "$out" "$@"
