"""The TensorRT search's strategy: the emulator's plan first, one TensorRT verification, and a
refinement driven by TensorRT's verdicts only where the two disagree. Pure: it is handed the
checks (an engine's verdict, the emulator's), as search/minimal.py is; stages/trt.py builds
them from the backend and the GPU pool."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence

from ..judge.trt_layers import TrtPlanResult
from .minimal import Ask, Batch, BudgetExhausted, Check, Done, Oracle, find_minimal_fp32


def emulator_then_trt(
    candidates: Sequence[str],
    trt_check: Check | Batch,
    emulator_check: Check | None = None,
    emulator_plan: Sequence[str] | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
    seeds: Iterable[str] = (),
    ranking: Sequence[str] = (),
    max_trt_checks: int | None = None,
    certify: bool = False,
) -> TrtPlanResult:
    """Few TensorRT builds: the emulator searches for free, TensorRT verifies, and only where
    they disagree does TensorRT drive a search, first over engine layers, then inside them.

    `trt_check(fp32)` builds and runs one engine (a `search.Batch`: several at once, on the
    GPUs of parallel/trt_pool.py); `trt_check(frozenset())` is the all-FP16 engine. When the
    emulator and TensorRT agree this costs two checks: FP16 and the final plan.
    `groups` maps engine-layer names to the candidate nodes they fuse (from the FP16 engine).
    With `certify`, every node of the final plan is also removed once on TensorRT.
    """
    cand = list(dict.fromkeys(candidates))
    oracle = Oracle(trt_check, cand, max_trt_checks, label="TensorRT check", level=logging.INFO)
    rank = [n for n in dict.fromkeys([*ranking, *cand]) if n in set(cand)]
    emu: list[str] | None = None
    result = TrtPlanResult([], False, None, None)
    try:
        oracle.phase = "fp16"
        if oracle(()):
            return _finish(result, oracle, frozenset(), emu, minimal=True)
        if emulator_plan is not None:
            emu = [n for n in cand if n in set(emulator_plan)]
        elif emulator_check is not None:
            found = find_minimal_fp32(cand, emulator_check, seeds, ranking)
            emu = found.fp32 if found.found else None
        result.emulator_fp32 = emu
        base = frozenset(emu or ())
        oracle.phase = "verify"
        if base and oracle(base):
            result.emulator_agreed = True
            final = _certify(oracle, cand, base) if certify else base
            return _finish(result, oracle, final, emu, minimal=certify)
        result.emulator_agreed = False if emu is not None else None
        extra, layers = _refine(oracle, cand, base, groups or {}, rank)
        if extra is None:
            return _finish(result, oracle, frozenset(cand), emu, minimal=False, found=False)
        result.culprit_layers = layers
        final = base | extra
        final = _certify(oracle, cand, final) if certify else final
        return _finish(result, oracle, final, emu, minimal=certify or not base)
    except BudgetExhausted:
        result.stopped_early = True
        best = oracle.smallest_pass()
        return _finish(result, oracle, best if best is not None else frozenset(cand), emu,
                       minimal=False, found=best is not None)


def _refine(oracle: Oracle, cand: list[str], base: frozenset[str],
            groups: Mapping[str, Sequence[str]], rank: list[str]
            ) -> tuple[frozenset[str] | None, list[str]]:
    """Extra FP32 nodes TensorRT needs on top of `base`: engine layers first, then nodes."""
    rest = [n for n in rank if n not in base]
    grp: dict[str, list[str]] = {}
    for label, nodes in groups.items():
        members = [n for n in rest if n in set(nodes)]
        if members and members not in grp.values():
            grp[label] = members
    layer_labels = set(grp)
    covered = set().union(*grp.values()) if grp else set()
    for n in rest:
        if n not in covered:
            grp[n if n not in grp else f"ONNX node {n}"] = [n]
    near = [g for g in layer_labels if base & set(groups[g])]
    pos = {n: i for i, n in enumerate(rest)}
    order = sorted(grp, key=lambda g: (g not in near, min(pos[n] for n in grp[g])))
    oracle.phase = "layers"
    chosen = _insert(oracle, lambda gs: base.union(*(grp[g] for g in gs)), order, len(near))
    if chosen is None:
        return None, []
    inner = [n for n in rest if any(n in grp[g] for g in chosen)]
    oracle.phase = "nodes"
    extra = _insert(oracle, lambda ns: base | set(ns), inner)
    return (frozenset(extra) if extra is not None else None), [g for g in chosen if g in layer_labels]


def _insert(oracle: Oracle, plan_of: Callable[[Sequence[str]], frozenset[str]],
            items: list[str], hint: int = 0) -> list[str] | None:
    """A 1-minimal subset of `items` that passes, in about m * log2(n) checks for m needed.

    Binary search finds the shortest passing prefix; its last item is needed; repeat on the
    items before it with that one kept. Each kept item x was the last of a shortest passing
    prefix, so the others without x fail: the result is 1-minimal by monotonicity.
    `items[:hint]` (the likeliest) is tried first; if it passes the rest is never built.
    `plan_of(chosen)` is the plan a choice of items stands for. A walk (search.Oracle.walk):
    with several builders, the bisection's next steps are built ahead.
    """
    def step(state: tuple) -> Ask | Done:
        while True:
            mode = state[0]
            if mode == "hint":
                if 0 < hint < len(items):
                    return Ask(plan_of(items[:hint]), ("loop", (), tuple(items[:hint])),
                               ("all",))
                state = ("all",)
            elif mode == "all":
                return Ask(plan_of(items), ("loop", (), tuple(items)), ("none",))
            elif mode == "none":
                return Done(None)
            elif mode == "loop":
                _, needed, rest = state
                return Ask(plan_of(needed), ("done", needed), ("bisect", needed, rest, 0, len(rest)))
            elif mode == "done":
                return Done(list(state[1]))
            else:  # needed + rest[:lo] fails, needed + rest[:hi] passes
                _, needed, rest, lo, hi = state
                if hi == 0:  # needed + rest[:0] both passed (the loop's plan) and failed:
                    return Done(None)  # never on a taken path, only where a batch looks ahead
                if hi - lo <= 1:
                    state = ("loop", (*needed, rest[hi - 1]), rest[:hi - 1])
                    continue
                mid = (lo + hi) // 2
                return Ask(plan_of((*needed, *rest[:mid])), ("bisect", needed, rest, lo, mid),
                           ("bisect", needed, rest, mid, hi))

    return oracle.walk(("hint",), step)


def _certify(oracle: Oracle, cand: list[str], plan: frozenset[str]) -> frozenset[str]:
    oracle.phase = "certify"
    ordered = [n for n in cand if n in plan]
    found = find_minimal_fp32(ordered, oracle, seeds=ordered)
    if oracle.exhausted:
        raise BudgetExhausted
    return frozenset(found.fp32)


def _finish(result: TrtPlanResult, oracle: Oracle, plan: frozenset[str],
            emu: list[str] | None, *, minimal: bool, found: bool = True) -> TrtPlanResult:
    result.fp32 = list(oracle.sorted(plan))
    result.found = found
    result.emulator_fp32 = emu
    result.trt_only = list(oracle.sorted(plan - set(emu or ())))
    result.trt_checks = len(oracle.trials)
    result.one_minimal_on_trt = minimal and found and not result.stopped_early
    result.trials = [t.to_json() for t in oracle.trials]
    return result
