"""`trtbisect run`, `compare` and `check` as library calls: load, reference, layer-wise
comparison, prior, search, verify, write. The CLI only parses, calls and formats."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx

from . import __version__, cost, coverage, degenerate, semantics
from .backends.ort import Emulator, MixedModel, Reference, Rounded, emulation_of_mixed
from .compare import (OutputError, TensorStats, Tolerance, merge_stats, tensor_stats,
                      validate_tolerance, worst)
from .diagnose import (annotate, attach as attach_diagnosis, group_culprits, note_fused,
                       note_semantics)
from .errors import (EXIT_NO_PLAN, EXIT_OK, EXIT_OVER_BUDGET, EXIT_PARTIAL,
                     EXIT_REFERENCE_INVALID, TrtBisectError)
from .graph import (Graph, external_data_hash, external_files, model_hash,
                    named_as_trtbisect_names, structure)
from .data.sources import expand, iter_items
from .data.store import SampleSet, reference_set
from .inputs import Sample
from .judge import subset
from .judge.criteria import Criteria, Judgement, Verdict
from .judge.precision import FP16, Precision, of_type, precision as low_precision
from .journal import Journal, plan_key
from .plan import atomic_write, atomic_write_json, atomic_write_records, atomic_write_text
from .render import RenderContext
from .mixed import Written, graph_model, mixed_model
from .modules import module_label
from .outdir import OutputDir
from .outputs import cache as result_cache
from .outputs.files import claim, move_file
from .search import Progress, SearchResult, find_minimal_fp32
from .suspects import ConstantStats, build_prior, constant_stats

log = logging.getLogger(__name__)

BULKY_EXTRAS = ("layerwise_plan",)  # kept for the report, not written into precision.json
VERDICT_EXIT = {"fp16_ok": EXIT_OK, "fixed": EXIT_OK, "reference_invalid": EXIT_REFERENCE_INVALID,
                "no_plan": EXIT_NO_PLAN, "partial": EXIT_PARTIAL,
                "over_budget": EXIT_OVER_BUDGET, degenerate.NOTHING_TO_JUDGE: EXIT_OK}
# verdicts whose plan is written with its renderings
PLAN_VERDICTS = ("fixed", "fp16_ok", "partial", "over_budget")


def _default_trt_version() -> int:
    from .backends.trt import default_trt_version
    return default_trt_version()


@dataclass
class Options:
    inputs: Sequence[str] = ()
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    seed: int = 0
    samples: int = 1  # random samples when no --inputs are given
    data_loader: str | None = None  # Polygraphy's --data-loader-script FILE.py[:FUNCTION]
    search_samples: int = subset.SEARCH_SAMPLES  # above this many, search on a subset first
    tolerance: Tolerance = field(default_factory=Tolerance)
    criteria: Criteria = field(default_factory=Criteria)  # default: the tolerance's max error
    strict: bool = False
    max_evaluations: int | None = None
    threads: int | None = None
    memory_budget: int = 1 << 30  # bytes of intermediate tensors held at once (layer-wise)
    resume: bool = True
    stability: int = 0  # N >= 2: rerun the plan and all-FP16 on N jittered copies per sample
    report: bool = False  # also write report.html / report.md (needs matplotlib)
    rewrite: bool = False  # try verified FP16-safe graph rewrites before any FP32 fallback
    semantics: str = "trt"  # trt: round where TensorRT rounds; strict: every node (docs/semantics.md)
    # the weight-conversion rule and renderings' target: the installed TensorRT's major, else 11
    trt_version: int = field(default_factory=_default_trt_version)
    tf32: bool = False  # FP32 MatMul/Conv/Gemm read TF32-rounded operands (else --noTF32)
    fp16_accumulate: bool = False  # FP16 MatMul/Gemm/Conv accumulate in FP16 (an approximation)
    gpu: str = cost.DEFAULT_GPU  # the GPU class plans are priced on (cost.py, docs/cost.md)
    objective: str = "cost"  # cost: the cheapest plan in estimated engine time; count: fewest units
    budget: float | None = None  # --budget PCT: the plan's slowdown against all-FP16 at most this
    precision: str = "fp16"  # the low precision plans target: fp16 | bf16 (judge/precision.py)

    @property
    def accumulate(self) -> int:
        """The --fp16-accumulate block size (0: off)."""
        return semantics.FP16_ACCUMULATE_BLOCK if self.fp16_accumulate else 0


@dataclass
class Context:
    """A loaded model with its samples and FP32 reference outputs."""

    path: Path
    model: onnx.ModelProto
    graph: Graph
    samples: Sequence[Sample]  # what the search judges on: every sample, or a subset of them
    references: Sequence[dict[str, np.ndarray]]
    sha256: str
    # what the search judges: the model after TensorRT's build-time rewrites (trt semantics) or
    # `graph` itself (strict); the FP32 reference is always `graph`, the model as given
    search: Graph | None = None
    prepared: semantics.Prepared | None = None
    rules: semantics.Rules = semantics.STRICT
    sources: list[Path] = field(default_factory=list)  # the run's input files: never moved
    data_sha256: str | None = None  # of the external data files, when the model has some
    # every sample and its reference (streamed, data/store.py): what a written plan is
    # certified on; `samples`/`references` unless the search judges a subset
    every_sample: Sequence[Sample] | None = None
    every_reference: Sequence[dict[str, np.ndarray]] | None = None
    subset: tuple[int, ...] | None = None  # indices into every_sample the search judges on

    def __post_init__(self) -> None:
        if self.every_sample is None:
            self.every_sample, self.every_reference = self.samples, self.references

    @property
    def judged(self) -> Graph:
        return self.search if self.search is not None else self.graph

    def narrow(self, subset: Sequence[int] | None) -> None:
        """Let the search judge on `subset` of the samples (None: on every sample)."""
        from .data.store import View
        assert self.every_sample is not None and self.every_reference is not None
        if subset is None or len(subset) == len(self.every_sample):
            self.samples, self.references, self.subset = (self.every_sample,
                                                          self.every_reference, None)
        else:
            self.subset = tuple(subset)
            self.samples = View(self.every_sample, subset)
            self.references = View(self.every_reference, subset)


def prepare(model_path: str | Path, opts: Options, search: bool = True,
            cache: Path | None = None, spool: Path | None = None) -> Context:
    """Load, reference outputs, and (`search`) the graph the emulator judges under
    `opts.semantics`. `cache`: a folder where a resumed run finds the reference outputs;
    `spool`: where samples and references that do not fit in memory go (default: a
    temporary folder)."""
    path = Path(model_path)
    graph = Graph.from_path(path)
    if search:  # the emulator rounds with Casts to the low type: before any long work
        low_precision(opts.precision).require_opset(graph.opset, path)
    if search:  # float64 compute: refused or named, as TensorRT's parser would cast it
        degenerate.check_judgeable(graph, path)
    validate_tolerance(opts.tolerance, graph.output_names())  # typos are usage errors (#14)
    opts.criteria.validate(graph.output_names())
    samples = SampleSet(iter_items(graph, list(opts.inputs), opts.data_loader, opts.shapes,
                                   opts.seed, opts.samples), spool=spool or cache)
    sha, data_sha = model_hash(path), external_data_hash(path)
    references = reference_set(graph, samples, opts.threads, f"{sha}:{data_sha}", cache,
                               spool or cache)
    opts.criteria.check_fit(references[0])
    ctx = Context(path, graph.source, graph, samples, references, sha,
                  sources=[path, *external_files(path), *input_files(opts)],
                  data_sha256=data_sha)
    semantics.weight_rule_for(opts.semantics, opts.trt_version)  # fail early on bad values
    if opts.fp16_accumulate and not low_precision(opts.precision).narrow_range:
        raise TrtBisectError("--fp16-accumulate models FP16-accumulating kernels; BF16 GEMMs "
                             "and convolutions accumulate in FP32 (cuBLAS has no BF16 compute "
                             "type): drop it with --precision bf16")
    if search:
        ctx.search, ctx.prepared = semantics.prepare_graph(graph, opts.semantics,
                                                           opts.trt_version)
        ctx.rules = semantics.rules_for(ctx.prepared, opts.tf32, opts.accumulate,
                                        low_precision(opts.precision))
    return ctx


def input_files(opts: "Options") -> list[Path]:
    """The files the run's samples come from (folders and globs expanded): never moved."""
    found = [Path(p) for spec in opts.inputs for p, _ in expand(spec)]
    if opts.data_loader:
        found.append(Path(opts.data_loader.rsplit(":", 1)[0]
                          if not opts.data_loader.endswith(".py") else opts.data_loader))
    return found


def _samples_hash(samples: Sequence[Sample]) -> str:
    sha = getattr(samples, "sha256", None)  # a SampleSet hashed itself while reading
    if sha is not None:
        return sha
    h = hashlib.sha256()
    for s in samples:
        for k in sorted(s):
            h.update(k.encode())
            h.update(str(s[k].dtype).encode() + str(s[k].shape).encode())
            h.update(np.ascontiguousarray(s[k]).tobytes())
    return h.hexdigest()


def reference_problems(ctx: Context) -> list[str]:
    problems = []
    for k, outs in enumerate(ctx.every_reference):
        for name, value in outs.items():
            if np.issubdtype(value.dtype, np.floating):
                bad = int(value.size - np.count_nonzero(np.isfinite(value)))
                if bad:
                    problems.append(f"output {name!r} of sample {k} has {bad} non-finite value(s)")
    return problems


# ---------------------------------------------------------------- layer-wise comparison

def layerwise(ctx: Context, opts: Options,
              progress: Callable[[int, int], None] | None = None,
              plan: frozenset[str] = frozenset(),
              fp16_first: Sequence[Mapping[str, np.ndarray]] = (),
              batches: list[list[str]] | None = None) -> dict[str, TensorStats]:
    """Statistics of every stored float tensor, FP32 vs FP16 (all-FP16, or `plan` applied),
    worst over all samples.

    The FP32 side comes from the reference graph, the FP16 side from the plan's static graph,
    both exposing one batch of tensors at a time under the memory budget (ORT keeps every
    exposed output alive for the whole run); only statistics are kept. `fp16_first`: per
    sample, the FP16 side of the first batch (`layerwise_batches`, or `batches` when given),
    already computed (by the judge of the written all-FP16 file, which is the same graph: one
    judge).
    """
    g = ctx.judged
    producer = {t: g.names[g.producer[t]] if t in g.producer else None  # a body's input: None
                for t in g.stored_tensors()}
    stats: dict[str, TensorStats] = {}
    for v in g.inputs():
        if g.is_float(v.name):
            for s in ctx.samples:
                x = np.asarray(s[v.name], np.float32)
                _merge(stats, tensor_stats(v.name, None, x, ctx.rules.precision.round(x),
                                           ctx.rules.precision))
    batches = batches or layerwise_batches(ctx, opts)
    total, done = sum(len(b) for b in batches), 0
    for k, batch in enumerate(batches):
        # one session at a time: ONNX Runtime holds its own copy of the weights in each
        ref = Reference(g, opts.threads)
        if k == 0 and fp16_first and all(t in fp16_first[0] for t in batch):
            # the FP16 side is held for every sample while the FP32 side runs, one at a time
            for s, b in zip(ctx.samples, fp16_first):
                a = ref.run_tensors(s, batch)
                for t in batch:
                    _merge(stats, _tensor_stats(t, producer[t], a[t], b[t],
                                                ctx.rules.precision))
                del a
            ref.close()
        else:
            # the FP32 side of a batch is held for every sample while the FP16 side runs
            fp32 = [ref.run_tensors(s, batch) for s in ctx.samples]
            ref.close()
            emu = Emulator(g, opts.threads, expose=batch, active=plan, rules=ctx.rules)
            for s, a in zip(ctx.samples, fp32):
                b = emu.run_tensors_for(plan, s, batch)
                for t in batch:
                    _merge(stats, _tensor_stats(t, producer[t], a[t], b[t],
                                                ctx.rules.precision))
            emu.close()
            del emu, fp32
        del ref
        done += len(batch)
        if progress is not None:
            progress(done, total)
    return stats


def layerwise_batches(ctx: Context, opts: Options) -> list[list[str]]:
    """The stored tensors in the batches `layerwise` exposes: each side of a batch, held for
    every sample while the other side runs one sample, fits the memory budget."""
    return _batches(ctx.judged, ctx.samples[0], opts.memory_budget // (len(ctx.samples) + 1))


def _cached_layerwise(ctx: Context, opts: Options, out_dir: Path | None, fingerprint: dict,
                      progress: Callable[[int, int], None] | None,
                      fp16_first: Sequence[Mapping[str, np.ndarray]] = (),
                      batches: list[list[str]] | None = None) -> dict[str, TensorStats]:
    """The layer-wise statistics, reused when a resumed run has the same fingerprint."""
    path = None
    cache = OutputDir(out_dir).cache() if out_dir is not None and opts.resume else None
    if cache is not None:
        key = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]
        path = cache / f"layerwise-{key}.json"
        try:
            rows = result_cache.load_records(path)  # its hash checked
            if rows is not None:
                stats = {r["name"]: TensorStats.from_json(r) for r in rows}
                log.info("layer-wise statistics reused from %s", path)
                return stats
        except (ValueError, KeyError, TypeError):
            pass
    stats = layerwise(ctx, opts, progress, fp16_first=fp16_first, batches=batches)
    if path is not None:
        try:
            result_cache.save_records(path, [s.to_json() for s in stats.values()])
        except (OSError, TrtBisectError) as exc:  # a cache: never fail the run over it
            log.info("layer-wise statistics not cached: %s", exc)
    return stats


def _merge(stats: dict[str, TensorStats], new: TensorStats | None) -> None:
    if new is not None:
        stats[new.name] = merge_stats(stats[new.name], new) if new.name in stats else new


def _tensor_stats(t: str, producer: str | None, a: np.ndarray, b: np.ndarray,
                  precision: Precision = FP16) -> TensorStats | None:
    """None for a value of an If branch that did not run in this sample (exposed empty), or
    that ran on one side only."""
    if a.shape != b.shape or a.size == 0:
        return None
    return tensor_stats(t, producer, a, b, precision)


def _batches(g: Graph, sample: Sample, budget: int) -> list[list[str]]:
    sizes = estimate_bytes(g, sample)
    batches: list[list[str]] = [[]]
    used = 0
    for t in g.stored_tensors():
        size = sizes.get(t, 0)
        if batches[-1] and used + size > budget:
            batches.append([])
            used = 0
        batches[-1].append(t)
        used += size
    return [b for b in batches if b]


def estimate_bytes(g: Graph, sample: Sample) -> dict[str, int]:
    """Bytes of each tensor, from shape inference with the sample's concrete input shapes."""
    m = structure(g.model)
    for v in m.graph.input:
        if v.name in sample:
            dims = v.type.tensor_type.shape.dim
            for d, n in zip(dims, sample[v.name].shape):
                d.Clear()
                d.dim_value = n
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:
        pass
    known = {}
    for v in [*m.graph.value_info, *m.graph.output]:
        dims = v.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            known[v.name] = 4 * int(np.prod([d.dim_value for d in dims]))
    fallback = max(known.values(), default=max((a.nbytes for a in sample.values()), default=4))
    return {t: known.get(t, fallback) for t in g.stored_tensors()}


def summarize_layerwise(g: Graph, stats: Mapping[str, TensorStats],
                        precision: Precision = FP16) -> dict[str, object]:
    """Where things first go wrong along the topological order."""
    ordered = [stats[t] for t in g.stored_tensors() if t in stats]
    first_nonfinite = [s.name for s in ordered if s.new_nonfinite and not _any_input_nonfinite(
        g, s, stats)]
    overflow = [s.name for s in ordered if s.overflow or s.fp32_absmax > precision.max]
    jump = next((s.name for s in ordered if s.rel_err > 0.01), None)
    return {"tensors": len(ordered), "first_nonfinite": first_nonfinite[:10],
            "first_overflow": overflow[:10], "first_jump": jump}


def _any_input_nonfinite(g: Graph, s: TensorStats, stats: Mapping[str, TensorStats]) -> bool:
    if s.producer is None:
        return False
    return any(stats[t].new_nonfinite for t in g.float_inputs(s.producer) if t in stats)


# ---------------------------------------------------------------- evaluation

class Evaluator:
    """Runs a plan on every sample and judges it; journals each judgement."""

    def __init__(self, ctx: Context, opts: Options, stats: Mapping[str, TensorStats],
                 journal: Journal | None, groups: Iterable[Iterable[str]] | None = None) -> None:
        """`groups`: nodes that plans keep together (default: the search's units)."""
        self.ctx, self.opts, self.journal = ctx, opts, journal
        watch = [t for t in ctx.judged.stored_tensors()
                 if t in stats and stats[t].fp32_nonfinite == 0] if opts.strict else []
        if groups is None:
            groups = (semantics.units(ctx.prepared, ctx.judged.candidates()).values()
                      if ctx.prepared is not None else ())
        self._emulator_args = dict(watch=watch, rules=ctx.rules, groups=list(groups))
        self._emulator: Emulator | None = None
        self.runs = 0  # inferences, for cost accounting
        self.known: dict[frozenset[str], bool] = {}  # judged outside the search (all-FP16)
        self.last_plan: frozenset[str] | None = None
        self.last_errors: list[Judgement] = []  # per sample, for `last_plan`
        self.scores: dict[frozenset[str], float] = {}  # each judged plan's worst severity

    @property
    def emulator(self) -> Emulator:
        """Built on first use: a verdict the written file decides alone never needs it."""
        if self._emulator is None:
            self._emulator = Emulator(self.ctx.judged, self.opts.threads, **self._emulator_args)
        return self._emulator

    def close(self) -> None:
        if self._emulator is not None:
            self._emulator.close()

    def measure(self, plan: frozenset[str], stop_early: bool = False, full: bool = False
                ) -> tuple[bool, list[Judgement], list[str]]:
        """The plan judged on the search's samples (`full`: on every sample) under the run's
        criteria (judge/criteria.py); `stop_early`: stop once the plan cannot pass any more."""
        crit, judged, nonfinite = self.opts.criteria, [], []
        full = full or self.ctx.subset is None
        samples = self.ctx.every_sample if full else self.ctx.samples
        references = self.ctx.every_reference if full else self.ctx.references
        assert samples is not None and references is not None
        for sample, ref in zip(samples, references):
            self.runs += 1
            if self.opts.strict:
                outs, bad = self.emulator.nonfinite(plan, sample)
                nonfinite += [t for t in bad if t not in nonfinite]
            else:
                outs = self.emulator.run(plan, sample)
            judged.append(crit.judge(ref, outs, sample, self.opts.tolerance))
            if stop_early and (nonfinite or crit.hopeless(judged, len(samples))):
                return False, judged, nonfinite
        passed = crit.verdict(judged).passed and not nonfinite
        if full:
            self.last_plan, self.last_errors = plan, judged  # every sample: reusable as is
        return passed, judged, nonfinite

    def widened(self) -> None:
        """The search's samples grew (judge/subset.py): what passed on fewer may not now;
        what failed still fails."""
        self.known = {p: ok for p, ok in self.known.items() if not ok}

    def check(self, plan: frozenset[str]) -> bool:
        if plan in self.known:
            return self.known[plan]
        key = plan_key(plan)
        if self.ctx.subset is not None:  # a verdict on these samples only
            key += "@" + subset.signature(self.ctx.subset)
        if self.journal is not None:
            rec = self.journal.lookup(key)
            if rec is not None:
                severity = rec.get("severity")
                self.scores[plan] = (float(severity) if severity is not None
                                     else _score(rec.get("rel", {})))
                return bool(rec["passed"])
            self.journal.start(key)
        try:
            passed, judged, bad = self.measure(plan, stop_early=True)
        except TrtBisectError:  # bad input (a --check hook raised): no verdict to record
            if self.journal is not None:
                self.journal.abandon(key)
            raise
        self.scores[plan] = _severity(judged)
        if self.journal is not None:
            self.journal.record(key, passed, {
                "rel": {n: _num(e.rel) for n, e in _worst(judged).items()},
                "severity": _num(self.scores[plan]),
                "nonfinite_tensors": bad[:10]})
        return passed


def _num(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def _score(rel: Mapping[str, object]) -> float:
    """A plan's worst relative error over its outputs (journal values may be "inf"/"nan")."""
    values = [float(v) for v in rel.values()]  # type: ignore[arg-type]
    return max(values) if values else math.nan


def _severity(judged: Iterable[Judgement]) -> float:
    """A judged plan's score for the trade-off plot: its worst severity over samples and
    outputs (under the default criterion: the worst relative error; else 1 at the bound)."""
    errors = _worst(judged)
    return max((e.severity for e in errors.values()), default=math.nan)


def _shape_probe(ctx: Context, opts: Options) -> cost.Probe:
    """Shapes that shape inference leaves open, as one FP32 inference of the first sample
    produces them (a batch of tensors at a time)."""
    def probe(names: Sequence[str]) -> dict[str, tuple[int, ...]]:
        ref, out = Reference(ctx.judged, opts.threads), {}
        for k in range(0, len(names), 512):
            out.update({t: tuple(a.shape) for t, a in
                        ref.run_tensors(ctx.samples[0], names[k:k + 512]).items()})
        ref.close()
        return out
    return probe


def _worst(judged: Iterable[Judgement]) -> dict[str, OutputError]:
    return worst(j.errors for j in judged)


# ---------------------------------------------------------------- run

@dataclass
class Culprit:
    node: str
    op: str
    why: str
    module: str | None = None
    layer: str | None = None  # the fused TensorRT layer it belongs to (trt semantics)

    def to_json(self) -> dict:
        d = {"node": self.node, "op": self.op, "why": self.why}
        if self.module:
            d["module"] = self.module
        if self.layer:
            d["layer"] = self.layer
        return d


@dataclass
class RunResult:
    verdict: str
    model_path: str
    model_sha256: str
    fp32_nodes: list[str]
    candidates: int
    nodes: int
    evaluations: int
    inferences: int
    samples: int
    tolerance: Tolerance
    strict: bool
    errors_before: dict[str, OutputError]
    errors_after: dict[str, OutputError]
    culprits: list[Culprit] = field(default_factory=list)
    one_minimal: bool = False
    search: SearchResult | None = None
    reference_problems: list[str] = field(default_factory=list)
    mixed_check: dict[str, OutputError] | None = None
    mixed_model: Written | None = field(default=None, repr=False)  # for fp32_nodes
    rewritten_model: Written | None = field(default=None, repr=False)  # FP32, rewrites applied
    staged: list[str] = field(default_factory=list)  # judged files waiting in --out/.staging
    emulated_mixed: Written | None = field(default=None, repr=False)  # the judge's own graph
    stats: dict[str, TensorStats] = field(default_factory=dict)
    prior_seeds: list[str] = field(default_factory=list)
    seconds: float = 0.0
    files: dict[str, str] = field(default_factory=dict)
    extra: dict[str, object] = field(default_factory=dict)  # filled by diagnosis, torch, trt
    render_context: RenderContext | None = field(default=None, repr=False)  # write_outputs
    model_data_sha256: str | None = None  # the external data files' (model_sha256: the file's)
    criteria: Criteria = field(default_factory=Criteria, repr=False)  # what judged the plan

    @property
    def mixed_model_passed(self) -> bool | None:
        if self.mixed_check is None:
            return None
        return all(e.passed for e in self.mixed_check.values())

    @property
    def exit_code(self) -> int:
        return VERDICT_EXIT[self.verdict]

    def to_json(self) -> dict:
        return {
            "tool": "trtbisect", "version": __version__, "backend": "ort-emulator",
            "model": {"path": self.model_path, "sha256": self.model_sha256, "nodes": self.nodes,
                      "candidates": self.candidates,
                      **({"external_data_sha256": self.model_data_sha256}
                         if self.model_data_sha256 else {})},
            "verdict": self.verdict,
            "fp32_nodes": self.fp32_nodes,
            "one_minimal": self.one_minimal,
            "evaluations": self.evaluations,
            "inferences": self.inferences,
            "samples": self.samples,
            "tolerance": {**self.tolerance.to_json(), "strict": self.strict},
            "errors_before": {k: v.to_json() for k, v in self.errors_before.items()},
            "errors_after": {k: v.to_json() for k, v in self.errors_after.items()},
            "culprits": [c.to_json() for c in self.culprits],
            "prior_seeds": self.prior_seeds,
            "reference_problems": self.reference_problems,
            "mixed_model_passed": self.mixed_model_passed,
            "mixed_model_check": ({k: v.to_json() for k, v in self.mixed_check.items()}
                                  if self.mixed_check is not None else None),
            "renderings": self.renderings(),
            "files": self.files,
            "seconds": round(self.seconds, 3),
            **{k: v for k, v in self.extra.items() if k not in BULKY_EXTRAS},
        }

    def renderings(self) -> dict[str, object]:
        """Every tool's rendering of the plan (render.py); paths as `render_context` gives them."""
        from .render import RenderContext, renderings_json

        model = self.files.get("rewritten_model") or self.files.get("named_model", self.model_path)
        rc = self.render_context or RenderContext(
            model=model, mixed_model=self.files.get("mixed_model", "<mixed>.onnx"),
            tolerance=self.tolerance, criteria=self.criteria)
        return renderings_json(self.fp32_nodes, rc)


def run(model_path: str | Path, opts: Options, out_dir: Path | None = None,
        progress: Progress | None = None, on_stage: Callable[[str], None] | None = None,
        on_layerwise: Callable[[int, int], None] | None = None) -> RunResult:
    """The whole job: find the minimal FP32 set and write every rendering of it to `out_dir`."""
    started = time.perf_counter()
    marks: list[tuple[str, float]] = []  # each stage and when it began: extra["stages"]

    def stage(msg: str) -> None:
        marks.append((msg, time.perf_counter()))
        (on_stage or log.info)(msg)
    if opts.report:
        from .report import require_matplotlib
        require_matplotlib()  # fail before the search, not after it
    stage("loading the model and running the FP32 reference")
    if out_dir is not None:  # refuse now, not after the search, what the folder cannot take
        OutputDir(out_dir).preflight(Path(model_path).stem, [model_path, *opts.inputs],
                                     0 if (opts.inputs or opts.data_loader) else opts.samples,
                                     opts.report, opts.rewrite)
    cache = OutputDir(out_dir).cache() if out_dir is not None else None
    ctx = prepare(model_path, opts, cache=cache if opts.resume else None, spool=cache)
    g = ctx.judged
    assert ctx.prepared is not None
    if opts.stability >= 2:  # refused now, not after the search, if it cannot be held
        from .stability import guard_memory
        guard_memory(ctx.every_sample, ctx.every_reference, opts.stability)
    base = dict(model_path=str(model_path), model_sha256=ctx.sha256,
                model_data_sha256=ctx.data_sha256, candidates=len(g.candidates()),
                nodes=len(g.names), samples=len(ctx.every_sample), tolerance=opts.tolerance,
                strict=opts.strict, criteria=opts.criteria)
    low = ctx.rules.precision
    record = {"semantics": semantics.record(ctx.prepared, opts.tf32, opts.accumulate, low),
              "precision": low.to_json(),
              "coverage": coverage.record(g)}
    for c in coverage.trt_unsupported(g):  # before any search: the engine may not build at all
        log.warning("TensorRT's ONNX parser: %s x%d (%s): %s; %s", c.label, len(c.nodes),
                    ", ".join(c.nodes[:3]) + (", ..." if len(c.nodes) > 3 else ""), c.why, c.fix)
    problems = reference_problems(ctx)
    if problems:
        result = RunResult("reference_invalid", fp32_nodes=[], evaluations=0, inferences=0,
                           errors_before={}, errors_after={}, reference_problems=problems,
                           extra=dict(record), **base)
        return _finish(result, ctx, out_dir, started, opts.report, marks)
    nothing = degenerate.nothing_to_judge(g)
    if nothing:  # FP16 cannot change what this model computes: a verdict of its own
        result = RunResult(degenerate.NOTHING_TO_JUDGE, fp32_nodes=[], evaluations=0,
                           inferences=0, errors_before={}, errors_after={},
                           extra={**record, "nothing_to_judge": nothing}, **base)
        return _finish(result, ctx, out_dir, started, opts.report, marks)
    stats: dict[str, TensorStats] = {}
    fingerprint = _fingerprint(ctx, opts)
    if opts.strict:  # the watch list needs to know which tensors FP32 keeps finite
        stage("layer-wise comparison, FP32 vs FP16")
        stats = _cached_layerwise(ctx, opts, out_dir, fingerprint, on_layerwise)
    journal = None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        journal_path = out_dir / "journal.jsonl"
        if not opts.resume and journal_path.exists():
            journal_path.unlink()
        journal = Journal(journal_path, fingerprint)
    ev = Evaluator(ctx, opts, stats, journal)
    stage("all-FP16 evaluation")
    narrow = subset.wanted(len(ctx.every_sample), opts.search_samples, opts.criteria.pass_rate)
    first: _Judged | None = None
    fp16_first: list[dict[str, np.ndarray]] = []  # per sample: the first layer-wise batch, FP16
    batches: list[list[str]] | None = None  # the layer-wise batches, once known
    if opts.strict or ctx.graph.weights.total_bytes() > FILE_FIRST_WEIGHT_BYTES:
        # the non-finite watch runs on the emulator; and big weights: writing them in FP16
        # for a verdict that may fail costs more than the emulator session it saves
        if stats and not opts.rewrite:  # the prior is known: one session, the search's
            early = build_prior(g, stats, constant_stats(g, ctx.rules.weight_rule, low), low)
            ev.emulator.ensure(_prefetch(g, early.seeds, early.ranking))
        all_half, before, _ = ev.measure(frozenset())
    else:  # the all-FP16 file, written and judged: if it passes, it is the answer as it is
        # its judge also returns the FP16 side of the layer-wise pass's first batch, which a
        # failing verdict needs next (the same graph: it saves a session and an inference)
        batches = None if narrow else layerwise_batches(ctx, opts)  # narrow: for the subset
        first = _write_and_judge(ctx, opts, frozenset(), out_dir,
                                 expose=batches[0] if batches else ())
        all_half, before = first.checked.passed, first.checked.judgements
        ev.runs += len(ctx.samples)
        fp16_first = first.checked.tensors
        first.checked.tensors = []
        if not all_half:
            first = None  # memory: the search writes and judges its own plan
    ev.known[frozenset()] = all_half
    ev.scores[frozenset()] = _severity(before)
    if narrow and not all_half:  # judge/subset.py: search on the worst samples, certify on all
        ctx.narrow(subset.choose(before, opts.search_samples))
        stage(f"the search judges on {len(ctx.samples)} of {len(ctx.every_sample)} samples "
              "(where all-FP16 fails worst); the plan is certified on all of them")
    if (not all_half or opts.report) and not stats:  # FP16 passing needs no layer-wise pass
        stage("layer-wise comparison, FP32 vs FP16")
        ev.close()  # memory: reopened for the search, on the active set
        stats = _cached_layerwise(ctx, opts, out_dir, fingerprint, on_layerwise, fp16_first,
                                  batches)
    fp16_first = []  # memory: the FP16 side is only statistics now
    outcome = None
    if opts.rewrite and not all_half:
        stage("trying FP16-safe rewrites")
        suspects = build_prior(ctx.graph, stats,
                               constant_stats(ctx.graph, ctx.rules.weight_rule, low), low).seeds
        outcome, judged_ctx = _try_rewrites(ctx, opts, stats, suspects,
                                            (all_half, _worst(before)))
        if outcome is not None and outcome.applied:
            ctx = judged_ctx or _rewritten_context(ctx, outcome.model, opts)
            g = ctx.judged
            base.update(candidates=len(g.candidates()), nodes=len(g.names))
            ev = Evaluator(ctx, opts, stats, journal)
            all_half = outcome.passed
            ev.known[frozenset()] = all_half
    constants = constant_stats(g, ctx.rules.weight_rule, low)  # as the judge converts weights
    prior = build_prior(g, stats, constants, low)
    if not all_half:
        ev.emulator.ensure(_prefetch(g, prior.seeds, prior.ranking))
    units = semantics.units(ctx.prepared, g.candidates())
    unit_of = {n: u for u, nodes in units.items() for n in nodes}

    def as_units(nodes: Sequence[str]) -> list[str]:
        return list(dict.fromkeys(unit_of[n] for n in nodes if n in unit_of))

    def as_nodes(chosen) -> frozenset[str]:
        return frozenset(n for u in chosen for n in units[u])

    pricing = cost.pricing_for(g, units, ctx.samples[0], opts.gpu, opts.tf32,
                               _shape_probe(ctx, opts))
    stage(f"searching {len(units)} candidate units of {len(g.candidates())} nodes "
          f"({len(prior.seeds)} suspects)")
    search = _certified_search(
        ctx, opts, ev, stage, as_nodes,
        lambda budget: find_minimal_fp32(list(units), lambda us: ev.check(as_nodes(us)),
                                         as_units(prior.seeds), as_units(prior.ranking),
                                         budget, progress, **cost.search_args(pricing, opts)))
    if journal is not None:
        journal.close()
    cost.score_trials(search, pricing, lambda us: ev.scores.get(as_nodes(us)))
    over = cost.within_budget(search, pricing, opts.budget)
    if over is not None:
        search = over
    plan = as_nodes(search.fp32)
    rewritten = outcome is not None and bool(outcome.applied)
    judged = outcome.judgements if outcome is not None else 0  # each rewrite judged like a plan
    result = RunResult("no_plan" if not search.found else "over_budget" if search.over_budget else
                       ("fixed" if plan or rewritten else "fp16_ok"),
                       fp32_nodes=[n for n in g.names if n in plan] if search.found else [],
                       evaluations=search.evaluations + judged,
                       inferences=ev.runs + judged * len(ctx.samples),
                       errors_before=_worst(before), errors_after=_worst(before),
                       one_minimal=search.one_minimal and search.found, search=search,
                       stats=stats, prior_seeds=prior.seeds, extra=dict(record), **base)
    result.extra["fp32_layers"] = list(search.fp32) if search.found else []
    result.extra["cost"] = pricing.summary(search.fp32 if search.found else [], opts.objective,
                                           opts.budget)
    result.extra["criteria"] = {**opts.criteria.to_json(),
                                "description": opts.criteria.describe()}
    result.extra["judged"] = {"before": opts.criteria.verdict(before).to_json()}
    if ctx.subset is not None:
        result.extra["judged"]["search_samples"] = list(ctx.subset)  # type: ignore[index]
    if outcome is not None:
        result.extra["rewrites"] = outcome.to_json()
        if rewritten:
            result.rewritten_model = graph_model(ctx.graph)
    if search.found:
        stage("judging the written plan")
        _judge_written_plan(result, ctx, opts, ev, plan, out_dir, first)
    result.culprits = explain(g, result.fp32_nodes, stats, constants,
                              semantics.fused_layer_names(ctx.prepared), low)
    attach_diagnosis(result, g, constants, low)
    note_fused(result, units, unit_of)
    # compare with per-node rounding where it can differ: culprits, or nodes TensorRT folds
    if opts.semantics == "trt" and (result.fp32_nodes or opts.report or _absorbed_nodes(ctx)):
        stage("all-FP16 under strict per-node rounding, for comparison")
        _compare_with_strict(result, ctx, opts)
    elif result.verdict != "reference_invalid":
        semantics_notes(result, g)
    if opts.report and result.verdict == "fixed" and result.fp32_nodes:
        stage("layer-wise comparison with the plan applied (for the report)")
        result.extra["layerwise_plan"] = {
            t: s.to_json() for t, s in layerwise(ctx, opts, on_layerwise, plan).items()}
    if result.verdict in ("fixed", "fp16_ok") and opts.stability >= 2:
        stage(f"stability: {opts.stability} runs per sample")
        result.extra["stability"] = _stability(ctx, opts, ev, plan).to_json()
    coverage.apply_partial(result)  # never "FP16 is fine" for a graph not wholly judged
    return _finish(result, ctx, out_dir, started, opts.report, marks)


def _certified_search(ctx: Context, opts: Options, ev: Evaluator, stage: Callable[[str], None],
                      as_nodes: Callable, search: Callable[[int | None], SearchResult]
                      ) -> SearchResult:
    """`search(budget)` on the search's samples; when they are a subset (judge/subset.py),
    the plan found is judged on every sample, and the samples it fails join the subset for
    another search, until it passes everywhere. Evaluations and trials add up over rounds."""
    evaluations, trials = 0, []
    while True:
        left = None if opts.max_evaluations is None else max(opts.max_evaluations - evaluations, 0)
        result = search(left)
        trials += [replace(t, index=t.index + evaluations) for t in result.trials]
        evaluations += result.evaluations
        if not result.found or ctx.subset is None:
            break
        passed, judged, _ = ev.measure(as_nodes(result.fp32), full=True)
        evaluations += 1
        wider = subset.widen(ctx.subset, judged, opts.search_samples)
        if passed or len(wider) == len(ctx.subset):
            break
        stage(f"the plan fails {sum(not j.passed for j in judged)} of {len(judged)} samples: "
              f"searching again on {len(wider)} samples")
        ctx.narrow(wider)
        ev.widened()
    result.evaluations, result.trials = evaluations, trials
    return result


PREFETCH_WEIGHT_BYTES = 1 << 20  # a switchable node holds its weights twice (FP16 and FP32)


def _prefetch(g: Graph, seeds: Sequence[str], ranking: Sequence[str]) -> list[str]:
    """The first active set: the seeds and the top of the ranking, bar nodes with big weights
    (switching one keeps both its FP16 and FP32 weights, and materialises the chosen one on
    every run); a plan that needs such a node rebuilds the session around it."""
    def light(n: str) -> bool:
        return all(g.weights.nbytes(t) <= PREFETCH_WEIGHT_BYTES for t in g.node(n).input
                   if t in g.initializers)
    return [n for n in ranking[:max(16, 2 * len(seeds))] if n in seeds or light(n)]


# Weights up to this size: the all-FP16 verdict is judged on its written file first (an
# FP16-fine verdict then builds no search graph). Above it the emulator decides first: on a
# 2.5 GB model, writing and judging the all-FP16 file took 35 s, the emulator about 15 s.
FILE_FIRST_WEIGHT_BYTES = 256 << 20

REWRITE_WEIGHT_LIMIT = 1 << 30  # rewrites work on one in-memory proto: models up to this size


def _try_rewrites(ctx: Context, opts: Options, stats: Mapping[str, TensorStats],
                  suspects: Sequence[str] = (),
                  all_fp16: tuple[bool, dict[str, OutputError]] | None = None):
    """Verified rewrites (rewrites.py), each judged exactly like a plan: all-FP16 on the
    emulator, every sample, against the original model's FP32 reference. `all_fp16`: the
    model's own all-FP16 verdict and errors, when known. Returns the outcome and the context
    of its model (None: it is not one the judge prepared last)."""
    from .rewrite_rules import rewrites_for
    from .rewrites import try_rewrites

    if ctx.graph.weights.total_bytes() > REWRITE_WEIGHT_LIMIT:
        log.warning("--rewrite skipped: the model's weights exceed %d MiB", REWRITE_WEIGHT_LIMIT >> 20)
        return None, None
    last: list[Context] = []  # the last candidate's context: the search's, if it is kept

    def judge(candidate: onnx.ModelProto) -> tuple[bool, dict[str, OutputError]]:
        # under the run's semantics, as the search will judge the rewritten model
        last[:] = [_rewritten_context(ctx, candidate, opts)]
        emu = Emulator(last[0].judged, opts.threads, rules=last[0].rules)
        verdict = opts.criteria.verdict([
            opts.criteria.judge(ref, emu.run(frozenset(), s), s, opts.tolerance)
            for s, ref in zip(ctx.samples, ctx.references)])
        emu.close()
        return verdict.passed, verdict.errors

    ranges = {t: s.fp32_absmax for t, s in stats.items()}
    # matches at the suspects go first, one connected group of them after another
    groups = [{"nodes": grp} for grp in group_culprits(ctx.graph, list(suspects))]
    outcome = try_rewrites(ctx.graph.materialize(), ctx.samples, judge, groups=groups,
                           rewrites=rewrites_for(ctx.rules.precision.narrow_range),
                           ranges=ranges, references=ctx.references, initial=all_fp16)
    kept = next((c for c in last if c.model is outcome.model), None)
    return outcome, kept


def _rewritten_context(ctx: Context, model: onnx.ModelProto, opts: Options) -> Context:
    """The same samples and FP32 reference (the original model's: the truth), a new graph,
    prepared for the run's semantics like the original was."""
    graph = Graph(model)
    new = Context(ctx.path, model, graph, ctx.samples, ctx.references, ctx.sha256,
                  sources=ctx.sources, data_sha256=ctx.data_sha256,
                  every_sample=ctx.every_sample, every_reference=ctx.every_reference,
                  subset=ctx.subset)
    new.search, new.prepared = semantics.prepare_graph(graph, opts.semantics, opts.trt_version)
    new.rules = semantics.rules_for(new.prepared, opts.tf32, opts.accumulate,
                                    ctx.rules.precision)
    return new


STRICT_NARROW_LIMIT = 16  # absorbed nodes tried one by one when strict disagrees


def _compare_with_strict(result: RunResult, ctx: Context, opts: Options) -> None:
    """Under trt semantics: all-FP16 judged per node too ("errors_before_strict"), and, when
    the plan holds under trt but not per node, the BatchNorms / folded constants it takes."""
    strict = Evaluator(_strict_context(ctx), opts, {}, None)
    plan = frozenset(result.fp32_nodes)
    absorbed = _absorbed_nodes(ctx)
    strict.emulator.ensure(plan | set(absorbed))
    _, before, _ = strict.measure(frozenset())
    result.extra["errors_before_strict"] = {k: v.to_json() for k, v in _worst(before).items()}
    if result.verdict not in ("fixed", "fp16_ok") or not absorbed \
            or strict.measure(plan)[0] or not strict.measure(plan | set(absorbed))[0]:
        return
    needed = list(absorbed)
    if len(needed) <= STRICT_NARROW_LIMIT:
        for n in list(needed):
            if strict.measure(plan | (set(needed) - {n}))[0]:
                needed.remove(n)
    notes = {n: "fails only under per-node rounding: " + absorbed[n] for n in needed}
    result.extra["strict_only_culprits"] = needed
    note_semantics(result, notes, new_group=True)


def _strict_context(ctx: Context) -> Context:
    return Context(ctx.path, ctx.model, ctx.graph, ctx.samples, ctx.references, ctx.sha256,
                   sources=ctx.sources, data_sha256=ctx.data_sha256,
                   every_sample=ctx.every_sample, every_reference=ctx.every_reference,
                   subset=ctx.subset, rules=semantics.Rules(precision=ctx.rules.precision))


def _absorbed_nodes(ctx: Context) -> dict[str, str]:
    """Candidates of the model as given that TensorRT's build-time rewrites take out of FP16
    (node -> why): BatchNorms as FP32 scale/shift or folded, constant subgraphs."""
    assert ctx.prepared is not None
    g, out = ctx.graph, {}
    cands = set(g.candidates())
    for n in g.candidates():
        op = g.node(n).op_type
        carrier = ctx.prepared.renamed.get(n)
        if op == "BatchNormalization" and carrier is not None:
            out[n] = (f"TensorRT folds this BatchNorm into {carrier}'s weights in FP32 at "
                      "build time")
        elif op == "BatchNormalization" and n in ctx.judged.index and any(
                t.endswith("::scale") for t in ctx.judged.node(n).input):
            out[n] = "TensorRT precomputes this BatchNorm's scale and shift in FP32"
        elif carrier is not None:
            out[n] = "TensorRT folds this constant computation in FP32 at build time"
    return {n: w for n, w in out.items() if n in cands}


def semantics_notes(result: RunResult, g: Graph) -> None:
    """A strict run whose culprit is something TensorRT computes in FP32 at build time."""
    notes = {}
    for n in result.fp32_nodes:
        node = g.node(n)
        consts = [t for t in node.input[1:] if t in g.initializers and t not in g.producer]
        if node.op_type == "BatchNormalization" and len(consts) == len(node.input) - 1 >= 4:
            notes[n] = ("may fail only under per-node rounding (--semantics strict): TensorRT "
                        "precomputes this BatchNorm's scale in FP32 or folds it into the Conv; "
                        "try --semantics trt")
        elif node.input and all(t in g.initializers and t not in g.producer
                                for t in node.input if t):
            notes[n] = ("may fail only under per-node rounding (--semantics strict): TensorRT "
                        "folds this constant computation in FP32; try --semantics trt")
    note_semantics(result, notes, new_group=False)


@dataclass
class _Judged:
    """A plan's mixed model, written (staged under --out) and judged as `check` judges it."""

    ctx: Context
    plan: frozenset[str]
    checked: "CheckResult"
    staged: list[str]


def _write_and_judge(ctx: Context, opts: Options, plan: frozenset[str],
                     out_dir: Path | None, expose: Sequence[str] = ()) -> _Judged:
    Rounded.release(ctx.judged)  # memory: the judge holds the file's weights, not the search's
    written = write_plan(ctx, plan)
    # staged beside --out (same file system): write_outputs moves these very files into place
    staging = OutputDir(out_dir).staging() if out_dir is not None else None  # emptied
    with tempfile.TemporaryDirectory() as tmp:
        path = (staging or Path(tmp)) / f"{ctx.path.stem}.mixed.onnx"
        files = written.save(path)
        del written  # saved: the file is the model from here on
        checked = judge_mixed(path, ctx, opts, expose)
    return _Judged(ctx, plan, checked, [str(f) for f in files] if staging is not None else [])


def _judge_written_plan(result: RunResult, ctx: Context, opts: Options, ev: Evaluator,
                        plan: frozenset[str], out_dir: Path | None,
                        judged: _Judged | None = None) -> None:
    """One judge: write the plan's mixed model, judge the file as `check` does, report that.

    The search's own numbers for the plan must be the file's, bit for bit; a file that fails
    makes the verdict `no_plan`, never `fixed`. `judged`: the file already written and judged
    for this plan (the all-FP16 verdict is the file's own: no search number to compare).
    """
    if judged is not None and judged.plan == plan and judged.ctx is ctx:
        searched = judged.checked.judgements
    else:
        searched = ev.last_errors if plan == ev.last_plan else ev.measure(plan, full=True)[1]
        ev.close()  # memory: the judge below holds the file's weights, not the search's
        judged = _write_and_judge(ctx, opts, plan, out_dir)
    checked = judged.checked
    result.staged = judged.staged
    searched_worst = _worst(searched)
    same = len(searched) == len(checked.judgements) and all(
        _same(a, b) for a, b in zip(searched, checked.judgements))
    result.mixed_check = checked.errors
    if checked.verdict is not None:
        result.extra.setdefault("judged", {})["after"] = checked.verdict.to_json()  # type: ignore[index]
    result.emulated_mixed = checked.emulated  # what Polygraphy's check runs: the judge's graph
    result.errors_after = checked.errors
    result.extra["one_judge"] = {"search_equals_check": same,
                                 "search_errors": {k: v.to_json() for k, v in searched_worst.items()}}
    if not same:
        log.error("the search measured other numbers than `check` of the written file: "
                  "trusting the file (please report this)")
    if result.verdict == "over_budget":  # the best plan within --budget, known to fail
        result.one_minimal = False
        if checked.passed:  # the file decides (one judge): it fits the budget and passes
            result.verdict = "fixed"
    elif not checked.passed:
        result.verdict, result.one_minimal = "no_plan", False
        log.error("the written mixed model fails the tolerance: no plan is reported")
    margins = _margins(ctx, opts, checked.errors)
    result.extra["margins"] = margins
    fragile = [o for o, m in margins.items() if m["fragile"]]
    result.extra["fragile"] = bool(fragile)
    if fragile and checked.passed:
        log.warning("the plan passes by less than FP32 kernel noise on %s: fragile",
                    ", ".join(fragile))


STAGING = ".staging"
CACHE = ".cache"  # results a resumed run reuses (layer-wise statistics)


def write_plan(ctx: Context, fp32_nodes) -> Written:
    """The plan's mixed model: the judged graph, FP16 weights under the judge's weight rule."""
    return mixed_model(ctx.judged, fp32_nodes, ctx.rules.weight_rule, ctx.rules.precision)


def _bits(e: OutputError) -> tuple:
    return (e.max_abs, e.mean_abs, e.nonfinite, e.passed,
            tuple((s.value, s.passed, s.detail) for s in e.scores))


def _same(a: Judgement, b: Judgement) -> bool:
    """One sample judged twice (the search, the written file): the same numbers, bit for bit
    (nan equal to nan: a hook without a score)."""
    def key(j: Judgement) -> str:
        return repr(({o: _bits(e) for o, e in j.errors.items()},
                     [(s.value, s.passed, s.detail) for s in j.scores]))
    return key(a) == key(b)


# The noise floor (two extra sessions) is measured only for a plan within this fraction of its
# bound: FP32 kernel noise is ~1e-6 of an output's range, so a wider margin cannot be fragile.
NOISE_MARGIN = 0.1
NOISE_WEIGHT_LIMIT = 512 << 20  # bytes of weights above which the noise floor is not measured


def _margins(ctx: Context, opts: Options, errors: Mapping[str, OutputError]) -> dict[str, dict]:
    """Per output: how far under its bound the plan lands, against the noise floor of FP32
    itself (the reference model under ORT's default, optimizing kernels vs the judge's)."""
    noise: dict[str, float] = {}
    errors = {k: e for k, e in errors.items() if not e.scores}  # the default criterion's margin
    close = any(e.passed and e.bound - e.max_abs < NOISE_MARGIN * e.bound for e in errors.values())
    if close and ctx.graph.weights.total_bytes() <= NOISE_WEIGHT_LIMIT:
        from .backends.ort import kernel_noise
        noise = kernel_noise(ctx.graph, ctx.samples, ctx.references, opts.threads)
    out = {}
    for name, e in errors.items():
        margin = e.bound - e.max_abs
        n = noise.get(name)
        out[name] = {"margin": _num(margin), "noise_floor": None if n is None else _num(n),
                     "fragile": bool(n is not None and e.passed and margin <= n)}
    return out


def _fingerprint(ctx: Context, opts: Options) -> dict:
    fp = {"model": ctx.sha256, "model_data": ctx.data_sha256,
          "samples": _samples_hash(ctx.every_sample),
          "tolerance": opts.tolerance.to_json(), "strict": opts.strict, "rewrite": opts.rewrite,
          "version": __version__, "semantics": [opts.semantics, opts.trt_version, opts.tf32,
                                                     opts.accumulate],
          # what a plan means: since #26 a plan leaves subgraph nodes FP16 unless it names them
          # (a journal of an earlier version judged them FP32): never replayed across that
          "judge": "subgraphs"}
    if opts.precision != FP16.name:  # an FP16 run's fingerprint stays as it was
        fp["precision"] = opts.precision
    if not opts.criteria.default:
        fp["criteria"] = opts.criteria.fingerprint()
    return fp


def _stability(ctx: Context, opts: Options, ev: Evaluator, plan: frozenset[str]):
    """The noise floor of the error around the final and the all-FP16 plan (stability.py)."""
    from .stability import measure_stability

    plans = {"plan": plan, "all_fp16": frozenset()} if plan else {"all_fp16": frozenset()}
    return measure_stability(Reference(ctx.graph, opts.threads).run, ev.emulator.run, plans,
                             ctx.samples, opts.tolerance, opts.stability, seed=opts.seed + 1,
                             judge=lambda r, g, s: opts.criteria.judge(r, g, s,
                                                                       opts.tolerance).errors)


def explain(g: Graph, fp32_nodes: Sequence[str], stats: Mapping[str, TensorStats],
            constants: Mapping[str, ConstantStats],
            layers: Mapping[str, str] | None = None,
            precision: Precision = FP16) -> list[Culprit]:
    """A one-line reason per culprit from the layer-wise numbers (diagnose.py goes deeper);
    `layers`: node -> the TensorRT-style fused layer computing it."""
    out = []
    for name in fp32_nodes:
        node = g.node(name)
        layer = (layers or {}).get(name)
        own = g.own_name(name) if g.is_inner(name) else node.name  # without its holders
        out.append(Culprit(name, node.op_type, _why(g, name, stats, constants, precision),
                           module_label(own, g.model),  # PyTorch's name, when known
                           layer if layer != name else None))
    return out


def _why(g: Graph, name: str, stats: Mapping[str, TensorStats],
         constants: Mapping[str, ConstantStats], p: Precision = FP16) -> str:
    top, low = p.max_text, p.label
    for t in g.float_outputs(name):
        s = stats.get(t)
        if s is not None and (s.fp32_absmax > p.max or s.overflow):
            return f"output max {s.fp32_absmax:.3g} > {top}"
    for t in g.float_inputs(name):
        c = constants.get(t)
        if c is not None and c.overflow:
            return f"constant {t!r} holds {c.absmax:.3g}, beyond {low}'s {top}"
        s = stats.get(t)
        if s is not None and (s.fp32_absmax > p.max or s.overflow):
            return f"reads {t!r} of max {s.fp32_absmax:.3g} > {top}"
    for t in [*g.float_inputs(name), *g.float_outputs(name)]:
        c, s = constants.get(t), stats.get(t)
        if c is not None and c.flushed:
            return f"constant {t!r} has {c.flushed} value(s) that {low} flushes to zero"
        if c is not None and c.raised:
            return f"constant {t!r} has {c.raised} value(s) below {low}'s smallest subnormal " \
                   f"that TensorRT's {low} conversion raises to {p.tiny:.3g}".replace("e-0", "e-")
        if s is not None and s.flushed:
            return f"{t!r}: {s.flushed} of {s.size} values flush to zero in {low}"
    for t in g.float_outputs(name):
        s = stats.get(t)
        if s is not None and s.new_nonfinite:
            return f"output turns non-finite in {low} ({s.fp16_nonfinite} values)"
        if s is not None:
            return f"{low} error grows here to {s.rel_err:.2g} of the output's range"
    return "needed by the tolerance"


def _finish(result: RunResult, ctx: Context, out_dir: Path | None, started: float,
            report: bool = False, marks: Sequence[tuple[str, float]] = ()) -> RunResult:
    """Seconds in all and per stage (the files' writing included in neither), then the files."""
    now = time.perf_counter()
    result.seconds = now - started
    ends = [t for _, t in marks[1:]] + [now]
    result.extra["stages"] = [{"stage": msg, "seconds": round(end - begun, 3)}
                              for (msg, begun), end in zip(marks, ends)]
    if out_dir is not None:
        write_outputs(result, ctx, out_dir, report)
    return result


def write_outputs(result: RunResult, ctx: Context, out_dir: Path, report: bool = False) -> None:
    """Every file atomically, as one generation that replaces the last (outdir.py): the plan
    is written last, never beside an earlier run's files. The input model is only read."""
    with OutputDir(out_dir).generation(keep=ctx.sources) as gen:
        _write_files(result, ctx, out_dir, report)
        gen.commit(result.to_json())


def _write_files(result: RunResult, ctx: Context, out_dir: Path, report: bool = False) -> None:
    stem = ctx.path.stem
    if result.verdict in PLAN_VERDICTS:
        if ctx.graph.inlined or not named_as_trtbisect_names(ctx.model):
            path = out_dir / f"{stem}.named.onnx"
            graph_model(ctx.graph).save(path)
            result.files["named_model"] = str(path)
        if result.rewritten_model is not None:
            path = out_dir / f"{stem}.rewritten.onnx"
            result.rewritten_model.save(path)
            result.files["rewritten_model"] = str(path)
        mixed_path = out_dir / f"{stem}.mixed.onnx"
        if result.staged:  # the files judged in the run, moved into place
            for f in result.staged:
                claim(out_dir / Path(f).name)  # listed in the generation before it lands
                move_file(f, out_dir / Path(f).name)
            result.staged = []
        else:
            if result.mixed_model is None:
                result.mixed_model = write_plan(ctx, result.fp32_nodes)
            result.mixed_model.save(mixed_path)
        result.files["mixed_model"] = str(mixed_path)
        result.render_context = _render_context(result, ctx, out_dir)
        r = result.renderings()
        if r["trtexec_layer_precisions"] is not None:
            atomic_write_text(out_dir / "layer_precisions.txt", f"{r['trtexec_layer_precisions']}\n")
            result.files["layer_precisions"] = str(out_dir / "layer_precisions.txt")
        atomic_write_json(out_dir / "autocast_nodes_to_exclude.json", r["autocast_nodes_to_exclude"])
        result.files["autocast_nodes_to_exclude"] = str(out_dir / "autocast_nodes_to_exclude.json")
        from .render import commands_script
        atomic_write_text(out_dir / "commands.sh",
                          commands_script(result.fp32_nodes, result.render_context))
        result.files["commands"] = str(out_dir / "commands.sh")
    if result.stats:
        atomic_write_records(out_dir / "layerwise.json",
                             [s.to_json() for s in result.stats.values()])
        result.files["layerwise"] = str(out_dir / "layerwise.json")
    if result.search is not None:
        result.files["journal"] = str(out_dir / "journal.jsonl")
        atomic_write_json(out_dir / "trace.json", result.search.to_json())
        result.files["trace"] = str(out_dir / "trace.json")
    if result.extra.get("culprit_groups"):
        path = out_dir / f"{stem}.annotated.onnx"
        meta = {"trtbisect.verdict": result.verdict, "trtbisect.version": __version__,
                "trtbisect.fp32_nodes": ",".join(result.fp32_nodes)}
        annotated = annotate(ctx.model, result.extra["culprit_groups"],  # type: ignore[arg-type]
                             {c.node: c.why for c in result.culprits}, meta)
        graph_model(ctx.graph, annotated).save(path)
        result.files["annotated_model"] = str(path)
    if report:
        from .report import write_report
        result.files.update(write_report(result, out_dir))
    result.files["plan"] = str(out_dir / "precision.json")


def _render_context(result: RunResult, ctx: Context, out_dir: Path) -> RenderContext:
    """What every rendering needs to reproduce this run; writes the samples (one .npz each)
    and a Polygraphy data loader beside the plan."""
    from .inputs import declared_shape
    from .render import data_loader_script, npz_bytes, output_bounds, relative_to, shape_ranges

    work = out_dir.resolve()
    samples = []
    for k, sample in enumerate(ctx.every_sample):
        path = out_dir / "inputs" / f"sample_{k:03d}.npz"
        data = npz_bytes(sample)
        atomic_write(path, lambda tmp, data=data: Path(tmp).write_bytes(data))
        samples.append(relative_to(path, work))
    for stale in (out_dir / "inputs").glob("sample_*.npz"):  # a previous run's: the folder
        if relative_to(stale, work) not in samples:  # is the samples (AutoCast, check lines)
            stale.unlink()
    atomic_write_text(out_dir / "data_loader.py", data_loader_script(samples))
    result.files["samples"] = str(out_dir / "inputs")
    result.files["data_loader"] = str(out_dir / "data_loader.py")
    emulated = out_dir / f"{ctx.path.stem}.mixed.emulated.onnx"
    if result.emulated_mixed is None:  # the plan changed since it was judged (TensorRT)
        fused = ctx.prepared is not None and ctx.prepared.semantics == "trt"
        result.emulated_mixed = Written(*emulation_of_mixed(
            Graph.from_path(result.files["mixed_model"]), ctx.rules, fused))
    result.emulated_mixed.save(emulated)
    result.emulated_mixed = None
    result.files["emulated_mixed_model"] = str(emulated)
    g = ctx.judged  # the plan names its nodes
    names = {onnx.TensorProto.FLOAT: "fp32", onnx.TensorProto.FLOAT16: "fp16",
             onnx.TensorProto.BFLOAT16: "bf16", onnx.TensorProto.INT32: "int32",
             onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT8: "int8",
             onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.BOOL: "bool"}
    stem = ctx.path.stem
    return RenderContext(
        model=relative_to(result.files.get("rewritten_model")
                          or result.files.get("named_model", ctx.path), work),
        mixed_model=relative_to(result.files["mixed_model"], work), workdir=str(work),
        emulated_model=relative_to(emulated, work),
        tolerance=result.tolerance, criteria=result.criteria, outputs=tuple(g.output_names()),
        output_bounds=output_bounds(ctx.every_reference, result.tolerance),
        shape_ranges=shape_ranges({v.name: declared_shape(v) for v in g.inputs()},
                                  ctx.every_sample),
        samples=tuple(samples), data_loader="data_loader.py",
        autocast_output=f"{stem}.autocast.onnx", engine_stem=stem, node_names=tuple(g.names),
        true_fp32=not ctx.rules.tf32,
        trt_version=ctx.prepared.trt_version if ctx.prepared else 11,
        judge_args=_judge_args(ctx),
        reference_model=relative_to(ctx.path, work) if "rewritten_model" in result.files else None,
        output_types={n: tuple(names.get(g.types.get(t, 0), "other")
                               for t in g.node(n).output if t) for n in result.fp32_nodes},
        inner_nodes=tuple(n for n in g.candidates() if g.is_inner(n)),
        precision=ctx.rules.precision.name)


def _judge_args(ctx: Context) -> tuple[str, ...]:
    """The flags that make `trtbisect check` judge as this run did."""
    if ctx.prepared is None:
        return ()
    return ("--semantics", ctx.prepared.semantics, "--trt-version", str(ctx.prepared.trt_version),
            "--tf32" if ctx.rules.tf32 else "--no-tf32",
            *(("--fp16-accumulate",) if ctx.rules.accumulate else ()),
            *(("--precision", ctx.rules.precision.name)
              if ctx.rules.precision.name != FP16.name else ()))


def verify_on_tensorrt(result: RunResult, opts: Options, out_dir: Path) -> None:
    """Build the emulator's plan as TensorRT engines; refine only where TensorRT disagrees.

    The TensorRT report lands in precision.json under "tensorrt"; when TensorRT needs more
    FP32 nodes than the emulator did, its plan becomes the plan.
    """
    from .backends.trt import run_trt_search

    ctx = prepare(result.model_path, opts)
    report = run_trt_search(ctx.graph.materialize(), ctx.samples, out_dir / "trt", tolerance=opts.tolerance,
                            shapes=opts.shapes, emulator_plan=result.fp32_nodes,
                            seeds=result.prior_seeds)
    result.extra["tensorrt"] = report.to_json()
    if not report.result.found:
        result.verdict = "no_plan"
    elif set(report.result.fp32) != set(result.fp32_nodes):
        result.fp32_nodes = list(report.result.fp32)
        result.mixed_model = result.mixed_check = None  # they described the emulator's plan
        result.files.pop("mixed_model", None)
        result.staged, result.emulated_mixed = [], None
        result.verdict = "fixed" if result.fp32_nodes else "fp16_ok"
    write_outputs(result, ctx, out_dir)


def judge_all_fp16(ctx: Context, opts: Options) -> Verdict:
    """All-FP16 on the emulator under the run's criteria (`compare` with criterion flags)."""
    ev = Evaluator(ctx, opts, {}, None)
    judged = ev.measure(frozenset())[1]
    ev.close()
    return opts.criteria.verdict(judged)


# ---------------------------------------------------------------- check

@dataclass
class CheckResult:
    passed: bool
    errors: dict[str, OutputError]
    half_tensors: int
    samples: int
    emulated: Written | None = field(default=None, repr=False)  # the graph the judge ran
    # per sample, the tensors judge_mixed was asked to expose (the layer-wise pass's FP16 side)
    tensors: list[dict[str, np.ndarray]] = field(default_factory=list, repr=False)
    unjudged: list[dict] = field(default_factory=list)  # coverage.unjudged of the file
    judgements: list[Judgement] = field(default_factory=list, repr=False)  # per sample
    verdict: Verdict | None = field(default=None, repr=False)

    @property
    def exit_code(self) -> int:
        """0 passes, 4 fails, 5 passes on the judged part only (`unjudged`)."""
        return EXIT_NO_PLAN if not self.passed else EXIT_PARTIAL if self.unjudged else EXIT_OK

    def to_json(self) -> dict:
        d = {"passed": self.passed, "samples": self.samples, "fp16_tensors": self.half_tensors,
             "errors": {k: v.to_json() for k, v in self.errors.items()},
             "unjudged": self.unjudged}
        if self.verdict is not None:
            d["judged"] = self.verdict.to_json()
        return d


def check_mixed(mixed_path: str | Path, reference_path: str | Path, opts: Options) -> CheckResult:
    """Judge any mixed-precision ONNX against the FP32 reference model on the emulator."""
    ctx = prepare(reference_path, opts, search=False)
    # the file's own weights; its layers: judge_mixed
    ctx.rules = semantics.Rules(tf32=opts.tf32, accumulate=opts.accumulate,
                                precision=low_precision(opts.precision))
    problems = reference_problems(ctx)
    if problems:
        raise TrtBisectError(f"the FP32 reference is already broken: {problems[0]}",
                             EXIT_REFERENCE_INVALID)
    return judge_mixed(mixed_path, ctx, opts)


def _refuse_other_precision(graph: Graph, ctx: Context, path: str | Path) -> None:
    """A file whose own low-precision tensors (beyond the reference's) are all of the other
    type was not written for this --precision: say so rather than judge it under the wrong
    name. (The judge itself rounds every tensor to the type the file gives it.)"""
    own = set(ctx.graph.half_typed.values())
    added = {ty for ty in graph.half_typed.values()} - own
    low = ctx.rules.precision
    if added and low.onnx_type not in added:
        other = ", ".join(sorted(p.name for ty in added if (p := of_type(ty)) is not None))
        raise TrtBisectError(f"{path} holds {other} tensors, not {low.name}: judge it with "
                             f"--precision {other}")


def judge_mixed(mixed_path: str | Path, ctx: Context, opts: Options,
                expose: Sequence[str] = ()) -> CheckResult:
    """The one judge of a written file: its float16 tensors rounded where produced.
    `expose`: tensors of the file to return too, per sample (`CheckResult.tensors`)."""
    graph = Graph.from_path(mixed_path)
    names = ctx.graph.output_names()
    missing = set(names) - set(graph.output_names())
    if missing:
        raise TrtBisectError(f"{mixed_path} lacks the reference's output(s) "
                             f"{', '.join(sorted(missing))}")
    fed = {v.name for v in graph.inputs()}
    lacking = fed - {v.name for v in ctx.graph.inputs()}
    if lacking:
        raise TrtBisectError(f"{mixed_path} has input(s) {', '.join(sorted(lacking))} that the "
                             "reference model does not have")
    _refuse_other_precision(graph, ctx, mixed_path)
    wanted = [t for t in expose if t in graph.producer]
    judge = MixedModel(graph, opts.threads, ctx.rules, fused=opts.semantics == "trt",
                       expose=wanted)
    judged, tensors = [], []
    for sample, ref in zip(ctx.every_sample, ctx.every_reference):  # certified on every one
        outs, exposed = judge.run_tensors(sample)
        judged.append(opts.criteria.judge(ref, {k: outs[k] for k in names}, sample,
                                          opts.tolerance))
        if expose:
            tensors.append({t: exposed[t] for t in wanted})
    verdict = opts.criteria.verdict(judged)
    return CheckResult(verdict.passed, verdict.errors, len(graph.half_typed), len(judged),
                       Written(judge.proto, judge.arrays), tensors,
                       [c.to_json() for c in coverage.unjudged(graph)], judged, verdict)
