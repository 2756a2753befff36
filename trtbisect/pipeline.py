"""`trtbisect run`, `compare` and `check` as library calls: load, reference, layer-wise
comparison, prior, search, verify, write. The CLI only parses, calls and formats."""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx

from . import __version__, cost, coverage, degenerate, parallel, semantics
from .backends.ort import Emulator, Reference, run_seconds
from .compare import OutputError, TensorStats, Tolerance, validate_tolerance
from .diagnose import Culprit, attach as attach_diagnosis, explain, group_culprits, note_fused
from .errors import (EXIT_NO_PLAN, EXIT_OK, EXIT_OVER_BUDGET, EXIT_PARTIAL,
                     EXIT_REFERENCE_INVALID, EXIT_REFERENCE_UNSTABLE, TrtBisectError)
from .graph import Graph, external_data_hash, external_files, model_hash
from .data.sources import expand, iter_items
from .data.store import SampleSet, reference_set
from .inputs import Sample
from .judge import subset
from .judge.layerwise import cached_layerwise, layerwise, layerwise_batches
from .judge.strict import absorbed_nodes, compare_with_strict, semantics_notes
from .judge.written import (CheckResult, Judged, judge_mixed, judge_written_plan, json_number,
                            worst_of, write_and_judge)
from .judge.criteria import Criteria, Judgement, Verdict
from .judge.precision import FP16, precision as low_precision
from .journal import Journal, plan_key
from .render import RenderContext
from .mixed import Written, graph_model
from .outdir import OutputDir
from .outputs.write import PLAN_VERDICTS, write_outputs  # noqa: F401 (cli: pipeline.PLAN_VERDICTS)
from .search import Progress, SearchResult, find_minimal_fp32
from .suspects import ConstantStats, build_prior, constant_stats

log = logging.getLogger(__name__)

BULKY_EXTRAS = ("layerwise_plan",)  # kept for the report, not written into precision.json
VERDICT_EXIT = {"fp16_ok": EXIT_OK, "fixed": EXIT_OK, "reference_invalid": EXIT_REFERENCE_INVALID,
                "no_plan": EXIT_NO_PLAN, "partial": EXIT_PARTIAL,
                "over_budget": EXIT_OVER_BUDGET, degenerate.NOTHING_TO_JUDGE: EXIT_OK,
                "reference_unstable": EXIT_REFERENCE_UNSTABLE}


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
    # evaluations on N worker processes (parallel/; None: as the cores and memory allow; 1:
    # in this process), or on Ray actors (`ray`: a cluster's address, "" for a local one)
    workers: int | None = 1
    ray: str | None = None
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
    # the emulator rounds with Casts to the low type: an older opset is judged as converted
    from .repair import npz_shapes
    graph = Graph.from_path(path, low_precision(opts.precision).min_opset if search else 1,
                            {**npz_shapes(list(opts.inputs)), **opts.shapes})
    if graph.repairs:
        from .repair import say
        log.warning("%s", say(path, graph.repairs))
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


# ---------------------------------------------------------------- evaluation

class Evaluator:
    """Runs a plan on every sample and judges it; journals each judgement."""

    def __init__(self, ctx: Context, opts: Options, stats: Mapping[str, TensorStats],
                 journal: Journal | None, groups: Iterable[Iterable[str]] | None = None) -> None:
        """`groups`: nodes that plans keep together (default: the search's units)."""
        self.ctx, self.opts, self.journal = ctx, opts, journal
        self.watch = [t for t in ctx.judged.stored_tensors()
                      if t in stats and stats[t].fp32_nonfinite == 0] if opts.strict else []
        if groups is None:
            groups = (semantics.units(ctx.prepared, ctx.judged.candidates()).values()
                      if ctx.prepared is not None else ())
        self.groups = [list(g) for g in groups]
        self._emulator_args = dict(watch=self.watch, rules=ctx.rules, groups=self.groups)
        self._emulator: Emulator | None = None
        self.workers: parallel.ParallelJudge | None = None  # evaluations on worker processes
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
        if self.workers is not None:
            self.workers.close()
            self.workers = None

    def use_workers(self, workers: "parallel.ParallelJudge") -> None:
        """Judge on `workers` from now on (parallel/): this process's session goes."""
        if self._emulator is not None:
            self._emulator.close()
        self.workers = workers

    def sample_indices(self, full: bool = False) -> list[int]:
        """Indices into every sample of those a verdict judges (`full`: all of them)."""
        assert self.ctx.every_sample is not None
        if full or self.ctx.subset is None:
            return list(range(len(self.ctx.every_sample)))
        return list(self.ctx.subset)

    def measure(self, plan: frozenset[str], stop_early: bool = False, full: bool = False
                ) -> tuple[bool, list[Judgement], list[str]]:
        """The plan judged on the search's samples (`full`: on every sample) under the run's
        criteria (judge/criteria.py); `stop_early`: stop once the plan cannot pass any more.
        One rule for this process and the workers (parallel/judge.py)."""
        crit, opts = self.opts.criteria, self.opts
        full = full or self.ctx.subset is None
        if self.workers is not None:
            m = self.workers.measure(plan, self.sample_indices(full), stop_early)
        else:
            samples = self.ctx.every_sample if full else self.ctx.samples
            references = self.ctx.every_reference if full else self.ctx.references
            assert samples is not None and references is not None
            m = parallel.take((parallel.judge_one(self.emulator, plan, s, r, crit, opts.tolerance,
                                                  opts.strict)
                               for s, r in zip(samples, references)), crit, len(samples),
                              stop_early)
        self.runs += len(m.judged)
        if full and not m.stopped:
            self.last_plan, self.last_errors = plan, m.judged  # every sample: reusable as is
        return m.passed, m.judged, m.nonfinite

    def widened(self) -> None:
        """The search's samples grew (judge/subset.py): what passed on fewer may not now;
        what failed still fails."""
        self.known = {p: ok for p, ok in self.known.items() if not ok}

    def _key(self, plan: frozenset[str]) -> str:
        key = plan_key(plan)
        if self.ctx.subset is not None:  # a verdict on these samples only
            key += "@" + subset.signature(self.ctx.subset)
        return key

    def known_verdict(self, plan: frozenset[str]) -> bool | None:
        """The verdict `check` gives without judging (known, or in a resumed run's journal);
        nothing written."""
        if plan in self.known:
            return self.known[plan]
        return self.journal.peek(self._key(plan)) if self.journal is not None else None

    def check(self, plan: frozenset[str]) -> bool:
        if plan in self.known:
            return self.known[plan]
        key = self._key(plan)
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
        return self.commit(plan, parallel.Measured(passed, judged, bad))

    def commit(self, plan: frozenset[str], m: "parallel.Measured", taken: bool = False) -> bool:
        """A judged plan's verdict, scored and journaled. `taken`: measured by the workers
        and taken by the search now (its inferences count from here)."""
        if taken:
            self.runs += len(m.judged)
            if self.ctx.subset is None and not m.stopped:
                self.last_plan, self.last_errors = plan, m.judged
        self.scores[plan] = _severity(m.judged)
        if self.journal is not None:
            self.journal.record(self._key(plan), m.passed, {
                "rel": {n: json_number(e.rel) for n, e in worst_of(m.judged).items()},
                "severity": json_number(self.scores[plan]),
                "nonfinite_tensors": m.nonfinite[:10]})
        return m.passed

    def crashed(self, plan: frozenset[str], attempts: int) -> bool:
        """A plan that killed `attempts` workers: judged failed, as the journal judges a plan
        that crashes the process."""
        if self.journal is not None:
            self.journal.record(self._key(plan), False, {"crashed": True, "attempts": attempts})
        return False


def _score(rel: Mapping[str, object]) -> float:
    """A plan's worst relative error over its outputs (journal values may be "inf"/"nan")."""
    values = [float(v) for v in rel.values()]  # type: ignore[arg-type]
    return max(values) if values else math.nan


def _severity(judged: Iterable[Judgement]) -> float:
    """A judged plan's score for the trade-off plot: its worst severity over samples and
    outputs (under the default criterion: the worst relative error; else 1 at the bound)."""
    errors = worst_of(judged)
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


# ---------------------------------------------------------------- run


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
    if ctx.graph.repairs:  # what trtbisect's copy changed (repair.py, docs/input_models.md)
        record["model_copy"] = list(ctx.graph.repairs)
    for c in coverage.trt_unsupported(g):  # before any search: the engine may not build at all
        log.warning("TensorRT's ONNX parser: %s x%d (%s): %s; %s", c.label, len(c.nodes),
                    ", ".join(c.nodes[:3]) + (", ..." if len(c.nodes) > 3 else ""), c.why, c.fix)
    unjudgeable = _unjudgeable(ctx, record, base, opts.threads)
    if unjudgeable is not None:
        return _finish(unjudgeable, ctx, out_dir, started, opts.report, marks)
    stats: dict[str, TensorStats] = {}
    fingerprint = _fingerprint(ctx, opts)
    # range facts of every weight, as the judge converts them: one pass over the weights
    constants = constant_stats(g, ctx.rules.weight_rule, low)
    if opts.strict:  # the watch list needs to know which tensors FP32 keeps finite
        stage("layer-wise comparison, FP32 vs FP16")
        stats = cached_layerwise(ctx, opts, out_dir, fingerprint, on_layerwise)
    journal = None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        journal_path = out_dir / "journal.jsonl"
        if not opts.resume and journal_path.exists():
            journal_path.unlink()
        journal = Journal(journal_path, fingerprint)
    ev = Evaluator(ctx, opts, stats, journal)
    stage("all-FP16 evaluation")
    # what an evaluation costs once its session exists (the default --workers' estimate):
    # the inference alone; the all-FP16 stage's wall time is mostly building a session
    half_began = run_seconds()
    narrow = subset.wanted(len(ctx.every_sample), opts.search_samples, opts.criteria.pass_rate)
    first: Judged | None = None
    fp16_first: list[dict[str, np.ndarray]] = []  # per sample: the first layer-wise batch, FP16
    batches: list[list[str]] | None = None  # the layer-wise batches, once known
    if opts.strict or ctx.graph.weights.total_bytes() > FILE_FIRST_WEIGHT_BYTES:
        # the non-finite watch runs on the emulator; and big weights: writing them in FP16
        # for a verdict that may fail costs more than the emulator session it saves
        if stats and not opts.rewrite:  # the prior is known: one session, the search's
            early = build_prior(g, stats, constants, low)
            ev.emulator.ensure(_prefetch(g, early.seeds, early.ranking))
        all_half, before, _ = ev.measure(frozenset())
    else:  # the all-FP16 file, written and judged: if it passes, it is the answer as it is
        # its judge also returns the FP16 side of the layer-wise pass's first batch, which a
        # failing verdict needs next (the same graph: it saves a session and an inference)
        batches = None if narrow else layerwise_batches(ctx, opts)  # narrow: for the subset
        first = write_and_judge(ctx, opts, frozenset(), out_dir,
                                 expose=batches[0] if batches else ())
        all_half, before = first.checked.passed, first.checked.judgements
        ev.runs += len(ctx.samples)
        fp16_first = first.checked.tensors
        first.checked.tensors = []
        if not all_half:
            first = None  # memory: the search writes and judges its own plan
    half_seconds = run_seconds() - half_began
    ev.known[frozenset()] = all_half
    ev.scores[frozenset()] = _severity(before)
    if narrow and not all_half:  # judge/subset.py: search on the worst samples, certify on all
        ctx.narrow(subset.choose(before, opts.search_samples))
        stage(f"the search judges on {len(ctx.samples)} of {len(ctx.every_sample)} samples "
              "(where all-FP16 fails worst); the plan is certified on all of them")
    if (not all_half or opts.report) and not stats:  # FP16 passing needs no layer-wise pass
        stage("layer-wise comparison, FP32 vs FP16")
        ev.close()  # memory: reopened for the search, on the active set
        stats = cached_layerwise(ctx, opts, out_dir, fingerprint, on_layerwise, fp16_first,
                                  batches)
    fp16_first = []  # memory: the FP16 side is only statistics now
    outcome = None
    if opts.rewrite and not all_half:
        stage("trying FP16-safe rewrites")
        suspects = build_prior(ctx.graph, stats, constants if g is ctx.graph else
                               constant_stats(ctx.graph, ctx.rules.weight_rule, low), low).seeds
        outcome, judged_ctx = _try_rewrites(ctx, opts, stats, suspects,
                                            (all_half, worst_of(before)))
        if outcome is not None and outcome.applied:
            ctx = judged_ctx or _rewritten_context(ctx, outcome.model, opts)
            g = ctx.judged
            constants = constant_stats(g, ctx.rules.weight_rule, low)  # the rewritten weights
            base.update(candidates=len(g.candidates()), nodes=len(g.names))
            ev = Evaluator(ctx, opts, stats, journal)
            all_half = outcome.passed
            ev.known[frozenset()] = all_half
    prior = build_prior(g, stats, constants, low)
    units = semantics.units(ctx.prepared, g.candidates())
    unit_of = {n: u for u, nodes in units.items() for n in nodes}
    pricing = cost.pricing_for(g, units, ctx.samples[0], opts.gpu, opts.tf32,
                               _shape_probe(ctx, opts))
    workers = None
    if not all_half:
        prefetch = _prefetch(g, prior.seeds, prior.ranking,
                             _neighbours(units, unit_of, pricing.adjacent))
        workers = parallel.start_workers(
            ev, ctx, opts, prefetch, half_seconds * len(ctx.samples) / len(ctx.every_sample),
            _likely_evaluations(len(prior.seeds), len(units)), cache, stage,
            rewritten=outcome is not None and bool(outcome.applied))
        if workers is None:
            ev.emulator.ensure(prefetch)

    def as_units(nodes: Sequence[str]) -> list[str]:
        return list(dict.fromkeys(unit_of[n] for n in nodes if n in unit_of))

    def as_nodes(chosen) -> frozenset[str]:
        return frozenset(n for u in chosen for n in units[u])

    stage(f"searching {len(units)} candidate units of {len(g.candidates())} nodes "
          f"({len(prior.seeds)} suspects)")
    check = (workers.for_units(as_nodes) if workers is not None
             else lambda us: ev.check(as_nodes(us)))
    search = _certified_search(
        ctx, opts, ev, stage, as_nodes,
        lambda budget: find_minimal_fp32(list(units), check, as_units(prior.seeds),
                                         as_units(prior.ranking), budget, progress,
                                         **cost.search_args(pricing, opts)))
    if journal is not None:
        journal.close()
    parallel_summary = parallel.summary(workers, search, ev)
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
                       errors_before=worst_of(before), errors_after=worst_of(before),
                       one_minimal=search.one_minimal and search.found, search=search,
                       stats=stats, prior_seeds=prior.seeds, extra=dict(record), **base)
    _record_search(result, ctx, opts, search, pricing, before, parallel_summary)
    if outcome is not None:
        result.extra["rewrites"] = outcome.to_json()
        if rewritten:
            result.rewritten_model = graph_model(ctx.graph)
    if search.found:
        stage("judging the written plan")
        judge_written_plan(result, ctx, opts, ev, plan, out_dir, first)
    ev.close()  # the workers, if the written plan's judge did not stop them already
    _explain(result, ctx, opts, ev, constants, units, unit_of, stage, on_layerwise)
    return _finish(result, ctx, out_dir, started, opts.report, marks)


def _record_search(result: RunResult, ctx: Context, opts: Options, search: SearchResult,
                   pricing: cost.Pricing, before: Sequence[Judgement],
                   parallel_summary: dict | None) -> None:
    """What precision.json says of the search: its layers, its price, the criterion, the
    all-FP16 verdict, the samples it judged and the workers it ran on."""
    found = list(search.fp32) if search.found else []
    result.extra["fp32_layers"] = found
    if parallel_summary is not None:
        result.extra["workers"] = parallel_summary
    result.extra["cost"] = pricing.summary(found, opts.objective, opts.budget)
    result.extra["criteria"] = {**opts.criteria.to_json(),
                                "description": opts.criteria.describe()}
    judged: dict[str, object] = {"before": opts.criteria.verdict(before).to_json()}
    if ctx.subset is not None:
        judged["search_samples"] = list(ctx.subset)
    result.extra["judged"] = judged


def _unjudgeable(ctx: Context, record: dict, base: dict,
                 threads: int | None = None) -> RunResult | None:
    """The verdicts given before any judgement: an FP32 reference that is already broken or
    that two runs do not reproduce (random ops), or a model whose computation FP16 cannot
    change."""
    problems = reference_problems(ctx)
    if problems:
        return RunResult("reference_invalid", fp32_nodes=[], evaluations=0, inferences=0,
                         errors_before={}, errors_after={}, reference_problems=problems,
                         extra=dict(record), **base)
    from .judge.reproducible import unstable
    moving = unstable(ctx.graph, ctx.every_sample[0], threads)
    if moving:
        return RunResult("reference_unstable", fp32_nodes=[], evaluations=0, inferences=0,
                         errors_before={}, errors_after={}, reference_problems=moving,
                         extra=dict(record), **base)
    nothing = degenerate.nothing_to_judge(ctx.judged)
    if nothing:  # FP16 cannot change what this model computes: a verdict of its own
        return RunResult(degenerate.NOTHING_TO_JUDGE, fp32_nodes=[], evaluations=0,
                         inferences=0, errors_before={}, errors_after={},
                         extra={**record, "nothing_to_judge": nothing}, **base)
    return None


def _explain(result: RunResult, ctx: Context, opts: Options, ev: Evaluator,
             constants: Mapping[str, ConstantStats], units: Mapping[str, Sequence[str]],
             unit_of: Mapping[str, str], stage: Callable[[str], None],
             on_layerwise: Callable[[int, int], None] | None) -> None:
    """After the written plan's verdict: why each node, the culprit groups, what per-node
    rounding says beside TensorRT's, and what the report and --stability ask for."""
    g, low, stats = ctx.judged, ctx.rules.precision, result.stats
    plan = frozenset(result.fp32_nodes)
    result.culprits = explain(g, result.fp32_nodes, stats, constants,
                              semantics.fused_layer_names(ctx.prepared), low)
    attach_diagnosis(result, g, constants, low)
    note_fused(result, units, unit_of)
    # compare with per-node rounding where it can differ: culprits, or nodes TensorRT folds
    if opts.semantics == "trt" and (result.fp32_nodes or opts.report or absorbed_nodes(ctx)):
        stage("all-FP16 under strict per-node rounding, for comparison")
        compare_with_strict(result, ctx, opts)
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


def _certified_search(ctx: Context, opts: Options, ev: Evaluator, stage: Callable[[str], None],
                      as_nodes: Callable, search: Callable[[int | None], SearchResult]
                      ) -> SearchResult:
    """`search(budget)` on the search's samples; when they are a subset (judge/subset.py),
    the plan found is judged on every sample, and the samples it fails join the subset for
    another search, until it passes everywhere. Evaluations and trials add up over rounds."""
    evaluations, trials, rounds, speculative = 0, [], 0, 0
    while True:
        left = None if opts.max_evaluations is None else max(opts.max_evaluations - evaluations, 0)
        result = search(left)
        trials += [replace(t, index=t.index + evaluations) for t in result.trials]
        evaluations += result.evaluations
        rounds, speculative = rounds + result.rounds, speculative + result.speculative
        if not result.found or ctx.subset is None:
            break
        passed, judged, _ = ev.measure(as_nodes(result.fp32), full=True)
        evaluations, rounds = evaluations + 1, rounds + 1
        wider = subset.widen(ctx.subset, judged, opts.search_samples)
        if passed or len(wider) == len(ctx.subset):
            break
        stage(f"the plan fails {sum(not j.passed for j in judged)} of {len(judged)} samples: "
              f"searching again on {len(wider)} samples")
        ctx.narrow(wider)
        ev.widened()
    result.evaluations, result.trials = evaluations, trials
    result.rounds, result.speculative = rounds, speculative
    return result


def _likely_evaluations(suspects: int, units: int) -> int:
    """About what a search costs (the default --workers asks whether workers pay off): a
    removal per suspect and a bisection or two along the ranking."""
    return 4 + 2 * suspects + 2 * math.ceil(math.log2(units + 1))


PREFETCH_WEIGHT_BYTES = 1 << 20  # a switchable node holds its weights twice (FP16 and FP32)


def _prefetch(g: Graph, seeds: Sequence[str], ranking: Sequence[str],
              neighbours: Callable[[str], Iterable[str]] = lambda n: ()) -> list[str]:
    """The first active set: the seeds and the top of the ranking, and the nodes next to them
    (the swap certificate tries a neighbouring unit in a unit's place: without them, each swap
    rebuilt the session, 11 s a time on a 20k-node model), bar nodes with big weights
    (switching one keeps both its FP16 and FP32 weights, and materialises the chosen one on
    every run); a plan that needs such a node rebuilds the session around it."""
    def light(n: str) -> bool:
        return all(g.weights.nbytes(t) <= PREFETCH_WEIGHT_BYTES for t in g.node(n).input
                   if t in g.initializers)
    top = [n for n in ranking[:max(16, 2 * len(seeds))] if n in seeds or light(n)]
    near = [m for n in top for m in neighbours(n) if light(m)]
    return list(dict.fromkeys([*top, *near]))


def _neighbours(units: Mapping[str, Sequence[str]], unit_of: Mapping[str, str],
                adjacent: Mapping[str, Sequence[str]]) -> Callable[[str], list[str]]:
    """Node -> the nodes of the units adjacent to its unit (cost.py's swap neighbourhood)."""
    def near(n: str) -> list[str]:
        u = unit_of.get(n)
        return [m for v in adjacent.get(u, ()) for m in units[v]] if u is not None else []
    return near


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
                             judge=lambda r, g, s: opts.criteria.judge(r, g, s, opts.tolerance))


def _finish(result: RunResult, ctx: Context, out_dir: Path | None, started: float,
            report: bool = False, marks: Sequence[tuple[str, float]] = ()) -> RunResult:
    """Seconds in all and per stage (the files' writing included in neither), then the files."""
    now = time.perf_counter()
    result.seconds = now - started
    # Each boundary is rounded once, as an offset from the start, so the stages add up to the
    # span they cover (never more than the total) however the milliseconds fall.
    at = [round(t - started, 3) for _, t in marks] + [round(now - started, 3)]
    result.extra["stages"] = [{"stage": msg, "seconds": round(end - begun, 3)}
                              for (msg, _), begun, end in zip(marks, at, at[1:])]
    if out_dir is not None:
        write_outputs(result, ctx, out_dir, report)
    return result


def verify_on_tensorrt(result: RunResult, opts: Options, out_dir: Path,
                       say: Callable[[str], None] = log.info) -> None:
    """Build the emulator's plan as TensorRT engines; refine only where TensorRT disagrees.

    The TensorRT report lands in precision.json under "tensorrt"; when TensorRT needs more
    FP32 nodes than the emulator did, its plan becomes the plan. Engines are judged by the
    run's criteria. `--workers N` builds on up to N visible GPUs at once (`say` tells how many).
    """
    from .backends.trt import run_trt_search

    ctx = prepare(result.model_path, opts)
    report = run_trt_search(ctx.graph.materialize(), ctx.samples, out_dir / "trt", tolerance=opts.tolerance,
                            shapes=opts.shapes, emulator_plan=result.fp32_nodes,
                            seeds=result.prior_seeds, workers=opts.workers, say=say,
                            criteria=opts.criteria)
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
    require_reproducible(ctx, opts.threads)
    _declares_the_reference_shapes(mixed_path, ctx.every_reference[0])
    try:
        return judge_mixed(mixed_path, ctx, opts)
    except ValueError as exc:  # a file of the user's computing other shapes (declared dynamic)
        if not str(exc).startswith("shape mismatch"):
            raise
        raise TrtBisectError(f"{mixed_path} computes another output shape than the reference "
                             f"({exc}): is it a mixed-precision copy of the reference model?"
                             ) from exc


def require_reproducible(ctx: Context, threads: int | None) -> None:
    """`check` and `compare`: a reference two runs do not reproduce (random ops) is refused,
    exit 7, naming the op (`run` gives it a verdict of its own)."""
    from .judge.reproducible import unstable
    moving = unstable(ctx.graph, ctx.every_sample[0], threads)
    if moving:
        raise TrtBisectError(f"the FP32 reference is not reproducible: {'; '.join(moving)}",
                             EXIT_REFERENCE_UNSTABLE)


def _declares_the_reference_shapes(mixed_path: str | Path, ref: Mapping[str, np.ndarray]) -> None:
    """A file whose output declares another static shape than the reference computes is
    another model: refused in one line, before it is run."""
    from .graph import load_model
    from .inputs import declared_shape
    for v in load_model(mixed_path).graph.output:
        dims = declared_shape(v) if v.type.tensor_type.HasField("shape") else None
        if v.name in ref and dims is not None and all(isinstance(d, int) and d > 0 for d in dims) \
                and tuple(dims) != np.shape(ref[v.name]):
            raise TrtBisectError(
                f"{mixed_path}: output {v.name!r} declares shape {list(dims)}, the reference "
                f"computes {list(np.shape(ref[v.name]))}: is it a mixed-precision copy of the "
                "reference model?")


