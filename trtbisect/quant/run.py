"""`trtbisect run model_qdq.onnx`: find the cheapest set of quantized layers to run in float.

Load the explicitly quantized model, find its quantized layers (qdq.py), build the reference
(every layer un-quantized, or the user's --reference FP32 model), judge the model as given; if
it fails, search for a 1-minimal set of layers to un-quantize with the search every run uses
(search.py: the prior is the diagnosis's ranking), write the plan's model, judge *that file*
with the same judge (one judge, bit for bit), and say why each layer of the plan fails.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from ..base.escape import visible
from ..errors import EXIT_REFERENCE_INVALID, TrtBisectError
from ..judge import subset
from ..judge.compare import Tolerance
from ..judge.criteria import Criteria, Verdict
from ..judge.validation import Validation
from ..judge.verdict import Findings, VerdictName
from ..outputs.quantized import QuantPlan, Reproduction, renderings
from ..result import CertificateRecord, Found
from ..search.minimal import Progress, SearchResult, Trial, find_minimal_fp32
from ..search.noise import watching
from ..stages.spread import SPREAD_SHARE
from . import qdq
from .cost import CostCertificate, QuantCost
from .diagnose import SAMPLES, Finding, diagnose
from .fixes import FixJudged
from .judge import QuantJudge

if TYPE_CHECKING:
    from ..context import JudgeOptions, Options, SampleOptions

log = logging.getLogger(__name__)

CHEAPER_PER_UNIT = 2  # --objective cost: new evaluations per unit the cheaper step may make


@dataclass(frozen=True)
class QuantResult(Found[Any, Any]):
    """The quantized road's result: what every search run finds (result.Found: the verdict,
    `fp32_nodes`: here the FP16 nodes of the file kept in FP32, the counts, the errors before
    and after, the files; one exit table, result.VERDICT_EXIT) and the road's own fields.

    Built once, by `assemble`, from the records the run's steps return (`Searched`,
    `FileJudged`, `Certification`, ...), its verdict decided there (judge/verdict.decide over
    all of them), Found's errors before and after those of `before` and `after`; frozen, as
    every road's result: what the writer records afterwards, the paths it wrote, comes by
    `dataclasses.replace`."""
    _: KW_ONLY
    model_path: str
    layers: list[qdq.Layer]
    plan: list[str]  # layers to run un-quantized, in graph order
    before: Verdict | None  # the model as given
    after: Verdict | None  # the written plan's file (one judge)
    search_after: Verdict | None = None  # the search's own verdict of the plan
    trials: list[Trial] = field(default_factory=list)  # every plan evaluated, priced (_scored)
    findings: dict[str, list[Finding]] = field(default_factory=dict)
    half_nodes: int = 0  # FP16 nodes the file has (candidates on the float side)
    fp32_reasons: dict[str, str] = field(default_factory=dict)
    units: list[str] = field(default_factory=list)  # the search's plan (judge.py's unit names)
    fp32_ops: dict[str, str] = field(default_factory=dict)  # op of each FP32 node
    emulated: bool = False  # the file has float16 values: judged with its FP16 stores explicit
    semantics: str = "trt"  # where the FP16 side rounds: per fused TensorRT layer, or per node
    fixes: dict[str, list[FixJudged]] = field(default_factory=dict)  # per plan layer: judged
    cost: QuantCost | None = None  # estimated engine times (quant/cost.py); None: not priced
    certificate: CostCertificate | None = None  # --objective cost: removals, swaps, cheaper step
    judge: QuantJudge | None = field(default=None, repr=False)  # the run's judge
    reference: str = "the model with its Q/DQ removed"
    # every tool's rendering of the plan (outputs/quantized.py `renderings`), left JSON:
    # precision.json's "renderings" as written; its ModelOpt reproduction read by attribute
    # (`reproduction`: its path is where ptq.keep_side_files kept its file in --out,
    # `_recorded`)
    renderings: dict = field(default_factory=dict)

    # the written file's margin over the spread (stages/spread.py)
    certified: CertificateRecord | None = None
    validation: Validation | None = None  # the written file on unseen samples
    needed: dict[str, bool] = field(default_factory=dict)  # per plan unit: removing it fails
    faster: dict[str, float] = field(default_factory=dict)  # per unit not needed: est. saving
    minimal_plan: list[str] = field(default_factory=list)  # the certified 1-minimal plan
    reasons: list[str] = field(default_factory=list)  # why even all-float fails

    def __post_init__(self) -> None:
        if (self.errors_before, self.errors_after) != (_errors(self.before), _errors(self.after)):
            raise ValueError("a QuantResult's errors before and after are those of `before` "
                             "and `after`")

    @property
    def reproduction(self) -> Reproduction | None:
        """ModelOpt's own run of the rendered exclusions (quant/ptq.py `reproduce`), from
        the renderings that precision.json writes it in."""
        return Reproduction.of(self.renderings)

    @property
    def minimality(self) -> str:
        """How the plan was certified, in words (the console's and the report's)."""
        cert = self.certificate
        step = cert.cheaper if cert is not None else None
        moves = len(step.moves) if step is not None else 0
        if cert is not None and step is not None and moves and cert.minimal_price_s:
            saved = 1 - cert.price_s / cert.minimal_price_s
            left = step.cheaper_neighbours_unjudged
            return (f"a 1-minimal plan made {100 * saved:.1f}% cheaper in {moves} step(s) to "
                    "cheaper passing plans one unit away"
                    + (f" ({left} cheaper ones left unjudged: the step's allowance)"
                       if left else ""))
        return "certified 1-minimal" if self.one_minimal else "not certified minimal"

    @property
    def one_judge(self) -> bool | None:
        """The written file's errors equal the search's, bit for bit (None: not compared)."""
        if self.after is None or self.search_after is None:
            return None
        return _same(self.after, self.search_after)

    def _culprits(self) -> list[tuple[str, str, str]]:
        """(unit, name, side) of every unit of the plan: a quantized layer, an FP16 node."""
        half = {n: u for u, n in (self.judge.half.items() if self.judge else ())}
        return ([(n, n, "quantized") for n in self.plan]
                + [(half.get(n, "fp32:" + n), n, "fp16") for n in self.fp32_nodes])

    def rendered(self) -> QuantPlan:
        """The plan as the renderings take it (outputs/quantized.py): plain data."""
        return _quant_plan(self.model_path, self.reference, self.layers, self.plan,
                           self.fp32_ops, self.half_nodes, self.units)

    def layer(self, name: str) -> qdq.Layer:
        return next(la for la in self.layers if la.name == name)

    def to_json(self) -> dict:
        return _finite(self._json())

    def _json(self) -> dict:
        from .. import __version__

        def errors(v: Verdict | None) -> dict:
            return {k: e.to_json() for k, e in v.errors.items()} if v is not None else {}

        formats: dict[str, int] = {}
        for la in self.layers:
            for f in la.formats:
                formats[f] = formats.get(f, 0) + 1
        return {
            "tool": "trtbisect", "version": __version__, "mode": "quantized",
            "model": self.model_path, "verdict": self.verdict, "reference": self.reference,
            "quantized_layers": len(self.layers), "formats": formats,
            "unquantized_layers": self.plan, "fp32_nodes": self.fp32_nodes,
            "fp16_nodes_in_file": self.half_nodes,
            "sides": {**{n: "quantized" for n in self.plan},
                      **{n: "fp16" for n in self.fp32_nodes}},
            "fp32_node_reasons": self.fp32_reasons,
            "plan": [{**self.layer(n).to_json(), "needed": self.needed.get(n, True),
                      "findings": [f.to_json() for f in self.findings.get(n, [])],
                      "fixes_judged": [f.to_json() for f in self.fixes.get(n, [])]}
                     for n in self.plan],
            "culprits": [{"name": n, "side": side, "needed": self.needed.get(u, True),
                          **({"faster_by": self.faster[u]} if u in self.faster else {})}
                         for u, n, side in self._culprits()],
            "minimal_plan": self.minimal_plan,
            "certificate": self.certified.to_json() if self.certified is not None else None,
            "margins": ({k: m.to_json() for k, m in self.certified.outputs.items()}
                        if self.certified is not None else None),
            "validation": self.validation.to_json() if self.validation else None,
            "reasons": self.reasons,
            "errors_before": errors(self.before), "errors_after": errors(self.after),
            "judged": {"before": self.before.to_json() if self.before else None,
                       "after": self.after.to_json() if self.after else None},
            "one_judge": {"search_equals_check": self.one_judge,
                          "search": errors(self.search_after)},
            "criteria": self.criteria.describe(), "fp16_stores_emulated": self.emulated,
            "semantics": self.semantics,
            "cost": self.cost.to_json() if self.cost is not None else {},
            "evaluations": self.evaluations,
            "one_minimal": self.one_minimal,
            "trials": [t.to_json() for t in self.trials], "renderings": self.renderings,
            "reference_problems": self.reference_problems, "files": self.files,
            "seconds": round(self.seconds, 3),
            "layers": [la.to_json() for la in self.layers]}


def _quant_plan(model_path: str, reference: str, layers: Sequence[qdq.Layer],
                plan: Sequence[str], fp32_ops: dict[str, str], half_nodes: int,
                units: Sequence[str]) -> QuantPlan:
    return QuantPlan(model_path=model_path, reference=reference,
                     formats=frozenset(f for la in layers for f in la.formats),
                     unquantized=tuple(plan), fp32_ops=tuple(sorted(set(fp32_ops.values()))),
                     half=bool(half_nodes), plan_file=bool(units))


# What the quantized run's steps find, each a frozen record the step returns; `assemble`
# builds the QuantResult from them in one constructor call.

@dataclass(frozen=True)
class Start:
    """What the run starts from, before anything is judged: the model, its quantized layers,
    the reference and its words, the samples and the criteria."""
    model_path: str
    layers: list[qdq.Layer]
    reference: str
    emulated: bool  # the file has float16 values
    semantics: str
    samples: int  # all of them (the search's, after the hold-out: `Searched.samples`)
    tolerance: Tolerance
    criteria: Criteria
    reference_problems: list[str]  # the FP32 reference is non-finite: `reference_invalid`


@dataclass(frozen=True)
class Honest:
    """Which units of the written plan accuracy needs (`_honest`): the certified 1-minimal
    plan, per unit whether removing it fails, what a unit not needed saves, and the
    removals judged for it (evaluations of the run, in its trace). Empty: no plan."""
    minimal_plan: list[str] = field(default_factory=list)
    needed: dict[str, bool] = field(default_factory=dict)
    faster: dict[str, float] = field(default_factory=dict)
    trials: list[Trial] = field(default_factory=list)  # the removals judged, phase "needed"


@dataclass(frozen=True)
class Searched:
    """The file as given judged by the run's judge, and (where it fails) the search's
    outcome: the verdict it proposes (`quantized_ok`, `fixed`, `no_plan`), the plan, what
    each of its units is for, the fixes judged and the price. A run whose
    reference is non-finite judges nothing: no judge, `reference_invalid` proposed."""
    judge: QuantJudge | None
    samples: int  # the search's (held-out ones aside)
    before: Verdict | None  # the file as given
    proposed: VerdictName
    half_nodes: int = 0  # FP16 nodes the file has
    search: SearchResult | None = None  # None: nothing searched (the file passes as given)
    evaluations: int = 0
    trials: list[Trial] = field(default_factory=list)
    certificate: CostCertificate | None = None
    units: list[str] = field(default_factory=list)
    plan: list[str] = field(default_factory=list)
    fp32_nodes: list[str] = field(default_factory=list)
    search_after: Verdict | None = None
    honest: Honest = field(default_factory=Honest)
    findings: dict[str, list[Finding]] = field(default_factory=dict)  # the plan's layers'
    fixes: dict[str, list[FixJudged]] = field(default_factory=dict)
    fp32_reasons: dict[str, str] = field(default_factory=dict)
    fp32_ops: dict[str, str] = field(default_factory=dict)
    cost: QuantCost | None = None


@dataclass(frozen=True)
class Certification:
    """A file's certificate and validation (`_certify`): the written plan's, or the file as
    given's (`quantized_ok` is held to them as `fp16_ok` is); `uncertified`: what misses
    the margin, in words."""
    certified: CertificateRecord
    validation: Validation
    uncertified: tuple[str, ...] = ()


@dataclass(frozen=True)
class FileJudged:
    """The plan's file judged as `check` judges it (one judge: the written file, or without
    --out the in-memory model), and its certificate where it passes."""
    after: Verdict
    certification: Certification | None


def assemble(start: Start, s: Searched, shown: dict, *, written: FileJudged | None = None,
             given: Certification | None = None, reasons: Sequence[str] = (),
             seconds: float = 0.0, model_path: str | None = None) -> QuantResult:
    """The run's result, built once from what its steps found (`shown`: the renderings),
    when the last of them is in (the judge runs nothing after: its `runs` are the run's
    inferences): the verdict is the search's proposal decided by every finding at once
    (judge/verdict.decide: the written file, its certificate and its validation; for the
    file as given, `given`, its own certificate)."""
    cert = written.certification if written is not None else given
    findings = Findings(s.proposed,
                        file_passed=written.after.passed if written is not None else None,
                        certified=cert.certified.certified if cert is not None else None,
                        validated=cert.validation.passed if cert is not None else None)
    verdict = findings.verdict()
    if cert is not None and verdict == "fragile":
        log.warning("the plan passes by less than the spread of what the tools compute on "
                    "%s (fragile): it is written, but not called fixed",
                    "; ".join(cert.uncertified))
    elif cert is not None and verdict == "unvalidated":
        log.warning("the plan fails %s it was not searched on (unvalidated): it is written, "
                    "but not called fixed", cert.validation.described)
    after = written.after if written is not None else None
    h = s.honest
    return QuantResult(
        verdict=verdict, verdict_findings=findings, fp32_nodes=s.fp32_nodes,
        candidates=len(s.judge.units) if s.judge is not None else 0,
        evaluations=s.evaluations + len(h.trials),
        inferences=s.judge.runs if s.judge is not None else 0, samples=s.samples,
        tolerance=start.tolerance, errors_before=_errors(s.before), errors_after=_errors(after),
        one_minimal=s.search.one_minimal if s.search is not None else False, search=s.search,
        reference_problems=start.reference_problems, seconds=seconds, criteria=start.criteria,
        model_path=model_path or start.model_path, layers=start.layers, plan=s.plan,
        before=s.before, after=after, search_after=s.search_after,
        trials=[*s.trials, *h.trials], findings=s.findings, half_nodes=s.half_nodes,
        fp32_reasons=s.fp32_reasons, units=s.units, fp32_ops=s.fp32_ops,
        emulated=start.emulated, semantics=start.semantics, fixes=s.fixes, cost=s.cost,
        certificate=s.certificate, judge=s.judge, reference=start.reference, renderings=shown,
        certified=cert.certified if cert is not None else None,
        validation=cert.validation if cert is not None else None, needed=h.needed,
        faster=h.faster, minimal_plan=h.minimal_plan, reasons=list(reasons))


def _errors(v: Verdict | None) -> dict:
    """Found's errors before and after: those of the verdicts, always."""
    return dict(v.errors) if v is not None else {}


def _finite(obj):
    """JSON has no NaN or infinity: they are written as strings ("nan", "inf")."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _same(a: Verdict, b: Verdict) -> bool:
    if a.passed != b.passed or set(a.errors) != set(b.errors):
        return False
    return all(a.errors[k].max_abs == b.errors[k].max_abs
               or (np.isnan(a.errors[k].max_abs) and np.isnan(b.errors[k].max_abs))
               for k in a.errors)


def load(path: str | Path) -> onnx.ModelProto:
    """The model with its weights in one proto (one-line errors as for every model)."""
    from ..graph import load_model

    p = Path(path)
    model = load_model(p)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        from onnx.external_data_helper import load_external_data_for_model
        load_external_data_for_model(model, str(p.parent))
    return model


def is_quantized_file(path: str | Path) -> bool:
    """The CLI's hook: does this ONNX file hold Q/DQ (explicit quantization)? False for
    anything that is not a readable ONNX file (the FP16 run then says what is wrong)."""
    if not _mentions(path, b"DequantizeLinear"):  # most models: no parse at all
        return False
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - not ours to report: the normal run reports it
        return False
    return qdq.is_quantized(model)


def _mentions(path: str | Path, word: bytes, chunk: int = 1 << 24) -> bool:
    """Does the file hold `word` anywhere (an op type is stored as plain UTF-8)? Read in
    chunks: a big model is never held twice."""
    try:
        with open(path, "rb") as fh:
            tail = b""
            while True:
                block = fh.read(chunk)
                if not block:
                    return False
                window = tail + block
                if word in window:
                    return True
                tail = window[-(len(word) - 1):]
    except OSError:
        return False


def wants_quantized(model: str | Path, precision: str, reference: str | None,
                    calibration: Sequence[str] = ()) -> bool:
    """The CLI's hook: `run` takes the quantized road for a model holding Q/DQ, or for
    `--precision int8|fp8`; `--reference` belongs to that road only, `--calibration` to
    `--precision int8|fp8` on a float model."""
    from ..judge.precision import QUANTIZED

    quantized = is_quantized_file(model)
    if calibration and (precision not in QUANTIZED or quantized):
        raise TrtBisectError("--calibration gives ModelOpt its samples: it goes with "
                             "--precision int8|fp8 on an FP32 model"
                             + (f" ({model} is already quantized)" if quantized else ""))
    if precision in QUANTIZED or quantized:
        return True
    if reference is not None:
        raise TrtBisectError("--reference is for a quantized (Q/DQ) model or --precision "
                             f"int8|fp8; {model} holds no DequantizeLinear")
    return False


def _check_reference(model: onnx.ModelProto, ref: onnx.ModelProto, where: str) -> None:
    mine = sorted(o.name for o in model.graph.output)
    theirs = sorted(o.name for o in ref.graph.output)
    if mine != theirs:
        raise TrtBisectError(f"--reference {where} has outputs {visible(theirs)}, the quantized "
                             f"model {visible(mine)}: give the FP32 model it was quantized from")
    ins = {i.name for i in model.graph.input} - {t.name for t in model.graph.initializer}
    rins = {i.name for i in ref.graph.input} - {t.name for t in ref.graph.initializer}
    if ins != rins:
        raise TrtBisectError(f"--reference {where} has inputs {visible(sorted(rins))}, the "
                             f"quantized model {visible(sorted(ins))}")


def activation_values(ref_model: onnx.ModelProto, layers: Sequence[qdq.Layer],
                      samples, threads: int | None, extra: Sequence[str] = ()
                      ) -> dict[str, list[np.ndarray]]:
    """The reference's values of every quantized activation's float source (and of `extra`
    tensors), on the first few samples."""
    from .judge import run_outputs, session

    sources = sorted({e.source for la in layers for e in la.edges if not e.weight} | set(extra))
    inputs = {i.name for i in ref_model.graph.input}
    produced = {t for n in ref_model.graph.node for t in n.output}
    inner = [s for s in sources if s in produced and s not in inputs]
    if _half(ref_model):  # the FP32 view of a float16 file: the values the reference has
        from .half import fp32_view
        probe = fp32_view(ref_model)
    else:
        probe = onnx.ModelProto()
        probe.CopyFrom(ref_model)
    have = {o.name for o in probe.graph.output}
    for t in inner:
        if t not in have:
            probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(t))
    sess = session(probe, threads) if inner else None
    values: dict[str, list[np.ndarray]] = {s: [] for s in sources}
    for k, sample in enumerate(samples):
        if k >= SAMPLES:
            break
        got = run_outputs(sess, sample, inner) if sess is not None else {}
        for s in sources:
            v = got.get(s, sample.get(s))
            if v is not None and np.issubdtype(np.asarray(v).dtype, np.floating):
                values[s].append(np.asarray(v, np.float32))
    return values


def _half(model: onnx.ModelProto) -> bool:
    from .half import HALF
    return any(t.data_type in HALF for t in model.graph.initializer) or any(
        a.name == "to" and a.i in HALF for n in model.graph.node for a in n.attribute)


FP16_MAX = 65504.0


def half_reasons(model: onnx.ModelProto, nodes: Sequence[str],
                 values: dict[str, list[np.ndarray]]) -> dict[str, str]:
    """Why an FP16 node of the file needs FP32: what it reads and writes in the reference."""
    def top(names) -> float:
        return max([float(np.max(np.abs(v))) for t in names for v in values.get(t, ())
                    if np.size(v)] + [0.0])
    by_name = {n.name: n for n in model.graph.node}
    reasons = {}
    for name in nodes:
        node = by_name[name]
        reads, writes = top(node.input), top(node.output)
        if writes > FP16_MAX:
            reasons[name] = f"writes {writes:.3g} in FP32, beyond FP16's 65504"
        elif reads > FP16_MAX:
            reasons[name] = (f"reads {reads:.3g} (beyond FP16's 65504) and brings it back to "
                             f"{writes:.3g}")
        else:
            reasons[name] = ("its FP16 rounding breaks the criteria (it reads at most "
                             f"{reads:.3g} and writes at most {writes:.3g})")
    return reasons


def _ranking(layers: Sequence[qdq.Layer], findings: dict[str, list[Finding]],
             half_units: dict[str, str | tuple[str, ...]] | None = None,
             values: dict[str, list[np.ndarray]] | None = None,
             model: onnx.ModelProto | None = None) -> list[str]:
    """Most suspicious first: FP16 nodes that overflow, the layers by their findings' kinds
    and measured quantization noise, then the other FP16 nodes in graph order."""
    weight = {"saturation": 4.0, "activation_outlier": 3.0, "oversized_scale": 3.0,
              "softmax_input": 2.0,
              "layernorm_input": 2.0, "weight_channel_range": 2.0}

    def score(la: qdq.Layer) -> float:
        fs = findings.get(la.name, [])
        noise = max([f.evidence.get("noise", 0.0) for f in fs
                     if isinstance(f.evidence.get("noise"), float)
                     and not np.isnan(f.evidence["noise"])] + [0.0])
        return max([weight.get(f.kind, 0.0) for f in fs] + [0.0]) + noise
    order = {la.name: i for i, la in enumerate(layers)}
    ranked = sorted(order, key=lambda n: (-score(next(la for la in layers if la.name == n)),
                                          order[n]))
    if not half_units:
        return ranked
    over = set()
    if model is not None and values is not None:
        outs = {n.name: [o for o in n.output if o] for n in model.graph.node}
        over = {u for u, ns in half_units.items()
                if any(np.size(v) and float(np.max(np.abs(v))) > FP16_MAX
                       for n in ((ns,) if isinstance(ns, str) else ns)
                       for o in outs.get(n, ()) for v in values.get(o, ()))}
    rest = [u for u in half_units if u not in over]
    return [u for u in half_units if u in over] + ranked + rest


def run(model_path: str | Path, opts: Options, out_dir: Path | None = None,
        reference_path: str | Path | None = None, progress: Progress | None = None,
        stage: Callable[[str], None] = log.info,
        report: Callable[[QuantResult, Path], dict[str, str]] | None = None,
        owned: bool = False) -> QuantResult:
    """The whole quantized run (see the module docstring); `opts`: context.Options (its
    samples, criteria, tolerance, threads, gpu, objective and --max-evals are used);
    `report`: --report's writer (quant/pages.py, handed in by quant/console.py), called
    inside --out's generation; it returns the files it wrote. `owned`: the model is
    trtbisect's own (ModelOpt's output in a temporary folder): the judged file is kept in
    --out whatever the verdict. Each step returns what it found; the result is assembled
    once from it (`assemble`, in `_write`: for a plan, once its written file is judged)."""
    from ..context import reference_problems

    started = time.perf_counter()
    path = Path(model_path)
    keep = [path, *_sources(opts.sample), *([Path(reference_path)] if reference_path else [])]
    model, layers, ref_model, where = _load(path, reference_path, stage)
    opts.judge.criteria.validate([o.name for o in ref_model.graph.output])
    samples, references = _samples(ref_model, opts.sample, opts.judge, path, reference_path)
    start = Start(str(path), layers, where, _half(model), opts.judge.semantics, len(samples),
                  opts.judge.tolerance, opts.judge.criteria,
                  reference_problems(  # it reads ctx.every_reference only
                      SimpleNamespace(every_reference=references)))  # type: ignore[arg-type]
    if start.reference_problems:
        nothing = Searched(None, len(samples), None, "reference_invalid")
        return _write(start, nothing, {}, [], time.perf_counter() - started, path, out_dir,
                      keep)
    samples, references, held = _hold_out(samples, references, ref_model, opts.sample,
                                          opts.judge)
    journal = _journal(out_dir, opts.judge, opts.search.objective, opts.output.resume, path,
                       reference_path, samples)
    try:
        searched = _search(start, model, ref_model, samples, references, opts, progress,
                           stage, journal)
    finally:
        if journal is not None:
            journal.close()
    shown = _renderings(start, searched, reference_path if owned else None, path)
    reasons = float_side_reasons(model) if searched.proposed == "no_plan" else []
    judge = searched.judge
    assert judge is not None

    def certify(written: Path | onnx.ModelProto) -> Certification:
        return _certify(judge, searched.search, ref_model, samples, references, held,
                        opts.judge, written)
    return _write(start, searched, shown, reasons, time.perf_counter() - started, path,
                  out_dir, keep, report, certify, owned)


def _renderings(start: Start, searched: Searched, reproduce_from: str | Path | None,
                source: Path) -> dict:
    """Every tool's rendering of the plan (outputs/quantized.py); `reproduce_from`: the FP32
    model trtbisect quantized `source` from (--precision int8|fp8), for ModelOpt's own run of
    the rendered exclusions beside them (quant/ptq.py `reproduce`)."""
    if searched.judge is None:
        return {}
    plan = _quant_plan(start.model_path, start.reference, start.layers, searched.plan,
                       searched.fp32_ops, searched.half_nodes, searched.units)
    plain = renderings(plan)
    if reproduce_from is None:
        return plain
    from .ptq import reproduce
    given = SimpleNamespace(plan=searched.plan, layers=start.layers, renderings=plain)
    return renderings(plan, reproduce(given, searched.judge, Path(reproduce_from), source),
                      calibrated=True)


def _hold_out(samples, references, ref_model: onnx.ModelProto, sample: SampleOptions,
              judge: JudgeOptions):
    """The search's samples and the validation's (judge/validation.py), as the FP16 road
    holds them out."""
    from ..backends.ort import Reference
    from ..data.store import View
    from ..graph import Graph
    from ..judge import validation

    def reference(batch):
        ref = Reference(Graph(ref_model), judge.threads)
        try:
            return [ref.run(s) for s in batch]
        finally:
            ref.close()
    kept, held = validation.hold_out(
        samples, references, sample.validation_share, sample.seed, reference,
        validation.shape_like_inputs(Graph(ref_model)) if len(samples) == 1 else frozenset())
    if len(kept) < len(samples):
        samples, references = View(samples, kept), View(references, kept)
    return samples, references, held


def _certify(judge: QuantJudge, search: SearchResult | None, ref_model: onnx.ModelProto,
             samples, references, held, judge_opts: JudgeOptions,
             written: Path | onnx.ModelProto) -> Certification:
    """The written file's certificate and validation, as the FP16 road's (stages/spread.py,
    judge/validation.py): the findings that decide the verdict they allow (`assemble`,
    judge/verdict.py: the file as given, `quantized_ok`, is held to them as FP16 as it is,
    `fp16_ok`, is)."""
    from ..graph import Graph
    from ..judge import validation
    from ..judge.mixed import Written
    from ..stages.spread import certify

    model = written if isinstance(written, onnx.ModelProto) else onnx.load(str(written))
    judged = judge.judged_model(model)
    per_sample = judge.judgements(judged)
    ctx = SimpleNamespace(graph=Graph(ref_model), every_sample=samples,
                          every_reference=references)
    cert = certify(ctx, judge_opts, Written(judged, {}), per_sample)  # type: ignore[arg-type]
    if search is not None and search.noisy is not None:
        cert = cert.stopped_on(search.noisy)  # the search stopped: `fragile` at once
    checked = validation.judged(held, lambda pairs: judge.judgements(judged, pairs),
                                judge_opts.criteria.verdict)
    return Certification(cert.record(), checked, tuple(cert.uncertified))


def float_side_reasons(model: onnx.ModelProto) -> list[str]:
    """Why even the all-float plan can fail: broken weights or constants of the given file,
    by name, and which tool probably wrote it (quant/broken.py)."""
    from .broken import reasons
    return reasons(model)


def _load(path: Path, reference_path: str | Path | None, stage: Callable[[str], None]):
    """The model (nodes named), its quantized layers, the reference model and its words."""
    from ..graph import with_node_names

    model = with_node_names(load(path))  # unnamed nodes get trtbisect's names (graph/names.py)
    layers = qdq.analyse(model)
    if not layers:
        raise TrtBisectError(f"{path} holds DequantizeLinear nodes but no quantized layer "
                             "trtbisect can un-quantize (a DQ of a quantized graph input?)")
    formats = ", ".join(sorted({f for la in layers for f in la.formats}))
    stage(f"{len(layers)} quantized layers ({formats})")
    if reference_path is not None:
        ref_model = load(reference_path)
        _check_reference(model, ref_model, str(reference_path))
        return model, layers, ref_model, f"{reference_path}"
    where = "the model with its Q/DQ removed" + (", in FP32" if _half(model) else "")
    return model, layers, qdq.reference(model, layers), where


def _samples(ref_model: onnx.ModelProto, given: SampleOptions, judge: JudgeOptions, path: Path,
             reference_path):
    """The run's samples (validated against the reference's inputs) and FP32 outputs."""
    from ..base.limits import set_eval_timeout
    from ..data.sources import iter_items
    from ..data.store import SampleSet, reference_set
    from ..graph import Graph, model_hash

    set_eval_timeout(judge.eval_timeout)  # every inference of this run (limits.py)
    ref_graph = Graph(ref_model)  # a float16 file's reference computes in FP32 (its upcast)
    samples = SampleSet(iter_items(ref_graph, list(given.inputs), given.data_loader, given.shapes,
                                   given.seed, given.samples, given.limits), limits=given.limits)
    references = reference_set(ref_graph, samples, judge.threads,
                               f"quant:{model_hash(path)}:{reference_path}", None)
    judge.criteria.check_fit(references[0])
    return samples, references


def _journal(out_dir: Path | None, judge: JudgeOptions, objective: str, resume: bool, path: Path,
             reference_path, samples):
    """The run's journal (journal.py) in --out: a killed run started again with the same
    arguments replays the evaluations it finished (--no-resume: `resume` False empties it).
    None without --out."""
    from .. import __version__
    from ..graph import model_hash
    from ..search.journal import Journal

    if out_dir is None:
        return None
    from ..context import run_fingerprint
    fingerprint = run_fingerprint(  # the FP16 road's: JudgeSettings' and the road's own keys
        judge.settings.fingerprint(), model_hash(path), samples, __version__,
        mode="quantized", objective=objective,
        reference=model_hash(reference_path) if reference_path else None)
    out_dir.mkdir(parents=True, exist_ok=True)
    journal_path = out_dir / "journal.jsonl"
    if not resume and journal_path.exists():
        journal_path.unlink()
    return Journal(journal_path, fingerprint)


def _journaled(judge: QuantJudge, journal, pressures: dict[frozenset[str], dict[str, float]]
               ) -> Callable[[frozenset[str]], bool]:
    """The search's check: a journaled verdict is replayed, any other judged and recorded
    (marked started first, so a plan that kills the process is not run forever). Each
    verdict's pressures per output (judge/compare.py `pressure`) go into `pressures`, for the
    search's watch on its own noise (search/noise.py), and into the journal with it."""
    from ..judge.compare import pressure
    from ..judge.criteria import json_number
    from ..search.journal import plan_key

    def check(plan: frozenset[str]) -> bool:
        if journal is None:
            v = judge.measure(plan)
            pressures[plan] = pressure([v.errors])
            return v.passed
        key = plan_key(plan)
        if judge.active is not None:  # a verdict on the search's samples: keyed by them
            key += "@" + subset.signature(judge.active)
        rec = journal.lookup(key)
        if rec is not None:
            pressures[plan] = {o: float(p) for o, p in rec.get("pressure", {}).items()}
            return bool(rec["passed"])
        journal.start(key)
        v = judge.measure(plan)
        pressures[plan] = pressure([v.errors])
        journal.record(key, v.passed, {"rel": {k: e.rel for k, e in v.errors.items()},
                                       "pressure": {o: json_number(p)
                                                    for o, p in pressures[plan].items()}})
        return v.passed
    return check


def _search(start: Start, model: onnx.ModelProto, ref_model: onnx.ModelProto,
            samples, references, opts: Options, progress: Progress | None,
            stage: Callable[[str], None], journal=None) -> Searched:
    """Judge the file, diagnose its layers, search the plan, judge the fixes, price it. (The
    whole options: it reads the judge, the search and the samples' subset size.)"""
    from .cost import float_side, pricing_for, shape_probe
    from .half import half_nodes

    layers = start.layers
    halves = half_nodes(model)
    j = opts.judge
    judge = QuantJudge(model, layers, samples, references, j.criteria, j.tolerance, j.threads,
                       halves, j.semantics, j.tf32)
    pricing = pricing_for(model, layers, judge.half, samples[0], opts.search.gpu, start.emulated,
                          shape_probe(model, samples[0], opts.judge.threads))
    stage("judging the quantized model as given")
    given, before = judge.measure_all(frozenset())
    stage("diagnosing the quantized layers")
    outs = [t for n in model.graph.node if n.name in set(halves)
            for t in [*n.input, *n.output] if t]
    values = activation_values(ref_model, layers, samples, opts.judge.threads, outs)
    findings = {la.name: diagnose(model, la, values, judge.weights) for la in layers}
    search, trials, certificate = None, [], None
    units: list[str] = []
    search_after, honest = None, Honest()
    proposed: VerdictName = "quantized_ok"
    if not given.passed:
        stage(f"searching which of {len(layers)} quantized layers to run in float"
              + (f" and which of {len(halves)} FP16 nodes to keep in FP32" if halves else ""))
        ranking = _ranking(layers, findings, _search_half(judge), values, model)
        if subset.wanted(len(samples), opts.sample.search_samples, opts.judge.criteria.pass_rate):
            judge.narrow(subset.choose(before, opts.sample.search_samples))
            stage(f"the search judges on {len(judge.active or ())} of {len(samples)} samples "
                  "(where the file as given fails worst); the plan is certified on all of them")
        pressures: dict[frozenset[str], dict[str, float]] = {}
        check = _journaled(judge, journal, pressures)
        by_cost = opts.search.objective == "cost"
        search = _rounds(judge, opts.search.max_evaluations, opts.sample.search_samples, stage,
                         lambda left: find_minimal_fp32(
                             judge.units, check, ranking=ranking, max_evaluations=left,
                             progress=progress, watch=watching(
                                 lambda plan: (pressures[plan], True) if plan in pressures
                                 else None, SPREAD_SHARE),
                             **(_cost_search(judge, model, pricing) if by_cost else {})))
        trials = _scored(search.trials, pricing, judge, journal)
        certificate = (CostCertificate.of_search(search.certificate)
                       if search.certificate is not None else None)
        proposed = "no_plan"
        if search.found:
            units = judge.expand(search.fp32)
            search_after = judge.measure(frozenset(search.fp32))
            proposed = "fixed"
            honest = _honest(judge, units, search, pricing, check, len(trials))
    plan = [u for u in units if u not in judge.half]
    fp32_nodes = [judge.half[u] for u in units if u in judge.half]
    mine = {n: findings[n] for n in plan}
    fixes = {}
    if plan:
        stage("judging the fixes diagnosis names, where trtbisect can apply them")
        fixes = judge_fixes(judge, model, layers, plan, units, mine, values)
    cost = QuantCost.from_json({
        **pricing.summary(units), "objective": opts.search.objective,
        "float_side": float_side(pricing),
        **({"certificate": certificate.to_json()} if certificate else {}),
        **_one_price(model, ref_model, layers, halves, samples[0], opts.judge,
                     opts.search.gpu, pricing.all_fp16())})
    return Searched(judge, len(samples), given, proposed, len(halves), search,
                    search.evaluations if search is not None else 0, trials, certificate,
                    units, plan, fp32_nodes, search_after, honest, mine, fixes,
                    half_reasons(model, fp32_nodes, values),
                    {n.name: n.op_type for n in model.graph.node if n.name in set(fp32_nodes)},
                    cost)


def _rounds(judge: QuantJudge, most: int | None, search_samples: int,
            stage: Callable[[str], None], search: Callable[[int | None], SearchResult]
            ) -> SearchResult:
    """`search(budget)` on the judge's samples, `most` evaluations in all (--max-evals); when
    they are a subset (of `search_samples`: --search-samples, judge/subset.py), the plan
    found is judged on every sample and the samples it fails join the subset for another
    search, until it passes everywhere: the FP16 road's rounds
    (stages/search.py). Evaluations and trials add up over rounds; the judge judges every
    sample again afterwards."""
    evaluations, trials = 0, []
    while True:
        left = None if most is None else max(most - evaluations, 0)
        found = search(left)
        trials += [replace(t, index=t.index + evaluations) for t in found.trials]
        evaluations += found.evaluations
        if not found.found or judge.active is None:
            break
        verdict, judged = judge.measure_all(frozenset(found.fp32))
        evaluations += 1
        wider = subset.widen(judge.active, judged, search_samples)
        if verdict.passed or len(wider) == len(judge.active):
            break
        stage(f"the plan fails {sum(not j.passed for j in judged)} of {len(judged)} samples: "
              f"searching again on {len(wider)} samples")
        judge.narrow(wider)
    judge.narrow(None)
    return replace(found, evaluations=evaluations, trials=trials)


def _one_price(model: onnx.ModelProto, ref_model: onnx.ModelProto, layers, halves,
               sample, judge: JudgeOptions, gpu: str, file_float_s: float) -> dict:
    """One price per model and GPU class (#46): all-FP16 as the FP16 road prices the float
    model (an FP16 run of it says the same figure), beside this file's own float side,
    whose nodes outside the quantized layers a quantizer may have left FP32 (named, priced
    as FP32 in every figure of the file)."""
    from . import half
    from .cost import fp16_road_price

    types = half.types(model)
    inside = {la.name for la in layers}
    fp32 = [n.name for n in model.graph.node
            if n.op_type not in ("QuantizeLinear", "DequantizeLinear", "Cast")
            and n.name not in inside and n.name not in set(halves)
            and any(types.get(t) == onnx.TensorProto.FLOAT for t in n.output if t)]
    try:
        road = fp16_road_price(ref_model, sample, gpu, judge.trt_version, judge.threads)
    except TrtBisectError as exc:  # a float model the FP16 road cannot price: say so
        log.info("all-FP16 not priced as the FP16 road: %s", exc)
        road = None
    return {"all_fp16_s": road if road is not None else file_float_s,
            "all_fp16_from": "the FP16 road's engine of the float model" if road is not None
            else "this file's float side in FP16",
            "file_all_float_s": file_float_s, "file_fp32_nodes": len(fp32),
            "file_fp32_examples": fp32[:5]}


def _honest(judge: QuantJudge, units: list[str], search: SearchResult, pricing,
            check: Callable[[frozenset[str]], bool], judged: int) -> Honest:
    """Which units of the written plan (`units`) accuracy needs: a unit is needed when the
    plan without it fails. The certified 1-minimal plan's removals all failed (its
    certificate), and the cheaper step judged the removals that were cheaper; a removal
    neither judged is judged here (memoized and journaled: at most one evaluation per unit of
    the plan, counted, numbered after the search's `judged` trials). A unit whose removal
    passes was kept (or added by the cheaper step) for estimated engine time, with what it
    saves (`faster`). The 1-minimal plan, before the cheaper step changed it, is always
    recorded."""
    from .report import worst_rel

    final = frozenset(search.fp32)
    minimal = (search.certificate.minimal_plan if search.certificate is not None else None
               ) or list(search.fp32)
    trials: list[Trial] = []
    needed_units: set[str] = set()
    order = {u: k for k, u in enumerate(judge.units)}
    for s in sorted(final, key=order.__getitem__):
        rest = final - {s}
        before = judge.runs
        passed = check(rest)
        if judge.runs > before:  # judged here: an evaluation of the run, in its trace
            trials.append(Trial(judged + len(trials) + 1,
                                tuple(sorted(rest, key=order.__getitem__)), passed,
                                "needed", pricing.price(judge.expand(rest)),
                                worst_rel(judge.measure(rest).errors)))
        if not passed:
            needed_units.add(s)
    need = set(judge.expand(needed_units))
    needed = {u: u in need for u in units}
    plan = pricing.price(units)
    faster = {}
    for u in units:
        if not needed[u]:
            without = pricing.price([v for v in units if v != u])
            faster[u] = (without - plan) / without if without > 0 else 0.0
    return Honest(judge.expand(minimal), needed, faster, trials)


def _cost_search(judge: QuantJudge, model: onnx.ModelProto, pricing) -> dict:
    """`--objective cost`'s arguments to the search: the plan's price, the units joined by a
    tensor as swap neighbours (adjacent.py), and the step to cheaper passing plans one unit
    away (search/cheaper.py: the price is not monotone), at most CHEAPER_PER_UNIT new
    evaluations per unit."""
    from ..search.cheaper import Cheaper
    from .adjacent import unit_adjacency

    nodes = {**{la.name: (la.name,) for la in judge.layers},
             **{u: (n,) for u, n in judge.half.items()},
             **{u: tuple(judge.half[m] for m in ms) for u, ms in judge.fused.items()}}
    units = judge.units
    memo: dict[frozenset[str], float] = {}

    def price(plan: frozenset[str]) -> float:
        key = frozenset(plan)
        if key not in memo:
            memo[key] = pricing.price(judge.expand(key))
        return memo[key]
    adjacent = unit_adjacency(model, {u: nodes[u] for u in units})
    return {"price": price, "adjacent": adjacent,
            "after": Cheaper(units, price, adjacent, CHEAPER_PER_UNIT * len(units))}


def _scored(trials, pricing, judge: QuantJudge, journal) -> list:
    """Each evaluated plan with its estimated time and worst relative error (the trade-off
    plot's points): the judge's verdict, or the journal's record of a replayed one."""
    from ..search.journal import plan_key
    from .report import worst_rel

    def score(plan) -> float | None:
        v = judge.verdicts.get(frozenset(plan))
        if v is not None:
            return worst_rel(v.errors)
        rec = journal.lookup(plan_key(frozenset(plan))) if journal is not None else None
        rel = (rec or {}).get("rel") if isinstance(rec, dict) else None
        return max(float(x) for x in rel.values()) if isinstance(rel, dict) and rel else None
    return [replace(t, price=pricing.price(judge.expand(t.fp32)), score=score(t.fp32))
            for t in trials]


def _search_half(judge: QuantJudge) -> dict[str, str | tuple[str, ...]]:
    """The search's FP16 units and their nodes (a fused layer's unit: all of them)."""
    units = set(judge.units)
    out: dict[str, str | tuple[str, ...]] = {u: n for u, n in judge.half.items() if u in units}
    out.update({u: tuple(judge.half[m] for m in ms) for u, ms in judge.fused.items()})
    return dict(sorted(out.items(), key=lambda kv: judge.units.index(kv[0])))


def check_file(mixed_path: str | Path, reference_path: str | Path, opts: Options) -> Verdict:
    """`trtbisect check` of a quantized file: judged against the reference model exactly as
    `run` judges its plans and writes (the same QuantJudge, FP16 stores made explicit in a
    float16 file)."""
    from .half import half_nodes

    path = Path(mixed_path)
    model = with_names(load(path))
    ref_model = load(reference_path)
    _check_reference(model, ref_model, str(reference_path))
    opts.judge.criteria.validate([o.name for o in ref_model.graph.output])
    samples, references = _samples(ref_model, opts.sample, opts.judge, path, reference_path)
    from ..context import reference_problems
    problems = reference_problems(SimpleNamespace(every_reference=references))  # type: ignore
    if problems:
        raise TrtBisectError(f"the FP32 reference is already broken: {problems[0]}",
                             EXIT_REFERENCE_INVALID)
    j = opts.judge
    judge = QuantJudge(model, qdq.analyse(model), samples, references, j.criteria, j.tolerance,
                       j.threads, half_nodes(model), j.semantics, j.tf32)
    return judge.judge_model(model)


def with_names(model: onnx.ModelProto) -> onnx.ModelProto:
    from ..graph import with_node_names
    return with_node_names(model)


def judge_fixes(judge: QuantJudge, model: onnx.ModelProto, layers: Sequence[qdq.Layer],
                plan: Sequence[str], units: Sequence[str], findings: dict[str, list[Finding]],
                values: dict[str, list[np.ndarray]]) -> dict[str, list[FixJudged]]:
    """Each plan layer kept quantized with a fix applied (fixes.py), the rest of the plan
    (`units`) as it is, judged by the run's judge: does the fix alone make the layer pass?"""
    from .fixes import variants

    by_name = {la.name: la for la in layers}
    out: dict[str, list[FixJudged]] = {}
    for name in plan:
        rest = frozenset(u for u in units if u != name)
        for what, variant in variants(model, by_name[name], findings[name], values,
                                      judge.weights):
            try:
                v = judge.judge_model(judge.model_for(rest, base=variant))
            except TrtBisectError as exc:  # a variant ORT refuses: said, never fatal
                out.setdefault(name, []).append(FixJudged(what, False, error=str(exc)))
                continue
            out.setdefault(name, []).append(FixJudged(
                what, v.passed, {k: e.to_json() for k, e in v.errors.items()}))
    return out


def _declares(plan: Sequence[str] = (), fp32_nodes: Sequence[str] = ()) -> dict[str, str]:
    """What a written quantized file computes, in its metadata: which quantized layers run in
    float (the run's plan; none for the file as the run judged it) and which FP16 nodes of
    the file run in FP32."""
    return {"trtbisect.unquantized_layers": ",".join(plan),
            "trtbisect.fp32_nodes": ",".join(fp32_nodes)}


def _sources(given: SampleOptions) -> list[Path]:
    from ..context import input_files
    return input_files(given)


def _write(start: Start, searched: Searched, shown: dict, reasons: list[str], seconds: float,
           path: Path, out_dir: Path | None, keep: Sequence[Path],
           report: Callable | None = None,
           certify: Callable[[Path | onnx.ModelProto], Certification] | None = None,
           owned: bool = False) -> QuantResult:
    """The plan's model (judged again from the file: one judge), commands.sh, precision.json
    and (`report`: --report) report.html, report.md and the trade-off plot, as one
    generation of --out, by the one writer (reports/write.py `write_quantized`); the result,
    assembled once its findings are known: for a plan, once its written file is judged,
    inside the generation, before precision.json. Without --out the in-memory model is
    judged. `certify`: the certificate and validation of a file (`_certify`)."""
    from ..judge.loadable import InputCheck
    from ..reports.write import write_quantized

    def build(**found) -> QuantResult:
        return assemble(start, searched, shown, reasons=reasons, seconds=seconds, **found)

    judge = searched.judge
    held = InputCheck(path)  # the input's own record: a copy of a file that fails the
    # checker as the input does is held to loading in ONNX Runtime (judge/loadable.py)
    if searched.proposed != "fixed":
        # the file as given, held to the findings FP16 as it is is held to
        as_given = searched.proposed == "quantized_ok"
        given = certify(path) if as_given and certify is not None else None
        if out_dir is None:
            return build(given=given)
        kept, model_path = None, None
        if as_given and owned:  # ModelOpt's file, judged: the deliverable, kept in --out
            name = f"{path.stem}.quantized.onnx"
            kept = ("quantized_model", name, load(path), _declares())
            model_path = str(out_dir / name)
        built = build(given=given, model_path=model_path)
        commands_sh = shown.get("commands_sh", "")  # none where nothing was judged
        return write_quantized(lambda files: _recorded(built, files), commands_sh,
                               out_dir, keep, held, kept, commands=as_given, report=report,
                               side=_side(judge, shown, path) if as_given else None)
    assert judge is not None and certify is not None
    mixed = judge.model_for(frozenset(searched.units))
    if out_dir is None:  # the search judged this very model last: its verdict, not a rerun
        after = (searched.search_after if searched.search_after is not None
                 else judge.judge_model(mixed))
        return build(written=FileJudged(after, certify(mixed) if after.passed else None))
    judged_file: list[QuantResult] = []

    def judged(file: Path) -> None:  # the file, as check judges it: the result's last finding
        after = judge.judge_model(file)
        judged_file.append(build(written=FileJudged(after,
                                                    certify(file) if after.passed else None)))
    return write_quantized(lambda files: _recorded(judged_file[0], files),
                           shown["commands_sh"], out_dir, keep, held,
                           ("mixed_qdq_model", f"{path.stem}.unquantized.onnx", mixed,
                            _declares(searched.plan, searched.fp32_nodes)), judged,
                           report=report, side=_side(judge, shown, path))


def _recorded(result: QuantResult, files: dict[str, str]) -> QuantResult:
    """The result with the files written into --out: ModelOpt's reproduction at the path
    its file was kept at there (ptq.keep_side_files)."""
    return replace(result, files=dict(files),
                   renderings=_kept(result.renderings, files.get("modelopt_model")))


def _side(judge: QuantJudge | None, shown: dict, source: Path) -> Callable[[Path], dict]:
    """Beside commands.sh: calib.npz, ModelOpt's own file (quant/ptq.py)."""
    from .ptq import keep_side_files
    return lambda folder: keep_side_files(shown, judge, source, folder)


def _kept(shown: dict, moved: str | None) -> dict:
    """The renderings, ModelOpt's reproduction at the path its file was kept at in --out."""
    rep = Reproduction.of(shown)
    if moved is None or rep is None:
        return shown
    return {**shown, "modelopt_reproduction": replace(rep, path=moved).to_json()}
