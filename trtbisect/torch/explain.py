"""Why each module of the plan is kept FP32, in one line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from .layerwise import ModuleStats
from .result import TorchCulprit
from .runner import TorchRunner


def explain(runner: TorchRunner, stats: Mapping[str, ModuleStats],
            fp32: Sequence[str]) -> list[TorchCulprit]:
    out = []
    for path in fp32:
        s = stats.get(path)
        cls = s.cls if s else type(runner.modules[path]).__name__
        out.append(TorchCulprit(path, cls, _why(runner, stats, path)))
    return out


def _why(runner: TorchRunner, stats: Mapping[str, ModuleStats], path: str) -> str:
    p = runner.p
    name, top = p.dtype.upper(), f"{p.max_value:.6g}"
    s = stats.get(path)
    if s is None:
        return "needed by the tolerance"
    if s.overflow_ops:
        op, n = max(s.overflow_ops.items(), key=lambda kv: kv[1])
        return f"{op} overflows {name} here ({n} values beyond {top})"
    inner = [q for q in stats.values() if q.module.startswith(path + ".") and q.out_of_range]
    if inner and p.mode == "half":
        q = inner[0]
        return f"keeps {q.module}'s output (max {q.fp32_absmax:.3g}) out of {name}"
    if s.out_of_range:
        return f"output max {s.fp32_absmax:.3g} > {top}"
    flushed = _flushed_tensors(runner, path)
    if flushed and p.mode == "half":
        return f"{flushed} flush to zero in {name}"
    if inner or [q for q in stats.values() if q.module.startswith(path + ".") and q.overflow_ops]:
        q = (inner or [q for q in stats.values() if q.module.startswith(path + ".")
                       and q.overflow_ops])[0]
        return f"contains {q.module}, where {name} overflows"
    if s.nonfinite_origin:
        return f"output turns non-finite in {name} ({s.new_nonfinite} values)"
    return f"{name} error grows here to {s.rel_err:.2g} of the output's range"


def _flushed_tensors(runner: TorchRunner, path: str) -> str:
    """`running_var (4 values)` for own weights whose nonzero values round to zero."""
    tiny = float(torch.finfo(runner.p.torch_dtype).smallest_normal) * 2.0**-10 / 2
    if runner.p.dtype == "bf16":
        tiny = float(torch.finfo(torch.bfloat16).smallest_normal) * 2.0**-7 / 2
    parts = []
    for (owner, name), t in runner.full.items():
        if owner == path:
            n = int(((t != 0) & (t.abs() <= tiny)).sum())
            if n:
                parts.append(f"{name} ({n} value{'s' if n > 1 else ''})")
    return ", ".join(parts)
