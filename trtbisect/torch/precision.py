"""The reduced precision a `trtbisect torch` run uses (mode, dtype, device, kernels) and the
context that runs a model in it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch

from ..errors import TrtBisectError
from .emulation import ReducedStorage
from .snippet import _to_dtype

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
MODES = ("autocast", "half")


@dataclass(frozen=True)
class Precision:
    mode: str = "autocast"  # "autocast" | "half"
    dtype: str = "fp16"  # "fp16" | "bf16"
    device: str = "cpu"
    emulate: bool = True  # CPU default; real kernels otherwise

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def max_value(self) -> float:
        return float(torch.finfo(self.torch_dtype).max)

    @property
    def execution(self) -> str:
        return f"{self.device}-{'emulated' if self.emulate else 'native'}"

    def describe(self) -> str:
        kernels = ("emulated kernels: FP32 math, every op's result stored in "
                   f"{self.dtype.upper()}" if self.emulate else "real kernels")
        return f"{self.mode} {self.dtype} on {self.device}, {kernels}"

    def to_json(self) -> dict:
        return {"mode": self.mode, "dtype": self.dtype, "device": self.device,
                "kernels": "emulated" if self.emulate else "native",
                "execution": self.execution}


def pick_precision(mode: str = "autocast", dtype: str = "fp16", device: str | None = None,
                   kernels: str = "auto") -> Precision:
    """Validate the user's choice: CUDA when asked for and present, emulation on CPU."""
    if mode not in MODES:
        raise TrtBisectError(f"unknown mode {mode!r}: use autocast or half")
    if dtype not in DTYPES:
        raise TrtBisectError(f"unknown dtype {dtype!r}: use fp16 or bf16")
    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise TrtBisectError("--device cuda: torch.cuda.is_available() is False here; "
                             "use --device cpu (emulated FP16 kernels)")
    if device not in ("cpu", "cuda"):
        raise TrtBisectError(f"unknown device {device!r}: use cuda or cpu")
    emulate = {"auto": device == "cpu", "emulated": True, "native": False}.get(kernels)
    if emulate is None:
        raise TrtBisectError(f"unknown kernels {kernels!r}: use auto, emulated or native")
    return Precision(mode, dtype, device, emulate)


def reduced_args(p: Precision, args: tuple) -> tuple:
    """Half mode feeds the model reduced-precision inputs; autocast casts inside."""
    return _to_dtype(args, p.torch_dtype) if p.mode == "half" else args


@contextmanager
def reduced(p: Precision, on_overflow: Callable[[str, int], None] | None = None
            ) -> Iterator[ReducedStorage | None]:
    """No grad; autocast in autocast mode; emulated kernels (yielded) when asked for."""
    with ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        if p.mode == "autocast":
            stack.enter_context(torch.autocast(p.device, dtype=p.torch_dtype))
        storage = None
        if p.emulate:
            storage = stack.enter_context(ReducedStorage(p.torch_dtype, on_overflow))
        yield storage
