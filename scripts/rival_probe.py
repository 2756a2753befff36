#!/usr/bin/env python3
"""Run the rival FP16-fallback tools on CPU, with their accuracy checks routed through a
caller-supplied oracle (trtbisect's emulator in the benchmark), and count their evaluations.

Rivals (see docs/rivals.md for versions, install commands and algorithm notes):

* onnxconverter-common ``auto_convert_mixed_precision`` -> :func:`run_onnxconverter_amp`
  Its own checks go through ``float16.convert_float_to_float16`` + ORT CPU, which crashes on
  models with ``Cast(to=FLOAT)`` and, where it does run, lets ORT CPU quietly run FP16 nodes
  in FP32. We monkeypatch three module globals so every candidate check becomes a call to
  ``passes(fp32_nodes)`` instead.
* NVIDIA ModelOpt AutoCast ``convert_to_mixed_precision`` -> :func:`run_modelopt_autocast`
  A one-shot rule (one FP32 reference run, no FP16 check). We capture the node lists that its
  ``NodeClassifier.run`` returns.
* Polygraphy ``debug precision --mode bisect`` -> :func:`run_polygraphy_bisect`
  Re-implemented from its documented behaviour (first/last K layers in FP32, binary search on K),
  at the ONNX-node level.

All three take node names as the model carries them: name the nodes first
(:func:`named_model`, the same ``<op_type>_<i>`` scheme as ``trtbisect.graph.node_names``).

``python scripts/rival_probe.py`` runs a demo on a small synthetic overflow model;
``python scripts/rival_probe.py --model magika`` on a model from scripts/fetch_models.py;
``python scripts/rival_probe.py --crash`` reproduces the unpatched onnxconverter-common crash.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

Passes = Callable[[frozenset], bool]
Feeds = Mapping[str, np.ndarray]


@dataclass
class RivalResult:
    tool: str
    fp32_nodes: frozenset = frozenset()
    evaluations: int = 0  # FP16-plan checks the tool asked for (repeats included)
    unique_evaluations: int = 0  # distinct plans among them
    reference_runs: int = 0  # FP32 reference runs it made on its own
    seconds: float = 0.0
    ok: bool = True  # the tool finished and claims success
    error: str = ""
    extra: dict = field(default_factory=dict)


class CountingOracle:
    """Wraps ``passes`` with a cache and counters."""

    def __init__(self, passes: Passes) -> None:
        self.passes = passes
        self.calls = 0
        self.cache: dict[frozenset, bool] = {}

    def __call__(self, fp32_nodes: Iterable[str]) -> bool:
        plan = frozenset(fp32_nodes)
        self.calls += 1
        if plan not in self.cache:
            self.cache[plan] = bool(self.passes(plan))
        return self.cache[plan]


def named_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy in which every node has trtbisect's unique name (``<op_type>_<i>`` if unnamed)."""
    from trtbisect.graph import with_node_names

    return with_node_names(model)


def _check_names(model: onnx.ModelProto) -> list[str]:
    names = [n.name for n in model.graph.node]
    if "" in names or len(set(names)) != len(names):
        raise ValueError("nodes need unique, non-empty names: pass named_model(model)")
    return names


def _weightless(model: onnx.ModelProto) -> onnx.ModelProto:
    """Same graph, initializers emptied: rivals that deep-copy the model per attempt stay cheap
    when they never really execute it (our patched path)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        init.ClearField("raw_data")
        for f in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
            init.ClearField(f)
        init.ClearField("dims")
        init.dims.extend([0])
    for node in out.graph.node:  # big Constant payloads too
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.ByteSize() > 4096:
                a.t.ClearField("raw_data")
                a.t.ClearField("float_data")
                a.t.ClearField("dims")
                a.t.dims.extend([0])
    return out


# --------------------------------------------------------------------------------------------
# onnxconverter-common auto_convert_mixed_precision
# --------------------------------------------------------------------------------------------


class _Plan:
    """What our fake converter hands back instead of a model: the FP32 node set."""

    def __init__(self, fp32_nodes: frozenset | None) -> None:
        self.fp32_nodes = fp32_nodes


@contextlib.contextmanager
def _patched_amp(oracle: CountingOracle):
    """Patch the three module globals of onnxconverter_common.auto_mixed_precision that its
    search reaches for, so no model is converted or run:

    * ``add_missing_dtypes_using_ort`` -> identity (it only annotates dtypes via ORT runs)
    * ``float16`` (the module it calls ``float16.convert_float_to_float16`` on) -> a shim whose
      converter returns ``_Plan(frozenset(node_block_list))``
    * ``get_tensor_values_using_ort`` -> returns ``[_Plan]``; the caller's validate_fn (which we
      supply) turns it into an oracle call.
    """
    from types import SimpleNamespace

    from onnxconverter_common import auto_mixed_precision as amp

    saved = (amp.add_missing_dtypes_using_ort, amp.float16, amp.get_tensor_values_using_ort)

    from onnxconverter_common.float16 import DEFAULT_OP_BLOCK_LIST

    def convert(model, node_block_list=None, op_block_list=None, **_kw):
        # The real converter always keeps DEFAULT_OP_BLOCK_LIST op types (Resize, Range, TopK,
        # Min, Max, CumSum, NonMaxSuppression, RoiAlign, Upsample, ML ops...) in FP32.
        ops = set(DEFAULT_OP_BLOCK_LIST if op_block_list is None else op_block_list)
        forced = {n.name for n in model.graph.node if n.op_type in ops}
        return _Plan(frozenset(node_block_list or ()) | forced)

    def values(model, feed_dict, output_names=None, sess_options=None):
        if isinstance(model, _Plan):
            return [model]
        return [_Plan(None)]  # the FP32 baseline run (res0)

    amp.add_missing_dtypes_using_ort = lambda model, feed_dict, outputs_per_iter=100: model
    amp.float16 = SimpleNamespace(convert_float_to_float16=convert)
    amp.get_tensor_values_using_ort = values
    try:
        yield amp
    finally:
        (amp.add_missing_dtypes_using_ort, amp.float16, amp.get_tensor_values_using_ort) = saved


def run_onnxconverter_amp(model: onnx.ModelProto, feeds: Feeds, passes: Passes) -> RivalResult:
    """onnxconverter-common's segment search, every check answered by ``passes(fp32_nodes)``.

    ``fp32_nodes`` may contain nodes that are not FP16 candidates for trtbisect (Shape, Cast,
    Constant, ...): the tool blocks by node name over *all* nodes but Loop/If/Scan. Intersect
    with the backend's candidates inside ``passes`` and when reporting.
    """
    _check_names(model)
    oracle = CountingOracle(passes)

    def validate_fn(res0, res1):
        plan = res1[0].fp32_nodes
        return True if plan is None else oracle(plan)

    res = RivalResult("onnxconverter-common.auto_convert_mixed_precision")
    t0 = time.perf_counter()
    log = io.StringIO()
    with _patched_amp(oracle) as amp, contextlib.redirect_stdout(log):
        try:
            out = amp.auto_convert_mixed_precision(
                _weightless(model), dict(feeds), validate_fn=validate_fn, keep_io_types=True
            )
            res.fp32_nodes = out.fp32_nodes
        except ValueError as exc:  # "validation failed for final fp16 model"
            res.ok, res.error = False, str(exc)
            final = [ln for ln in log.getvalue().splitlines() if ln.startswith("Done:")]
            if final:
                import ast

                res.fp32_nodes = frozenset(ast.literal_eval(final[-1][len("Done:"):].strip()))
    res.seconds = time.perf_counter() - t0
    res.evaluations, res.unique_evaluations = oracle.calls, len(oracle.cache)
    res.extra["attempts"] = log.getvalue().count("Running attempt")
    return res


def reproduce_amp_crash() -> str:
    """The unpatched tool on a 2-node model (int32 -> Cast(to=FLOAT) -> MatMul), ORT CPU."""
    from onnxconverter_common import auto_mixed_precision as amp

    w = numpy_helper.from_array(np.ones((8, 8), np.float32), "W")
    g = helper.make_graph(
        [helper.make_node("Cast", ["ids"], ["f"], to=TensorProto.FLOAT, name="cast"),
         helper.make_node("MatMul", ["f", "W"], ["y"], name="mm")],
        "cast_matmul",
        [helper.make_tensor_value_info("ids", TensorProto.INT32, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [w],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    feeds = {"ids": np.arange(16, dtype=np.int32).reshape(2, 8)}
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            amp.auto_convert_mixed_precision(m, feeds, rtol=1e-2, atol=1e-3, keep_io_types=True)
        except Exception as exc:  # noqa: BLE001 - we report whatever it raises
            return f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    return "no crash"


# --------------------------------------------------------------------------------------------
# NVIDIA ModelOpt AutoCast
# --------------------------------------------------------------------------------------------


def _map_back(original: onnx.ModelProto, node: onnx.NodeProto) -> set[str]:
    """Original nodes that a node AutoCast created (e.g. a fused LayerNormalization) stands for:
    those on paths from its inputs to its outputs. Empty when that region is not closed (the
    walk back reaches a graph input the new node does not read), i.e. no faithful mapping."""
    producer = {t: n for n in original.graph.node for t in n.output if t}
    graph_inputs = {v.name for v in original.graph.input} - {
        t.name for t in original.graph.initializer}
    stop = set(node.input)
    found: set[str] = set()
    todo = [t for t in node.output if t in producer]
    while todo:
        t = todo.pop()
        if t in stop:
            continue
        n = producer.get(t)
        if n is None:
            if t in graph_inputs:
                return set()
            continue  # an initializer
        if n.name in found:
            continue
        found.add(n.name)
        todo.extend(i for i in n.input if i)
    return found


def run_modelopt_autocast(model: onnx.ModelProto, feeds: Feeds, *, data_max: float = 512.0,
                          init_max: float | None = None, max_depth_of_reduction: int | None = None,
                          workdir: str | None = None) -> RivalResult:
    """AutoCast's rule-based choice of FP32 nodes (no accuracy check of its own).

    Returns the FP32 node set in *this* model's names: AutoCast's GraphSanitizer may upgrade the
    opset (to >= 13), fuse decomposed LayerNorm into one LayerNormalization and duplicate shared
    Constants; new nodes are mapped back to the original nodes they cover.
    The benchmark must check the returned plan itself (one evaluation).
    """
    _check_names(model)
    from modelopt.onnx.autocast import configure_logging, convert_to_mixed_precision, nodeclassifier

    configure_logging("ERROR")
    captured: dict = {}
    orig_run = nodeclassifier.NodeClassifier.run

    def run(self, ref_outputs_dict=None):
        low, high = orig_run(self, ref_outputs_dict)
        captured.update(high=list(high), low=list(low), graph=self.model.graph)
        return low, high

    res = RivalResult("modelopt.onnx.autocast.convert_to_mixed_precision", reference_runs=1)
    kwargs = {} if init_max is None else {"init_max": init_max}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="autocast-", dir=workdir) as tmp:
        path = os.path.join(tmp, "model.onnx")
        onnx.save(model, path)
        npz = os.path.join(tmp, "feeds.npz")
        arrays: dict = {k: np.asarray(v) for k, v in feeds.items()}
        np.savez(npz, **arrays)
        nodeclassifier.NodeClassifier.run = run
        try:
            convert_to_mixed_precision(
                path, low_precision_type="fp16", keep_io_types=True, calibration_data=npz,
                data_max=data_max, max_depth_of_reduction=max_depth_of_reduction,
                providers=["cpu"], **kwargs,
            )
        except Exception as exc:  # noqa: BLE001
            res.ok, res.error = False, f"{type(exc).__name__}: {exc}"
        finally:
            nodeclassifier.NodeClassifier.run = orig_run
    res.seconds = time.perf_counter() - t0
    if "high" in captured:
        names = {n.name for n in model.graph.node}
        by_name = {n.name: n for n in captured["graph"].node}
        plan: set[str] = set()
        unmapped = []
        for name in captured["high"]:
            if name in names:
                plan.add(name)
            else:
                covered = _map_back(model, by_name[name]) if name in by_name else set()
                plan |= covered
                if not covered:
                    unmapped.append(name)
        res.fp32_nodes = frozenset(plan)
        res.extra.update(autocast_fp32=len(captured["high"]),
                         autocast_total=len(captured["high"]) + len(captured["low"]),
                         unmapped=unmapped)
        res.ok = True if not res.error else res.ok
    return res


# --------------------------------------------------------------------------------------------
# Polygraphy debug precision --mode bisect (re-implemented, ONNX-node level)
# --------------------------------------------------------------------------------------------


def run_polygraphy_bisect(layers: Sequence[str], passes: Passes, *, direction: str = "forward",
                          markable: Callable[[str], bool] | None = None) -> RivalResult:
    """Binary search for the smallest K such that the first K (forward) or last K (reverse)
    layers in FP32 pass. ``layers``: all nodes in topological order (Polygraphy counts every
    TensorRT layer); ``markable`` filters which of the selected ones are actually set to FP32
    (Polygraphy skips constants, shape-tensor and non-float layers).

    Search state: ``bad`` (largest K known to fail, starts 0, never tested) and ``good``
    (smallest K known to pass, starts N+1 as a sentinel). The first build tests K=N. After a
    pass, K moves down to floor((good+bad)/2); after a fail, up to ceil((good+bad)/2). It stops
    when K would not change, when good-bad <= 1, or when K > N. Result: first/last ``good``
    layers, or failure if even K=N failed. About 1 + ceil(log2(N+1)) builds; K=0 (all FP16)
    is never tried.
    """
    if direction not in ("forward", "reverse"):
        raise ValueError("direction is 'forward' or 'reverse'")
    markable = markable or (lambda _n: True)
    n = len(layers)
    oracle = CountingOracle(passes)

    def plan(k: int) -> frozenset:
        chosen = layers[:k] if direction == "forward" else layers[n - k:]
        return frozenset(x for x in chosen if markable(x))

    res = RivalResult(f"polygraphy-debug-precision-bisect-{direction}")
    t0 = time.perf_counter()
    bad, good, k = 0, n + 1, n
    while True:
        if oracle(plan(k)):
            good, nxt = k, math.floor((k + bad) / 2)
        else:
            bad, nxt = k, math.ceil((good + k) / 2)
        if nxt == k or good - bad <= 1 or nxt > n:
            break
        k = nxt
    res.seconds = time.perf_counter() - t0
    res.evaluations, res.unique_evaluations = oracle.calls, len(oracle.cache)
    res.ok = good <= n
    res.fp32_nodes = plan(good) if res.ok else frozenset()
    res.extra["k"] = good if res.ok else None
    if not res.ok:
        res.error = "Could not find a configuration that satisfied accuracy requirements."
    return res


# --------------------------------------------------------------------------------------------
# demo
# --------------------------------------------------------------------------------------------


def _overflow_model() -> tuple[onnx.ModelProto, dict]:
    """x -> MatMul -> Relu -> Mul(3000) -> Mul(square, overflows FP16) -> Sqrt -> MatMul."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W1"),
             numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W2"),
             numpy_helper.from_array(np.array(3000.0, np.float32), "big")]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["a"], name="mm1"),
             helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Mul", ["b", "big"], ["c"], name="scale_up"),
             helper.make_node("Mul", ["c", "c"], ["d"], name="square"),
             helper.make_node("Sqrt", ["d"], ["e"], name="sqrt"),
             helper.make_node("MatMul", ["e", "W2"], ["y"], name="mm2")]
    g = helper.make_graph(nodes, "overflow",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m, {"x": rng.standard_normal((4, 16)).astype(np.float32)}


def _emulator_oracle(model: onnx.ModelProto, feeds: Feeds, rtol: float = 1e-2):
    """passes(plan) on trtbisect's ORT FP16 emulator (falls back to nothing if unavailable)."""
    from trtbisect.backends.ort import Emulator, Reference
    from trtbisect.graph import Graph

    graph = Graph(model)
    ref = Reference(graph).run(feeds)
    emu = Emulator(graph)
    cands = set(emu.candidates())

    def passes(plan: frozenset) -> bool:
        got = emu.run(frozenset(plan) & cands, feeds)
        for name, r in ref.items():
            r = np.asarray(r, np.float64)
            g = np.asarray(got[name], np.float64)
            if not np.issubdtype(np.asarray(ref[name]).dtype, np.floating):
                continue
            fin = np.isfinite(r)
            if not np.all(np.isfinite(g[fin])):
                return False
            scale = float(np.max(np.abs(r[fin]))) if fin.any() else 0.0
            if fin.any() and float(np.max(np.abs(g[fin] - r[fin]))) > rtol * scale:
                return False
        return True

    return passes, graph


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a name from scripts/fetch_models.py (default: synthetic)")
    ap.add_argument("--crash", action="store_true",
                    help="only reproduce the unpatched onnxconverter-common crash")
    ap.add_argument("--skip", action="append", default=[],
                    choices=["amp", "autocast", "polygraphy"], help="skip a rival")
    args = ap.parse_args(argv)

    if args.crash:
        print("onnxconverter-common, unpatched, ORT CPU:", reproduce_amp_crash())
        return 0
    if args.model:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from fetch_models import MODELS, fetch

        model, feeds = onnx.load(str(fetch(args.model))), MODELS[args.model].make_inputs()
    else:
        model, feeds = _overflow_model()
    model = named_model(model)
    passes, graph = _emulator_oracle(model, feeds)
    cands = graph.candidates()
    print(f"{len(model.graph.node)} nodes, {len(cands)} FP16 candidates; "
          f"all-FP16 passes: {passes(frozenset())}")
    results = []
    if "amp" not in args.skip:
        results.append(run_onnxconverter_amp(model, feeds, passes))
    if "polygraphy" not in args.skip:
        layers = list(graph.names)
        results.append(run_polygraphy_bisect(layers, passes, markable=set(cands).__contains__))
    if "autocast" not in args.skip:
        r = run_modelopt_autocast(model, feeds)
        if r.ok:
            r.extra["plan_passes"] = passes(r.fp32_nodes)
            r.evaluations = r.unique_evaluations = 1
        results.append(r)
    for r in results:
        kept = len(r.fp32_nodes & set(cands))
        print(f"{r.tool}: ok={r.ok} fp32_candidates={kept} (raw {len(r.fp32_nodes)}) "
              f"evaluations={r.evaluations} unique={r.unique_evaluations} "
              f"{r.seconds:.2f}s {r.extra} {r.error[:200]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
