"""The layer-wise view: every module's output in FP32 and in reduced precision, compared
through forward hooks."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten

from .emulation import ReducedStorage
from .export import TorchModel
from .runner import TorchRunner


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
