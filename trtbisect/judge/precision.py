"""The low precision a plan targets: FP16 or BF16, one value threaded through the judge.

What depends on the target precision reads it from here: the emulator's rounding Casts
and the weight conversion (backends/ort.py, semantics.round_weight), the mixed ONNX's low type
(mixed.py), the range and spacing that diagnosis quotes (compare.py, search/prior.py, detect.py,
wording.py) and the tools' precision flags (render.py). cost.py prices a BF16 layer at the FP16
tensor-core rate (the GPUs it prices list the same rate for both; docs/bf16.md).
`--precision fp16` (the default) is FP16 exactly as before, bit for bit; `--precision bf16` is
bfloat16 (8 exponent bits, as FP32; 7 fraction bits).

Rounding is IEEE round to nearest even in both, overflow to +-inf, subnormals kept: what
`Cast(to=FLOAT16|BFLOAT16)` does on ONNX Runtime's CPU provider (BF16 checked bit for bit
against ml_dtypes' conversion, tests/judge/test_precision.py) and what CUDA's `__float2half_rn` /
`__float2bfloat16` conversions do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
from onnx import TensorProto

from ..errors import TrtBisectError

PRECISIONS = ("fp16", "bf16")  # --precision (run also takes "both")
BOTH = "both"
QUANTIZED = ("int8", "fp8")  # run only: quantize with ModelOpt, then bisect (trtbisect/quant/)


@dataclass(frozen=True)
class Precision:
    """One low-precision float format and the names every tool gives it."""

    name: str  # "fp16" | "bf16": --precision, precision.json, evidence keys, file suffixes
    label: str  # "FP16" | "BF16": in sentences
    onnx_type: int  # TensorProto element type of the mixed ONNX's low-precision tensors
    dtype: Any  # numpy dtype (ml_dtypes.bfloat16 for BF16)
    max: float  # largest finite value
    min_normal: float  # smallest positive normal value
    tiny: float  # smallest positive subnormal value
    fraction_bits: int  # explicit mantissa bits (10: FP16, 7: BF16)
    max_text: str  # how sentences write `max` ("65504")
    tiny_text: str  # how sentences write `tiny` ("6e-8")
    trt_type: str  # tensorrt.DataType member ("float16", "bfloat16")
    builder_flag: str  # tensorrt.BuilderFlag member (TensorRT 10 weak typing)
    trtexec_flag: str  # trtexec's flag enabling the precision (TensorRT 10)
    polygraphy_flag: str  # polygraphy run's flag
    autocast_type: str  # ModelOpt AutoCast --low_precision_type
    torch_dtype: str  # torch dtype name ("float16", "bfloat16")
    min_opset: int = 1  # the first default-domain opset whose Cast takes this type

    @property
    def narrow_range(self) -> bool:
        """True when the format cannot hold FP32's range (FP16): range faults are its own."""
        return self.max < float(np.finfo(np.float32).max) / 2

    @property
    def overflow_at(self) -> float:
        """The smallest magnitude a store rounds to inf: max plus half an ulp at max (a tie
        goes to the even neighbour, which is inf)."""
        return self.max + 2.0 ** (math.floor(math.log2(self.max)) - self.fraction_bits - 1)

    @property
    def flush_at(self) -> float:
        """The largest magnitude a store rounds to zero: half the smallest subnormal."""
        return self.tiny / 2

    def round(self, x: np.ndarray) -> np.ndarray:
        """What a store in this precision does to float32 values (RNE, overflow to inf), as
        float32."""
        with np.errstate(over="ignore", invalid="ignore"):
            return np.asarray(x, dtype=np.float32).astype(self.dtype).astype(np.float32)

    def spacing(self, x: float) -> float:
        """Distance between neighbouring values of this precision near |x| (0 for 0, inf or
        NaN): 2^(floor(log2 |x|) - fraction bits), at least the subnormals' spacing."""
        if not math.isfinite(x) or x <= 0:
            return 0.0
        return 2.0 ** (max(math.floor(math.log2(x)), round(math.log2(self.min_normal)))
                       - self.fraction_bits)

    def key(self, base: str) -> str:
        """An evidence key carrying the precision's name (`spacing` -> `fp16_spacing`)."""
        return f"{self.name}_{base}"

    def to_json(self) -> dict:
        return {"name": self.name, "max": self.max, "min_normal": self.min_normal,
                "smallest_subnormal": self.tiny, "fraction_bits": self.fraction_bits}

    @classmethod
    def from_json(cls, d: Mapping) -> Precision:
        """The precision a precision.json names (one of FP16, BF16: the record is its own)."""
        return precision(d["name"])


FP16 = Precision(
    "fp16", "FP16", TensorProto.FLOAT16, np.dtype(np.float16), 65504.0, 2.0**-14, 2.0**-24, 10,
    "65504", "6e-8", "float16", "FP16", "--fp16", "--fp16", "fp16", "float16")
BF16 = Precision(
    "bf16", "BF16", TensorProto.BFLOAT16, np.dtype(ml_dtypes.bfloat16),
    float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), 2.0**-126, 2.0**-133, 7,
    "3.39e38", "9.2e-41", "bfloat16", "BF16", "--bf16", "--bf16", "bf16", "bfloat16", 13)
BY_NAME = {p.name: p for p in (FP16, BF16)}


def precision(name: str | Precision) -> Precision:
    """The Precision called `name` (one already made passes through)."""
    if isinstance(name, Precision):
        return name
    try:
        return BY_NAME[name]
    except KeyError:
        raise TrtBisectError(f"unknown precision {name!r}: choose one of "
                             f"{', '.join(PRECISIONS)} (e.g. --precision bf16)") from None


def of_type(onnx_type: int) -> Precision | None:
    """The Precision whose ONNX element type this is (None for any other type)."""
    return next((p for p in BY_NAME.values() if p.onnx_type == onnx_type), None)


def precision_option(both: bool = False) -> Callable:
    """`--precision`, shared by run, compare and check (cli.input_options) and torch;
    `both`: the command takes `both` too (run), and only then does its help offer it."""
    import click

    return click.option(
        "--precision", type=click.Choice([*PRECISIONS, *([BOTH, *QUANTIZED] if both else [])]),
        default=FP16.name, show_default=True,
        help="The low precision plans target: fp16, or bf16 (bfloat16: FP32's range, 8 "
             "significant bits; TensorRT 10 --bf16, a bfloat16 mixed ONNX for TensorRT 11)"
             + (". both: judge both and show them side by side; int8|fp8: quantize with "
                "ModelOpt's ONNX PTQ on the samples, then find the layers to leave "
                "un-quantized (docs/quantization.md)" if both else "")
             + " (docs/bf16.md). `check` infers it from the file when not given.")


def of_file(model: Any) -> str | None:
    """The precision a mixed-precision file was written for: bf16 when it holds bfloat16
    tensors and no float16 ones, fp16 for the reverse, None when it says neither (`check`
    without --precision)."""
    from ..graph import walk_graphs

    seen: set[int] = set()
    for g in walk_graphs(model.graph):
        seen.update(t.data_type for t in g.initializer)
        seen.update(v.type.tensor_type.elem_type for v in [*g.input, *g.output, *g.value_info])
        for n in g.node:
            if n.op_type == "Cast":
                seen.update(a.i for a in n.attribute if a.name == "to")
    halves = {p.name for p in BY_NAME.values() if p.onnx_type in seen}
    return halves.pop() if len(halves) == 1 else None


def one_precision(name: str, both: bool = False) -> None:
    """Refuse `both` where a command judges one precision only (a usage error)."""
    if name in QUANTIZED and not both:
        raise TrtBisectError(f"--precision {name} is for `trtbisect run` (it quantizes the "
                             "model, then bisects it); give fp16 or bf16 here")
    if name == BOTH and not both:
        raise TrtBisectError("--precision both is for `trtbisect run` (it judges FP16 and BF16 "
                             "side by side); give fp16 or bf16 here")
