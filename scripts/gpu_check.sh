#!/usr/bin/env bash
# The prepared GPU run (#44): machine facts, the emulator's FP16 errors against real CUDA FP16
# kernels (and TensorRT engines where it imports or installs), and the cost model against
# measured kernel times. One folder comes back: OUT/gpu_check.md and OUT/gpu_check.json.
# Under 10 minutes of wall time: every step has its own limit, no step starts after
# --budget-s (540 s), and this whole script is killed at 590 s.
#   bash scripts/gpu_check.sh [OUT] [gpu_check.py options, e.g. --device cpu --models demo]
# OUT defaults to $OUT (the device tool's folder that comes back), else gpu_check/.
# Carried (docs/tensorrt.md): .whl/ (onnx2torch's wheel, `make gpu-wheels`) and
# .bench_cache/models/magika.onnx (the real model; the machine may have no registry).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu_check}}"
shift || true
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/gpu_site .whl/*.whl \
    && export PYTHONPATH="/tmp/gpu_site:${PYTHONPATH:-}" \
    || echo "gpu_check: the carried wheels did not install; onnx2torch columns may be n/a" >&2
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"   # trtbisect from this checkout, no install needed
timeout -k 5 590 python3 scripts/gpu_check.py --out "$out" "$@"
rc=$?
[ "$rc" = 124 ] && echo "gpu_check: killed at 590 s; $out holds what was written" >&2
exit "$rc"
