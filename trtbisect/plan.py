"""The precision plan (which nodes stay FP32) and every rendering of it.

One plan, many views: a trtexec `--layerPrecisions` string (TensorRT 10), Polygraphy's
`--layer-precisions`, a ModelOpt AutoCast `nodes_to_exclude` list, and the strongly typed mixed
ONNX model that TensorRT 11 builds (`write_mixed_onnx`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import onnx

from .mixed import write_mixed_onnx

__all__ = ["PrecisionPlan", "write_mixed_onnx", "atomic_write",
           "atomic_write_text", "save_model"]


@dataclass(frozen=True)
class PrecisionPlan:
    fp32_nodes: tuple[str, ...]

    def layer_precisions(self) -> str:
        """trtexec `--layerPrecisions` value (TensorRT 10 layer names follow ONNX node names)."""
        return ",".join(f"{n}:fp32" for n in self.fp32_nodes)

    def trtexec_command(self, onnx_path: str, engine_path: str = "model.plan") -> str:
        args = ["trtexec", f"--onnx={onnx_path}", f"--saveEngine={engine_path}", "--fp16"]
        if self.fp32_nodes:
            args += ["--precisionConstraints=obey", f"--layerPrecisions={self.layer_precisions()}",
                     f"--layerOutputTypes={','.join(f'{n}:fp32' for n in self.fp32_nodes)}"]
        return shlex.join(args)

    def trtexec11_command(self, mixed_path: str, engine_path: str = "model.plan") -> str:
        return shlex.join(["trtexec", f"--onnx={mixed_path}", "--stronglyTyped",
                           f"--saveEngine={engine_path}"])

    def polygraphy_command(self, onnx_path: str) -> str:
        args = ["polygraphy", "run", onnx_path, "--trt", "--onnxrt", "--fp16"]
        if self.fp32_nodes:
            args += ["--precision-constraints", "obey", "--layer-precisions",
                     *[f"{n}:float32" for n in self.fp32_nodes]]
        return shlex.join(args)

    def autocast_exclude(self) -> list[str]:
        """ModelOpt AutoCast takes regular expressions over node names."""
        return [f"^{re.escape(n)}$" for n in self.fp32_nodes]

    def autocast_command(self, onnx_path: str) -> str:
        args = ["python", "-m", "modelopt.onnx.autocast", f"--onnx_path={onnx_path}",
                "--low_precision_type=fp16"]
        if self.fp32_nodes:
            args += ["--nodes_to_exclude", *self.autocast_exclude()]
        return shlex.join(args)


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Write through a temporary file in the same folder, then rename: never a half file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
    atomic_write(path, write)


def atomic_write_json(path: Path, data: object) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def save_model(path: Path, model: onnx.ModelProto) -> None:
    atomic_write(path, lambda tmp: onnx.save(model, tmp))
