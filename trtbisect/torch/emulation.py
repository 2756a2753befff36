"""Reduced-precision kernels emulated on any device: FP32 math on values stored in FP16
(BF16), every aten op's result rounded to the dtype the real op returns."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

_NATIVE_OPS = frozenset({torch.ops.aten._to_copy.default, torch.ops.aten.clone.default,
                         torch.ops.aten.detach.default, torch.ops.aten.lift_fresh.default})


class ReducedStorage(TorchDispatchMode):
    """FP32 math on values stored in a reduced dtype, on any device.

    Every aten op that reads a float16 (bfloat16) tensor runs on float32 copies; each result
    is rounded back to the dtype the real op returns (found by running the op on meta
    tensors). Views and in-place ops run natively. `on_overflow(op, count)` hears of every
    result that is finite in FP32 and infinite once stored.
    """

    def __init__(self, dtype: torch.dtype,
                 on_overflow: Callable[[str, int], None] | None = None) -> None:
        super().__init__()
        self.dtype = dtype
        self.on_overflow = on_overflow
        self.paused = False  # hooks measuring the run pause it: their ops are not the model's
        finfo = torch.finfo(dtype)
        top = float(finfo.max)
        # the smallest magnitude that rounds to inf: max + half an ulp at max
        self.overflow_at = top + (top - float(torch.nextafter(torch.tensor(top, dtype=dtype),
                                                               torch.tensor(0.0, dtype=dtype)))) / 2

    @contextmanager
    def pause(self) -> Iterator[None]:
        self.paused = True
        try:
            yield
        finally:
            self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused:
            return func(*args, **kwargs)
        leaves, _ = tree_flatten((args, kwargs))
        if not any(isinstance(t, torch.Tensor) and t.dtype == self.dtype for t in leaves):
            return func(*args, **kwargs)
        if func in _NATIVE_OPS or _aliases(func):
            out = func(*args, **kwargs)
            if func is torch.ops.aten._to_copy.default and self.on_overflow is not None:
                self._count(str(func.overloadpacket), args[0], out)
            return out
        dtypes = _result_dtypes(func, args, kwargs)
        up_args, up_kwargs = tree_map(self._up, (args, kwargs))
        out = func(*up_args, **up_kwargs)
        flat, spec = tree_flatten(out)
        if dtypes is None or len(dtypes) != len(flat):  # no meta kernel: follow the input
            dtypes = [self.dtype] * len(flat)
        rounded = []
        for value, want in zip(flat, dtypes):
            if isinstance(value, torch.Tensor) and want == self.dtype and value.is_floating_point():
                low = value.to(self.dtype)
                if self.on_overflow is not None:
                    self._count(str(func.overloadpacket), value, low)
                value = low
            rounded.append(value)
        return tree_unflatten(rounded, spec)

    def _up(self, value):
        if isinstance(value, torch.Tensor) and value.dtype == self.dtype:
            return value.float()
        return value

    def _count(self, op: str, full, low) -> None:
        """Values finite in `full` (FP32) that became inf in `low`, judged on `full` alone
        (CPU half kernels such as isinf are slow)."""
        if not (isinstance(full, torch.Tensor) and isinstance(low, torch.Tensor)
                and full.dtype in (torch.float32, torch.float64) and low.dtype == self.dtype):
            return
        mag = full.abs()
        n = int(((mag >= self.overflow_at) & (mag < math.inf)).sum())
        if n and self.on_overflow is not None:
            self.on_overflow(op, n)


def _aliases(func) -> bool:
    schema = func._schema
    return schema.is_mutable or any(r.alias_info is not None for r in schema.returns)


def _result_dtypes(func, args, kwargs) -> list[torch.dtype | None] | None:
    def meta(v):
        return v.to("meta") if isinstance(v, torch.Tensor) else v
    try:
        out = func(*tree_map(meta, args), **tree_map(meta, kwargs))
    except Exception:  # no meta kernel, data-dependent shapes, ...
        return None
    return [v.dtype if isinstance(v, torch.Tensor) else None for v in tree_flatten(out)[0]]
