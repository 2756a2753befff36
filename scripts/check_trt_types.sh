#!/usr/bin/env bash
# Type-check trtbisect/backends/trt.py and trt_layers.py against NVIDIA's TensorRT 10.13 API
# without TensorRT.
#
# The stubs come from the `tensorrt-stubs` package: `tensorrt/__init__.pyi` and
# `tensorrt_bindings/tensorrt.pyi`. They are installed with `pip --target` into a directory of
# their own and handed to mypy through MYPYPATH, never into an environment that runs trtbisect:
# a `tensorrt/` directory holding only an .pyi file would make `import tensorrt` succeed there as
# an empty namespace package. The generated tensorrt.pyi has two syntax slips mypy refuses:
# parameters named `in`, and `channel_axis: int` without a default after defaulted parameters in
# `add_scale_nd`; they are patched with sed after installing.
#
# PYTHON is the interpreter whose environment has mypy, numpy and onnx (CI: its fresh venv).
# TensorRT 11 has no published stubs; its path in trt.py is small and guarded by version checks.
set -euo pipefail
cd "$(dirname "$0")/.."

STUBS_VERSION="10.13.0.35.1"
PYTHON="${PYTHON:-python3}"
STUBS="${TRT_STUBS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/trtbisect/tensorrt-stubs-$STUBS_VERSION}"
PYI="$STUBS/tensorrt_bindings/tensorrt.pyi"

if [ ! -f "$PYI" ]; then
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --target "$STUBS" \
        "tensorrt-stubs==$STUBS_VERSION"
fi
test -f "$PYI" || { echo "error: $PYI not found after installing tensorrt-stubs" >&2; exit 2; }
# Idempotent: patched text no longer matches either pattern.
sed -i -E \
    -e 's/, in: /, in_: /g' \
    -e 's/^(    def add_scale_nd\(.*channel_axis: int)\)/\1 = ...)/' \
    "$PYI"

"$PYTHON" -m mypy --version
# --follow-imports=silent: report trt.py and trt_layers.py only, not modules they import.
MYPYPATH="$STUBS" "$PYTHON" -m mypy --follow-imports=silent \
    trtbisect/backends/trt.py trtbisect/judge/trt_layers.py
