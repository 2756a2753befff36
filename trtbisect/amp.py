"""The module-level AMP product (`trtbisect torch`): run an nn.Module in FP32 and in reduced
precision with chosen submodules kept FP32, compare it module by module through forward hooks,
and search for the smallest set of submodules to keep FP32 with the same search (and the same
`search.Oracle`) as `trtbisect run`. Not a backend: it plans modules, not ONNX nodes, so it
lives outside `backends/`.

A plan is a set of dotted module paths (as `named_modules()` names them). It means what
`apply_plan` does, and `apply_plan` is also what the user pastes (rendered verbatim into
fp32_plan.py), so the verified plan and the shipped code cannot drift apart:

* mode "half" (`model.half()`): every parameter and buffer outside the plan is stored in the
  reduced dtype; each planned module gets FP32 weights, runs on FP32 copies of its inputs, and
  casts its outputs back to its inputs' dtype (the CLIP `LayerNorm` idiom);
* mode "autocast" (AMP): weights stay FP32; each planned module runs with autocast disabled on
  FP32 inputs and returns FP32.

Kernels: on CUDA the real ones. On CPU, by default, an emulation that does what a GPU kernel
does with FP16 data: FP32 math on values stored in FP16, every aten op's result rounded to the
dtype the real op returns (`ReducedStorage`): the ORT emulator's semantics, per op. CPU
autocast's op lists (which ops it runs in FP16) differ from CUDA's: see docs/pytorch.md.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import json
import logging
import math
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from .compare import OutputError, Tolerance, worst
from .errors import EXIT_NO_PLAN, EXIT_OK, EXIT_REFERENCE_INVALID, TrtBisectError
from .export import Sample, TorchModel, flatten_outputs, to_numpy
from .judge.criteria import Criteria
from .modules import ancestors, within
from .search import Progress, SearchResult, find_minimal_fp32

log = logging.getLogger(__name__)

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
MODES = ("autocast", "half")
VERDICT_EXIT = {"fp16_ok": EXIT_OK, "fixed": EXIT_OK, "reference_invalid": EXIT_REFERENCE_INVALID,
                "no_plan": EXIT_NO_PLAN}
# Modules that compute nothing a reduced dtype could change (moves, max, exact clamps):
# keeping one FP32 never fixes anything, so they are not search candidates.
EXACT_MODULES = frozenset({
    "Identity", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "Flatten",
    "Unflatten", "ReLU", "ReLU6", "Hardtanh", "MaxPool1d", "MaxPool2d", "MaxPool3d",
    "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "ZeroPad1d", "ZeroPad2d",
    "ZeroPad3d", "ConstantPad1d", "ConstantPad2d", "ConstantPad3d", "ReflectionPad1d",
    "ReflectionPad2d", "ReplicationPad1d", "ReplicationPad2d", "PixelShuffle", "PixelUnshuffle",
    "ChannelShuffle"})


# ---------------------------------------------------------------- the plan, as users apply it
# Everything from here to the emulation is copied verbatim into fp32_plan.py: torch and
# functools only, no trtbisect.

def apply_plan(model, fp32_modules, mode="half", dtype=torch.float16):
    """Keep `fp32_modules` (dotted paths, as named_modules() lists them) in FP32.

    mode "half": stores every other parameter and buffer in `dtype` (what model.to(dtype) does);
    each listed module gets FP32 weights, runs on FP32 copies of its inputs and casts its
    outputs back to its inputs' dtype. Feed the model inputs of `dtype`.
    mode "autocast": weights stay FP32; each listed module runs with autocast disabled on FP32
    inputs and returns FP32. Call the model under torch.autocast(...).
    Changes `model` in place (apply it to a copy to keep the original) and returns it.
    """
    names = list(fp32_modules)
    modules = {name: model.get_submodule(name) for name in names}  # fails early on a typo
    if mode == "half":
        for path, module in model.named_modules():
            if not any(path == n or path.startswith(n + ".") for n in names):
                _convert_own_tensors(module, dtype)
            else:
                _convert_own_tensors(module, torch.float32)
    for module in modules.values():
        module.forward = _fp32_forward(module.forward, restore=(mode == "half"))
    return model


def _convert_own_tensors(module, dtype):
    for param in module.parameters(recurse=False):
        if param.is_floating_point():
            param.data = param.data.to(dtype)
    for name, buf in list(module.named_buffers(recurse=False)):
        if buf.is_floating_point():
            setattr(module, name, buf.to(dtype))


def _fp32_forward(forward, restore):
    """`forward` run in FP32: autocast off, float inputs as float32; with `restore`, float
    outputs cast back to the dtype of the first float input."""

    @functools.wraps(forward)
    def fp32_forward(*args, **kwargs):
        dtype = _first_float_dtype((args, kwargs))
        with torch.autocast(_device_type((args, kwargs)), enabled=False):
            out = forward(*_to_dtype(args, torch.float32), **_to_dtype(kwargs, torch.float32))
        if restore and dtype is not None and dtype != torch.float32:
            out = _to_dtype(out, dtype)
        return out

    return fp32_forward


def _to_dtype(value, dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(_to_dtype(v, dtype) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_to_dtype(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _to_dtype(v, dtype) for k, v in value.items()}
    return value


def _first_float_dtype(value):
    if isinstance(value, torch.Tensor):
        return value.dtype if value.is_floating_point() else None
    items = value.values() if isinstance(value, dict) else value
    if isinstance(value, (list, tuple, dict)):
        for v in items:
            found = _first_float_dtype(v)
            if found is not None:
                return found
    return None


def _device_type(value):
    if isinstance(value, torch.Tensor):
        return value.device.type
    if isinstance(value, (list, tuple, dict)):
        for v in (value.values() if isinstance(value, dict) else value):
            if isinstance(v, (torch.Tensor, list, tuple, dict)):
                found = _device_type(v)
                if found != "cpu":
                    return found
    return "cpu"


SNIPPET_FUNCTIONS = (apply_plan, _convert_own_tensors, _fp32_forward, _to_dtype,
                     _first_float_dtype, _device_type)


# ---------------------------------------------------------------- emulation

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


# ---------------------------------------------------------------- running plans

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


class TorchRunner:
    """One model and every precision plan of a search, on a private copy of the model."""

    def __init__(self, module: torch.nn.Module, precision: Precision) -> None:
        self.p = precision
        self.model = copy.deepcopy(module).float().eval().to(precision.device)
        self.modules = dict(self.model.named_modules())
        self.full: dict[tuple[str, str], torch.Tensor] = {}
        self.low: dict[tuple[str, str], torch.Tensor] = {}
        for path, m in self.modules.items():
            for name, t in [*m.named_parameters(recurse=False), *m.named_buffers(recurse=False)]:
                if t.is_floating_point():
                    self.full[(path, name)] = t.data
                    if precision.mode == "half":
                        self.low[(path, name)] = t.data.to(precision.torch_dtype)
        self.runs = 0

    def args(self, tm: TorchModel, sample: Sample) -> tuple:
        return tm.args(sample, self.p.device)

    def reference(self, args: tuple) -> dict[str, np.ndarray]:
        self._set_tensors(None)
        with torch.no_grad():
            return to_numpy(flatten_outputs(self.model(*args)))

    def run(self, fp32: frozenset[str], args: tuple) -> dict[str, np.ndarray]:
        """Outputs (float32 arrays) with `fp32` kept FP32 and the rest in reduced precision."""
        self.runs += 1
        with self.applied(fp32), self.reduced():
            out = self.model(*self.reduced_args(args))
        return to_numpy(flatten_outputs(out))

    def reduced_args(self, args: tuple) -> tuple:
        return reduced_args(self.p, args)

    def reduced(self, on_overflow: Callable[[str, int], None] | None = None):
        return reduced(self.p, on_overflow)

    @contextmanager
    def applied(self, fp32: frozenset[str]) -> Iterator[None]:
        """The plan, exactly as `apply_plan` makes it, undone afterwards."""
        unknown = [m for m in fp32 if m not in self.modules]
        if unknown:
            raise TrtBisectError(f"no module named {', '.join(sorted(unknown))} in the model")
        self._set_tensors(fp32)
        wrapped = []
        try:
            for name in sorted(fp32):
                m = self.modules[name]
                wrapped.append((m, m.__dict__.get("forward")))
                m.forward = _fp32_forward(m.forward, restore=self.p.mode == "half")
            yield
        finally:
            for m, previous in reversed(wrapped):
                if previous is None:
                    del m.forward
                else:
                    m.forward = previous

    def _set_tensors(self, fp32: frozenset[str] | None) -> None:
        """Half mode: reduced-dtype weights outside the plan (all FP32 when fp32 is None)."""
        if self.p.mode != "half":
            return
        for (path, name), full in self.full.items():
            keep = fp32 is None or within(path, fp32)
            value = full if keep else self.low[(path, name)]
            m = self.modules[path]
            if name in m._parameters:
                m._parameters[name].data = value
            else:
                m._buffers[name] = value


# ---------------------------------------------------------------- layer-wise view

@dataclass
class ModuleStats:
    """One module's output, FP32 vs reduced precision, worst over its calls and the samples."""

    module: str
    cls: str
    leaf: bool
    order: int  # when its first call finished (post-order: children before parents)
    calls: int = 0
    fp32_absmax: float = 0.0
    reduced_absmax: float = 0.0
    max_abs_err: float = 0.0
    rel_err: float = 0.0  # max|d| / max|fp32|
    input_rel_err: float = 0.0  # the same for its inputs (leaves only)
    fp32_nonfinite: int = 0
    new_nonfinite: int = 0  # non-finite in reduced precision where FP32 is finite
    out_of_range: int = 0  # finite FP32 output values beyond the reduced dtype's range
    nonfinite_origin: bool = False  # turns non-finite here, from finite inputs
    overflow_ops: dict[str, int] = field(default_factory=dict)  # in its own code (emulation)

    @property
    def growth(self) -> float:
        return self.rel_err / max(self.input_rel_err, 1e-6)

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in (
            "module", "cls", "leaf", "calls", "fp32_absmax", "reduced_absmax", "max_abs_err",
            "rel_err", "input_rel_err", "fp32_nonfinite", "new_nonfinite", "out_of_range",
            "nonfinite_origin", "overflow_ops")}
        return {k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in d.items()}


def _float_leaves(value) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0]
            if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _rel(ref: torch.Tensor, got: torch.Tensor) -> tuple[float, float, float, int]:
    """(max|ref| over finite ref, max|d|, max|d|/max|ref|, non-finite where ref is finite)."""
    ref_max, max_abs, rel, bad, *_ = _compare(ref, got, math.inf)
    return ref_max, max_abs, rel, bad


def _compare(ref: torch.Tensor, got: torch.Tensor, top: float
             ) -> tuple[float, float, float, int, float, int, int]:
    """_rel's numbers, then max|got| over finite got, non-finite ref values, and finite ref
    values beyond `top`: one pass over each tensor per statistic."""
    ref, got = ref.detach().float(), got.detach().float()
    if ref.shape != got.shape:
        return 0.0, 0.0, 0.0, 0, 0.0, 0, 0
    fin_r, fin_g = torch.isfinite(ref), torch.isfinite(got)
    ref_abs = torch.where(fin_r, ref.abs(), 0.0)
    ref_max = float(ref_abs.max()) if ref.numel() else 0.0
    diff = torch.where(fin_r, torch.nan_to_num((got - ref).abs(), nan=math.inf), 0.0)
    max_abs = float(diff.max()) if ref.numel() else 0.0
    rel = max_abs / ref_max if ref_max > 0 else (0.0 if max_abs == 0 else math.inf)
    got_max = float(torch.where(fin_g, got.abs(), 0.0).max()) if got.numel() else 0.0
    bad = int((fin_r & ~fin_g).sum())
    return (ref_max, max_abs, rel, bad, got_max, int(ref.numel() - int(fin_r.sum())),
            int((ref_abs > top).sum()))


def layerwise(runner: TorchRunner, tm: TorchModel) -> dict[str, ModuleStats]:
    """Every module's output in FP32 and in reduced precision (the empty plan), with forward
    hooks; in emulation also the ops whose stored result overflowed, by module."""
    stats: dict[str, ModuleStats] = {}
    for sample in tm.samples:
        args = runner.args(tm, sample)
        recorded = _record_fp32(runner, args)
        _compare_reduced(runner, args, recorded, stats)
    origins = [p for p, s in stats.items() if s.nonfinite_origin]
    for p in origins:  # only the innermost: a parent of an origin inherits its inf
        if any(q.startswith(p + ".") for q in origins):
            stats[p].nonfinite_origin = False
    return dict(sorted(stats.items(), key=lambda kv: kv[1].order))


def _hooks(model: torch.nn.Module, pre, post) -> list:
    handles = []
    for path, m in model.named_modules():
        if not path:
            continue
        handles.append(m.register_forward_pre_hook(functools.partial(pre, path), with_kwargs=True))
        handles.append(m.register_forward_hook(functools.partial(post, path), with_kwargs=True))
    return handles


def _record_fp32(runner: TorchRunner, args: tuple) -> dict[tuple[str, int], tuple[list, list]]:
    """(inputs for leaves, outputs) of every module call in FP32, keyed by (path, call)."""
    calls: dict[str, int] = {}
    recorded: dict[tuple[str, int], tuple[list, list]] = {}
    pending: dict[str, list] = {}

    def pre(path, module, a, kw):
        leaf = not any(True for _ in module.children())
        pending[path] = [t.clone() for t in _float_leaves((a, kw))] if leaf else []

    def post(path, module, a, kw, out):
        k = calls.get(path, 0)
        calls[path] = k + 1
        recorded[(path, k)] = (pending.pop(path, []), [t.clone() for t in _float_leaves(out)])

    runner._set_tensors(None)
    handles = _hooks(runner.model, pre, post)
    try:
        with torch.no_grad():
            runner.model(*args)
    finally:
        for h in handles:
            h.remove()
    return recorded


def _compare_reduced(runner: TorchRunner, args: tuple, recorded: Mapping,
                     stats: dict[str, ModuleStats]) -> None:
    calls: dict[str, int] = {}
    stack: list[tuple[str, float, bool]] = []  # (path, input rel err, inputs finite)
    order = [len(stats)]
    overflow: dict[str, dict[str, int]] = {}
    storage: list[ReducedStorage | None] = [None]

    def measuring():
        return storage[0].pause() if storage[0] is not None else contextlib.nullcontext()

    def pre(path, module, a, kw):
        with measuring():
            ins = [t.detach().float() for t in _float_leaves((a, kw))]
            finite = all(bool(torch.isfinite(t).all()) for t in ins)
            ref_in = recorded.get((path, calls.get(path, 0)), ([], []))[0]
            rel = max((_rel(r, g)[2] for r, g in zip(ref_in, ins)), default=0.0)
        stack.append((path, rel, finite))

    def post(path, module, a, kw, out):
        with measuring():
            _measure(path, module, out)

    def _measure(path, module, out):
        k = calls.get(path, 0)
        calls[path] = k + 1
        _, in_rel, in_finite = stack.pop()
        ref_out = recorded.get((path, k), ([], []))[1]
        s = stats.get(path)
        if s is None:
            s = stats[path] = ModuleStats(path, type(module).__name__,
                                          not any(True for _ in module.children()), order[0])
            order[0] += 1
        s.calls += 1
        s.input_rel_err = max(s.input_rel_err, in_rel)
        for r, g in zip(ref_out, _float_leaves(out)):
            ref_max, max_abs, rel, bad, got_max, ref_bad, beyond = _compare(r, g, runner.p.max_value)
            s.fp32_absmax, s.reduced_absmax = max(s.fp32_absmax, ref_max), max(s.reduced_absmax, got_max)
            s.max_abs_err, s.rel_err = max(s.max_abs_err, max_abs), max(s.rel_err, rel)
            s.fp32_nonfinite = max(s.fp32_nonfinite, ref_bad)
            s.new_nonfinite = max(s.new_nonfinite, bad)
            s.out_of_range = max(s.out_of_range, beyond)
            if bad and in_finite:
                s.nonfinite_origin = True

    def on_overflow(op: str, n: int) -> None:
        where = stack[-1][0] if stack else ""
        ops = overflow.setdefault(where, {})
        ops[op] = ops.get(op, 0) + n

    handles = _hooks(runner.model, pre, post)
    try:
        with runner.applied(frozenset()), runner.reduced(on_overflow) as storage[0]:
            runner.model(*runner.reduced_args(args))
    finally:
        for h in handles:
            h.remove()
    for path, ops in overflow.items():
        if path in stats:
            for op, n in ops.items():
                stats[path].overflow_ops[op] = max(stats[path].overflow_ops.get(op, 0), n)


def summarize(stats: Mapping[str, ModuleStats], rtol: float) -> dict[str, object]:
    """Where things first go wrong, in the order modules finish."""
    ordered = list(stats.values())
    first = lambda pred: next((s.module for s in ordered if pred(s)), None)  # noqa: E731
    return {
        "modules": len(ordered),
        "first_nonfinite": first(lambda s: s.nonfinite_origin),
        "first_overflow": first(lambda s: bool(s.overflow_ops)),
        "first_out_of_range": first(lambda s: s.out_of_range > 0),
        "first_jump": first(lambda s: s.leaf and s.rel_err > rtol),
    }


# ---------------------------------------------------------------- search

def candidates(stats: Mapping[str, ModuleStats]) -> list[str]:
    """Modules that ran, minus the root and modules that compute nothing inexact; in the
    order their first call began (parents before children)."""
    return [m for m in _start_order(stats) if m and stats[m].cls not in EXACT_MODULES]


def _start_order(stats: Mapping[str, ModuleStats]) -> list[str]:
    """Pre-order from post-order: a module begins when the first module inside it finishes."""
    begins = {p: s.order for p, s in stats.items()}
    for p, s in stats.items():
        for a in ancestors(p):
            if a in begins:
                begins[a] = min(begins[a], s.order)
    if "" in begins:
        begins[""] = -1
    return sorted(stats, key=lambda p: (begins[p], p.count(".") if p else -1))


def prior(stats: Mapping[str, ModuleStats], cands: Sequence[str], mode: str
          ) -> tuple[list[str], list[str]]:
    """(seeds, ranking) from the layer-wise view.

    Seeds: modules whose own code overflowed the reduced dtype, the first module to turn
    non-finite, and modules whose FP32 output is beyond the reduced range. In half mode such an
    output is cast back on leaving an FP32 module, so the seed is the nearest enclosing module
    whose output fits. Ranking: seeds, leaves by error growth, then parents.
    """
    cand = set(cands)
    seeds: list[str] = []

    def enclosing(path: str) -> str | None:
        for a in ancestors(path):
            s = stats.get(a)
            if a in cand and s is not None and s.out_of_range == 0:
                return a
        return None

    for s in stats.values():
        if s.out_of_range and mode == "half":
            target = enclosing(s.module)
        elif s.overflow_ops or s.out_of_range or s.nonfinite_origin:
            target = s.module if s.module in cand else enclosing(s.module)
        else:
            continue
        if target is not None and target not in seeds:
            seeds.append(target)
    leaves = sorted((m for m in cands if stats[m].leaf), key=lambda m: -stats[m].growth)
    parents = [m for m in cands if not stats[m].leaf]
    ranking = list(dict.fromkeys([*seeds, *leaves, *parents]))
    return seeds, ranking


@dataclass
class TorchOptions:
    precision: Precision = field(default_factory=Precision)
    tolerance: Tolerance = field(default_factory=Tolerance)
    max_evaluations: int | None = None
    search: bool = True
    criteria: Criteria = field(default_factory=Criteria)  # judge/criteria.py


@dataclass
class TorchCulprit:
    module: str
    cls: str
    why: str

    def to_json(self) -> dict:
        return {"module": self.module, "class": self.cls, "why": self.why}


@dataclass
class TorchResult:
    verdict: str  # fp16_ok | fixed | no_plan | reference_invalid | (not_searched)
    source: str
    precision: Precision
    fp32_modules: list[str]
    candidates: int
    modules: int
    evaluations: int
    inferences: int
    samples: int
    tolerance: Tolerance
    errors_before: dict[str, OutputError]
    errors_after: dict[str, OutputError]
    culprits: list[TorchCulprit] = field(default_factory=list)
    one_minimal: bool = False
    search: SearchResult | None = None
    stats: dict[str, ModuleStats] = field(default_factory=dict)
    summary: dict[str, object] = field(default_factory=dict)
    seeds: list[str] = field(default_factory=list)
    snippet_check: dict[str, OutputError] | None = None
    reference_problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    files: dict[str, str] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return VERDICT_EXIT.get(self.verdict, EXIT_OK)

    def to_json(self) -> dict:
        from . import __version__
        return {
            "tool": "trtbisect", "version": __version__, "backend": "torch",
            "source": self.source, "torch": torch.__version__,
            "precision": self.precision.to_json(),
            "verdict": self.verdict,
            "fp32_modules": self.fp32_modules,
            "one_minimal": self.one_minimal,
            "evaluations": self.evaluations,
            "inferences": self.inferences,
            "samples": self.samples,
            "modules": self.modules,
            "candidates": self.candidates,
            "tolerance": self.tolerance.to_json(),
            "errors_before": {k: v.to_json() for k, v in self.errors_before.items()},
            "errors_after": {k: v.to_json() for k, v in self.errors_after.items()},
            "culprits": [c.to_json() for c in self.culprits],
            "layerwise": self.summary,
            "prior_seeds": self.seeds,
            "snippet_check": ({k: v.to_json() for k, v in self.snippet_check.items()}
                              if self.snippet_check is not None else None),
            "reference_problems": self.reference_problems,
            "files": self.files,
            "seconds": round(self.seconds, 3),
        }


def diagnose(tm: TorchModel, opts: TorchOptions, out_dir: Path | None = None,
             progress: Progress | None = None,
             on_stage: Callable[[str], None] | None = None) -> TorchResult:
    """FP32 vs reduced precision in PyTorch, module by module, and the smallest set of
    submodules to keep FP32 (certified 1-minimal by the same search as `trtbisect run`)."""
    started = time.perf_counter()
    stage = on_stage or (lambda msg: log.info(msg))
    p, tol = opts.precision, opts.tolerance
    stage(f"running {tm.source} in FP32 ({p.describe()})")
    runner = TorchRunner(tm.module, p)
    args = [runner.args(tm, s) for s in tm.samples]
    refs = [runner.reference(a) for a in args]
    base: dict[str, Any] = dict(source=tm.source, precision=p, modules=len(runner.modules) - 1,
                                samples=len(tm.samples), tolerance=tol)
    problems = [f"output {k!r} of sample {i} has {int((~np.isfinite(v)).sum())} non-finite value(s)"
                for i, r in enumerate(refs) for k, v in r.items()
                if v.dtype.kind == "f" and not np.isfinite(v).all()]
    if problems:
        result = TorchResult("reference_invalid", fp32_modules=[], candidates=0, evaluations=0,
                             inferences=0, errors_before={}, errors_after={},
                             reference_problems=problems, **base)
        return _finish(result, out_dir, started)
    stage(f"layer-wise comparison, FP32 vs {p.mode} {p.dtype}")
    stats = layerwise(runner, tm)
    cands = candidates(stats)
    seeds, ranking = prior(stats, cands, p.mode)

    crit = opts.criteria
    if refs:
        crit.validate(list(refs[0]))
        crit.check_fit(refs[0])

    def measure(plan: frozenset[str], stop_early: bool = False):
        judged = []
        for sample, a, ref in zip(tm.samples, args, refs):
            judged.append(crit.judge(ref, runner.run(plan, a), sample, tol))
            if stop_early and crit.hopeless(judged, len(args)):
                return False, [j.errors for j in judged]
        return crit.verdict(judged).passed, [j.errors for j in judged]

    _, before = measure(frozenset())
    result = TorchResult("not_searched", fp32_modules=[], candidates=len(cands), evaluations=0,
                         inferences=0, errors_before=worst(before), errors_after=worst(before),
                         stats=stats, summary=summarize(stats, tol.rtol), seeds=seeds, **base)
    if opts.search:
        stage(f"searching {len(cands)} candidate modules ({len(seeds)} suspects)")
        search = find_minimal_fp32(cands, lambda plan: measure(plan, stop_early=True)[0],
                                   seeds, ranking, opts.max_evaluations, progress)
        _judge(result, search, measure)
        if result.verdict == "fixed":
            result.snippet_check = _check_snippet(tm, p, tol, result.fp32_modules, refs, crit)
    result.inferences = runner.runs
    result.culprits = explain(runner, stats, result.fp32_modules)
    return _finish(result, out_dir, started)


def _judge(result: TorchResult, search: SearchResult, measure) -> None:
    result.search, result.evaluations = search, search.evaluations
    if not search.found:
        result.verdict = "no_plan"
    elif not search.fp32:
        result.verdict, result.one_minimal = "fp16_ok", True
    else:
        passed, errors = measure(frozenset(search.fp32))  # the final check, run afresh
        result.evaluations += 1
        result.verdict = "fixed" if passed else "no_plan"
        result.errors_after = worst(errors)
        result.fp32_modules = list(search.fp32) if passed else []
        result.one_minimal = passed and search.one_minimal


def _check_snippet(tm: TorchModel, p: Precision, tol: Tolerance, fp32: list[str],
                   refs: list[dict[str, np.ndarray]], crit: Criteria | None = None
                   ) -> dict[str, OutputError]:
    """Apply the plan the way the user will (apply_plan on a fresh copy) and judge it."""
    crit = crit or Criteria()
    model = apply_plan(copy.deepcopy(tm.module).float().eval().to(p.device), fp32, p.mode,
                       p.torch_dtype)
    judged = []
    for sample, ref in zip(tm.samples, refs):
        with reduced(p):
            out = model(*reduced_args(p, tm.args(sample, p.device)))
        judged.append(crit.judge(ref, to_numpy(flatten_outputs(out)), sample, tol))
    verdict = crit.verdict(judged)
    if not verdict.passed:
        log.warning("the plan applied with apply_plan does not meet the tolerance; please report")
    return verdict.errors


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


# ---------------------------------------------------------------- outputs

def _finish(result: TorchResult, out_dir: Path | None, started: float) -> TorchResult:
    result.seconds = time.perf_counter() - started
    if out_dir is not None:
        write_outputs(result, out_dir)
    return result


def write_outputs(result: TorchResult, out_dir: Path) -> None:
    from .plan import atomic_write_json, atomic_write_records, atomic_write_text
    out_dir.mkdir(parents=True, exist_ok=True)
    if result.stats:
        atomic_write_records(out_dir / "torch_layerwise.json",
                             [s.to_json() for s in result.stats.values()])
        result.files["layerwise"] = str(out_dir / "torch_layerwise.json")
    if result.verdict in ("fixed", "fp16_ok"):
        atomic_write_text(out_dir / "fp32_plan.py", render_snippet(result))
        result.files["snippet"] = str(out_dir / "fp32_plan.py")
    if result.search is not None:
        atomic_write_json(out_dir / "torch_trace.json", result.search.to_json())
        result.files["trace"] = str(out_dir / "torch_trace.json")
    result.files["plan"] = str(out_dir / "torch_plan.json")
    atomic_write_json(out_dir / "torch_plan.json", result.to_json())


def render_snippet(result: TorchResult) -> str:
    """fp32_plan.py: the plan and the exact code that was verified, ready to paste."""
    p = result.precision
    dtype = "torch.float16" if p.dtype == "fp16" else "torch.bfloat16"
    if p.mode == "half":
        usage = (f"    model = apply_trtbisect_plan(model)  # the rest becomes {dtype}\n"
                 f"    y = model(x.to({dtype}))")
    else:
        usage = ("    model = apply_trtbisect_plan(model)\n"
                 f"    with torch.autocast(\"{p.device}\", dtype={dtype}):\n"
                 "        y = model(x)")
    lines = [
        f'"""trtbisect plan for {result.source}: keep {len(result.fp32_modules)} module(s) in '
        f"FP32 under {p.mode} {p.dtype}.",
        "",
        f"Found with {p.describe()}; verdict: {result.verdict}.",
        "",
        "Usage:",
        usage,
        '"""',
        "",
        "import functools",
        "",
        "import torch",
        "",
        f"FP32_MODULES = {json.dumps(result.fp32_modules, indent=4)}",
        f'MODE = "{p.mode}"',
        f"DTYPE = {dtype}",
        "",
        "",
        "def apply_trtbisect_plan(model):",
        '    """Apply the plan to `model` in place and return it."""',
        "    return apply_plan(model, FP32_MODULES, MODE, DTYPE)",
        "",
    ]
    for fn in SNIPPET_FUNCTIONS:
        lines += ["", inspect.getsource(fn).rstrip(), ""]
    return "\n".join(lines)
