#!/usr/bin/env bash
# Type-check trtbisect/backends/trt.py against NVIDIA's TensorRT 10.13 API without TensorRT.
#
# The stubs come from the `tensorrt-stubs` package. It installs `tensorrt/__init__.pyi` and
# `tensorrt_bindings/tensorrt.pyi` with no py.typed marker (hence --follow-untyped-imports), and
# the generated tensorrt.pyi has two syntax slips mypy refuses: parameters named `in`, and
# `channel_axis: int` without a default after defaulted parameters in `add_scale_nd`. They are
# patched with sed after installing.
#
# The stubs go into a private virtual environment (with the system site-packages visible, for
# numpy and onnx), not into the environment that runs trtbisect: a `tensorrt/` directory holding
# only an .pyi file would make `import tensorrt` succeed there as an empty namespace package.
#
# TensorRT 11 has no published stubs; its path in trt.py is small and guarded by version checks.
set -euo pipefail
cd "$(dirname "$0")/.."

STUBS_VERSION="10.13.0.35.1"
PYTHON="${PYTHON:-python3}"
VENV="${TRT_STUBS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/trtbisect/tensorrt-stubs-$STUBS_VERSION}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv --system-site-packages "$VENV"
fi
if ! "$VENV/bin/python" -m pip show --quiet tensorrt-stubs >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
        "tensorrt-stubs==$STUBS_VERSION"
fi

SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
PYI="$SITE/tensorrt_bindings/tensorrt.pyi"
test -f "$PYI" || { echo "error: $PYI not found after installing tensorrt-stubs" >&2; exit 2; }
# Idempotent: patched text no longer matches either pattern.
sed -i -E \
    -e 's/, in: /, in_: /g' \
    -e 's/^(    def add_scale_nd\(.*channel_axis: int)\)/\1 = ...)/' \
    "$PYI"

"$VENV/bin/python" -m mypy --version
# --follow-imports=silent: report trt.py and trt_layers.py only, not modules they import.
"$VENV/bin/python" -m mypy --follow-untyped-imports --follow-imports=silent \
    trtbisect/backends/trt.py trtbisect/trt_layers.py
