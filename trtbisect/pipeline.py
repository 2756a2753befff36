"""`trtbisect run`, `compare` and `check` as library calls: load, reference, layer-wise
comparison, prior, search, verify, write. The CLI only parses, calls and formats."""

from __future__ import annotations

import hashlib
import logging
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from . import __version__
from .backends.ort import Emulator, MixedModel, Reference
from .compare import (FP16_MAX, OutputError, TensorStats, Tolerance, compare_outputs, merge_stats,
                      round_fp16, tensor_stats, worst)
from .diagnose import annotate, attach as attach_diagnosis
from .errors import EXIT_NO_PLAN, EXIT_OK, EXIT_REFERENCE_INVALID, TrtBisectError
from .graph import Graph, model_hash, node_names, structure
from .inputs import Sample, load_samples
from .journal import Journal, plan_key
from .plan import PrecisionPlan, atomic_write_json, atomic_write_text
from .mixed import Written, graph_model, mixed_model
from .modules import module_label
from .search import Progress, SearchResult, find_minimal_fp32
from .suspects import ConstantStats, build_prior, constant_stats

log = logging.getLogger(__name__)

VERDICT_EXIT = {"fp16_ok": EXIT_OK, "fixed": EXIT_OK, "reference_invalid": EXIT_REFERENCE_INVALID,
                "no_plan": EXIT_NO_PLAN}


@dataclass
class Options:
    inputs: Sequence[str] = ()
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    seed: int = 0
    samples: int = 1  # random samples when no --inputs are given
    tolerance: Tolerance = field(default_factory=Tolerance)
    strict: bool = False
    max_evaluations: int | None = None
    threads: int | None = None
    memory_budget: int = 1 << 30  # bytes of intermediate tensors held at once (layer-wise)
    resume: bool = True
    stability: int = 0  # N >= 2: rerun the plan and all-FP16 on N jittered copies per sample
    report: bool = False  # also write report.html / report.md (needs matplotlib)


@dataclass
class Context:
    """A loaded model with its samples and FP32 reference outputs."""

    path: Path
    model: onnx.ModelProto
    graph: Graph
    samples: list[Sample]
    references: list[dict[str, np.ndarray]]
    sha256: str


def prepare(model_path: str | Path, opts: Options) -> Context:
    path = Path(model_path)
    graph = Graph.from_path(path)
    samples = load_samples(graph, list(opts.inputs), opts.shapes, opts.seed, opts.samples)
    ref = Reference(graph, opts.threads)
    references = [ref.run(s) for s in samples]
    ref.close()
    return Context(path, graph.source, graph, samples, references, model_hash(path))


def reference_problems(ctx: Context) -> list[str]:
    problems = []
    for k, outs in enumerate(ctx.references):
        for name, value in outs.items():
            if np.issubdtype(value.dtype, np.floating):
                bad = int(value.size - np.count_nonzero(np.isfinite(value)))
                if bad:
                    problems.append(f"output {name!r} of sample {k} has {bad} non-finite value(s)")
    return problems


# ---------------------------------------------------------------- layer-wise comparison

def layerwise(ctx: Context, opts: Options,
              progress: Callable[[int, int], None] | None = None) -> dict[str, TensorStats]:
    """Statistics of every stored float tensor, FP32 vs all-FP16, worst over all samples.

    The FP32 side comes from the reference graph, the FP16 side from the static all-FP16 graph,
    both exposing one batch of tensors at a time under the memory budget (ORT keeps every
    exposed output alive for the whole run); only statistics are kept.
    """
    g = ctx.graph
    producer = {t: g.names[g.producer[t]] for t in g.stored_tensors()}
    stats: dict[str, TensorStats] = {}
    for v in g.inputs():
        if g.is_float(v.name):
            for s in ctx.samples:
                x = np.asarray(s[v.name], np.float32)
                _merge(stats, tensor_stats(v.name, None, x, round_fp16(x)))
    batches = _batches(g, ctx.samples[0], opts.memory_budget // 2)
    total, done = sum(len(b) for b in batches), 0
    for batch in batches:
        ref = Reference(g, opts.threads)
        emu = Emulator(g, opts.threads, expose=batch)
        for s in ctx.samples:
            a = ref.run_tensors(s, batch)
            b = emu.run_tensors(True, s, batch)
            for t in batch:
                _merge(stats, tensor_stats(t, producer[t], a[t], b[t]))
        emu.close()
        ref.close()
        done += len(batch)
        if progress is not None:
            progress(done, total)
    return stats


def _merge(stats: dict[str, TensorStats], new: TensorStats) -> None:
    stats[new.name] = merge_stats(stats[new.name], new) if new.name in stats else new


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


def summarize_layerwise(g: Graph, stats: Mapping[str, TensorStats]) -> dict[str, object]:
    """Where things first go wrong along the topological order."""
    ordered = [stats[t] for t in g.stored_tensors() if t in stats]
    first_nonfinite = [s.name for s in ordered if s.new_nonfinite and not _any_input_nonfinite(
        g, s, stats)]
    overflow = [s.name for s in ordered if s.overflow or s.fp32_absmax > FP16_MAX]
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
                 journal: Journal | None) -> None:
        self.ctx, self.opts, self.journal = ctx, opts, journal
        watch = [t for t in ctx.graph.stored_tensors()
                 if t in stats and stats[t].fp32_nonfinite == 0] if opts.strict else []
        self.emulator = Emulator(ctx.graph, opts.threads, watch=watch)
        self.runs = 0  # inferences, for cost accounting
        self.known: dict[frozenset[str], bool] = {}  # judged outside the search (all-FP16)

    def measure(self, plan: frozenset[str], stop_early: bool = False
                ) -> tuple[bool, list[dict[str, OutputError]], list[str]]:
        errors, nonfinite = [], []
        for sample, ref in zip(self.ctx.samples, self.ctx.references):
            self.runs += 1
            if self.opts.strict:
                outs, bad = self.emulator.nonfinite(plan, sample)
                nonfinite += [t for t in bad if t not in nonfinite]
            else:
                outs = self.emulator.run(plan, sample)
            errors.append(compare_outputs(ref, outs, self.opts.tolerance))
            ok = all(e.passed for e in errors[-1].values()) and not nonfinite
            if stop_early and not ok:
                return False, errors, nonfinite
        passed = all(e.passed for es in errors for e in es.values()) and not nonfinite
        return passed, errors, nonfinite

    def check(self, plan: frozenset[str]) -> bool:
        if plan in self.known:
            return self.known[plan]
        key = plan_key(plan)
        if self.journal is not None:
            rec = self.journal.lookup(key)
            if rec is not None:
                return bool(rec["passed"])
            self.journal.start(key)
        passed, errors, bad = self.measure(plan, stop_early=True)
        if self.journal is not None:
            self.journal.record(key, passed, {
                "rel": {n: _num(e.rel) for n, e in worst(errors).items()},
                "nonfinite_tensors": bad[:10]})
        return passed


def _num(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


# ---------------------------------------------------------------- run

@dataclass
class Culprit:
    node: str
    op: str
    why: str
    module: str | None = None

    def to_json(self) -> dict:
        d = {"node": self.node, "op": self.op, "why": self.why}
        if self.module:
            d["module"] = self.module
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
    stats: dict[str, TensorStats] = field(default_factory=dict)
    prior_seeds: list[str] = field(default_factory=list)
    seconds: float = 0.0
    files: dict[str, str] = field(default_factory=dict)
    extra: dict[str, object] = field(default_factory=dict)  # filled by diagnosis, torch, trt

    @property
    def mixed_model_passed(self) -> bool | None:
        if self.mixed_check is None:
            return None
        return all(e.passed for e in self.mixed_check.values())

    @property
    def exit_code(self) -> int:
        return VERDICT_EXIT[self.verdict]

    @property
    def plan(self) -> PrecisionPlan:
        return PrecisionPlan(tuple(self.fp32_nodes))

    def to_json(self) -> dict:
        return {
            "tool": "trtbisect", "version": __version__, "backend": "ort-emulator",
            "model": {"path": self.model_path, "sha256": self.model_sha256, "nodes": self.nodes,
                      "candidates": self.candidates},
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
            **self.extra,
        }

    def renderings(self) -> dict[str, object]:
        p = self.plan
        onnx_for_trt = self.files.get("named_model", self.model_path)
        return {
            "trtexec_layer_precisions": p.layer_precisions(),
            "trtexec_trt10": p.trtexec_command(onnx_for_trt),
            "trtexec_trt11": p.trtexec11_command(self.files.get("mixed_model", "<mixed>.onnx")),
            "polygraphy": p.polygraphy_command(onnx_for_trt),
            "autocast_nodes_to_exclude": p.autocast_exclude(),
            "autocast": p.autocast_command(onnx_for_trt),
        }


def run(model_path: str | Path, opts: Options, out_dir: Path | None = None,
        progress: Progress | None = None, on_stage: Callable[[str], None] | None = None,
        on_layerwise: Callable[[int, int], None] | None = None) -> RunResult:
    """The whole job: find the minimal FP32 set and write every rendering of it to `out_dir`."""
    started = time.perf_counter()
    stage = on_stage or (lambda msg: log.info(msg))
    if opts.report:
        from .report import require_matplotlib
        require_matplotlib()  # fail before the search, not after it
    stage("loading the model and running the FP32 reference")
    ctx = prepare(model_path, opts)
    g = ctx.graph
    base = dict(model_path=str(model_path), model_sha256=ctx.sha256, candidates=len(g.candidates()),
                nodes=len(g.names), samples=len(ctx.samples), tolerance=opts.tolerance,
                strict=opts.strict)
    problems = reference_problems(ctx)
    if problems:
        result = RunResult("reference_invalid", fp32_nodes=[], evaluations=0, inferences=0,
                           errors_before={}, errors_after={}, reference_problems=problems, **base)
        return _finish(result, ctx, out_dir, started, opts.report)
    stats: dict[str, TensorStats] = {}
    if opts.strict:  # the watch list needs to know which tensors FP32 keeps finite
        stage("layer-wise comparison, FP32 vs FP16")
        stats = layerwise(ctx, opts, on_layerwise)
    journal = None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        journal_path = out_dir / "journal.jsonl"
        if not opts.resume and journal_path.exists():
            journal_path.unlink()
        journal = Journal(journal_path, _fingerprint(ctx, opts))
    ev = Evaluator(ctx, opts, stats, journal)
    stage("all-FP16 evaluation")
    all_half, before, _ = ev.measure(frozenset())
    ev.known[frozenset()] = all_half
    if (not all_half or opts.report) and not stats:  # FP16 passing needs no layer-wise pass
        stage("layer-wise comparison, FP32 vs FP16")
        stats = layerwise(ctx, opts, on_layerwise)
    constants = constant_stats(g)
    prior = build_prior(g, stats, constants)
    if not all_half:
        ev.emulator.ensure(prior.ranking[:max(16, 2 * len(prior.seeds))])
    stage(f"searching {len(g.candidates())} candidate nodes ({len(prior.seeds)} suspects)")
    search = find_minimal_fp32(g.candidates(), ev.check, prior.seeds, prior.ranking,
                               opts.max_evaluations, progress)
    if journal is not None:
        journal.close()
    plan = frozenset(search.fp32)
    result = RunResult("no_plan" if not search.found else ("fixed" if plan else "fp16_ok"),
                       fp32_nodes=search.fp32 if search.found else [],
                       evaluations=search.evaluations, inferences=ev.runs,
                       errors_before=worst(before), errors_after=worst(before),
                       one_minimal=search.one_minimal and search.found, search=search,
                       stats=stats, prior_seeds=prior.seeds, **base)
    if search.found:
        _judge_written_plan(result, ctx, opts, ev, plan, out_dir)
    result.culprits = explain(g, result.fp32_nodes, stats, constants)
    attach_diagnosis(result, g, constants)
    if result.verdict in ("fixed", "fp16_ok") and opts.stability >= 2:
        stage(f"stability: {opts.stability} runs per sample")
        result.extra["stability"] = _stability(ctx, opts, ev, plan).to_json()
    return _finish(result, ctx, out_dir, started, opts.report)


def _judge_written_plan(result: RunResult, ctx: Context, opts: Options, ev: Evaluator,
                        plan: frozenset[str], out_dir: Path | None) -> None:
    """One judge: write the plan's mixed model, judge the file as `check` does, report that.

    The search's own numbers for the plan must be the file's, bit for bit; a file that fails
    makes the verdict `no_plan`, never `fixed`.
    """
    written = mixed_model(ctx.graph, plan)
    result.mixed_model = written
    with tempfile.TemporaryDirectory() as tmp:
        folder = out_dir if out_dir is not None else Path(tmp)
        path = folder / f"{ctx.path.stem}.mixed.onnx"
        written.save(path)
        if out_dir is not None:
            result.files["mixed_model"] = str(path)
        checked = judge_mixed(path, ctx, opts)
    _, searched, _ = ev.measure(plan)
    searched_worst = worst(searched)
    same = all(_bits(searched_worst[o]) == _bits(e) for o, e in checked.errors.items())
    result.mixed_check = checked.errors
    result.errors_after = checked.errors
    result.extra["one_judge"] = {"search_equals_check": same,
                                 "search_errors": {k: v.to_json() for k, v in searched_worst.items()}}
    if not same:
        log.error("the search measured other numbers than `check` of the written file: "
                  "trusting the file (please report this)")
    if not checked.passed:
        result.verdict, result.one_minimal = "no_plan", False
        log.error("the written mixed model fails the tolerance: no plan is reported")
    margins = _margins(ctx, opts, checked.errors)
    result.extra["margins"] = margins
    fragile = [o for o, m in margins.items() if m["fragile"]]
    result.extra["fragile"] = bool(fragile)
    if fragile and checked.passed:
        log.warning("the plan passes by less than FP32 kernel noise on %s: fragile",
                    ", ".join(fragile))


def _bits(e: OutputError) -> tuple:
    return (e.max_abs, e.mean_abs, e.nonfinite, e.passed)


NOISE_WEIGHT_LIMIT = 512 << 20  # bytes of weights above which the noise floor is not measured


def _margins(ctx: Context, opts: Options, errors: Mapping[str, OutputError]) -> dict[str, dict]:
    """Per output: how far under its bound the plan lands, against the noise floor of FP32
    itself (the reference model under ORT's default, optimizing kernels vs the judge's)."""
    noise: dict[str, float] = {}
    if ctx.graph.weights.total_bytes() <= NOISE_WEIGHT_LIMIT:
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
    sample_hash = hashlib.sha256()
    for s in ctx.samples:
        for k in sorted(s):
            sample_hash.update(k.encode())
            sample_hash.update(np.ascontiguousarray(s[k]).tobytes())
    return {"model": ctx.sha256, "samples": sample_hash.hexdigest(),
            "tolerance": opts.tolerance.to_json(), "strict": opts.strict, "version": __version__}


def _stability(ctx: Context, opts: Options, ev: Evaluator, plan: frozenset[str]):
    """The noise floor of the error around the final and the all-FP16 plan (stability.py)."""
    from .stability import measure_stability

    plans = {"plan": plan, "all_fp16": frozenset()} if plan else {"all_fp16": frozenset()}
    return measure_stability(Reference(ctx.graph, opts.threads).run, ev.emulator.run, plans,
                             ctx.samples, opts.tolerance, opts.stability, seed=opts.seed + 1)


def explain(g: Graph, fp32_nodes: Sequence[str], stats: Mapping[str, TensorStats],
            constants: Mapping[str, ConstantStats]) -> list[Culprit]:
    """A one-line reason per culprit from the layer-wise numbers (diagnose.py goes deeper)."""
    out = []
    for name in fp32_nodes:
        node = g.node(name)
        out.append(Culprit(name, node.op_type, _why(g, name, stats, constants),
                           module_label(node.name, g.model)))  # PyTorch's name, when known
    return out


def _why(g: Graph, name: str, stats: Mapping[str, TensorStats],
         constants: Mapping[str, ConstantStats]) -> str:
    for t in g.float_outputs(name):
        s = stats.get(t)
        if s is not None and (s.fp32_absmax > FP16_MAX or s.overflow):
            return f"output max {s.fp32_absmax:.3g} > 65504"
    for t in g.float_inputs(name):
        c = constants.get(t)
        if c is not None and c.overflow:
            return f"constant {t!r} holds {c.absmax:.3g}, beyond FP16's 65504"
        s = stats.get(t)
        if s is not None and (s.fp32_absmax > FP16_MAX or s.overflow):
            return f"reads {t!r} of max {s.fp32_absmax:.3g} > 65504"
    for t in [*g.float_inputs(name), *g.float_outputs(name)]:
        c, s = constants.get(t), stats.get(t)
        if c is not None and c.flushed:
            return f"constant {t!r} has {c.flushed} value(s) that FP16 flushes to zero"
        if s is not None and s.flushed:
            return f"{t!r}: {s.flushed} of {s.size} values flush to zero in FP16"
    for t in g.float_outputs(name):
        s = stats.get(t)
        if s is not None and s.new_nonfinite:
            return f"output turns non-finite in FP16 ({s.fp16_nonfinite} values)"
        if s is not None:
            return f"FP16 error grows here to {s.rel_err:.2g} of the output's range"
    return "needed by the tolerance"


def _finish(result: RunResult, ctx: Context, out_dir: Path | None, started: float,
            report: bool = False) -> RunResult:
    result.seconds = time.perf_counter() - started
    if out_dir is not None:
        write_outputs(result, ctx, out_dir, report)
    return result


def write_outputs(result: RunResult, ctx: Context, out_dir: Path, report: bool = False) -> None:
    """Every file atomically; the input model is only read."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = ctx.path.stem
    if result.verdict in ("fixed", "fp16_ok"):
        if any(not n.name for n in ctx.model.graph.node) or node_names(ctx.model) != [
                n.name for n in ctx.model.graph.node]:
            path = out_dir / f"{stem}.named.onnx"
            graph_model(ctx.graph).save(path)
            result.files["named_model"] = str(path)
        mixed_path = out_dir / f"{stem}.mixed.onnx"
        if result.files.get("mixed_model") != str(mixed_path):  # judged files are already there
            if result.mixed_model is None:
                result.mixed_model = mixed_model(ctx.graph, result.fp32_nodes)
            result.mixed_model.save(mixed_path)
            result.files["mixed_model"] = str(mixed_path)
        p = result.plan
        atomic_write_text(out_dir / "layer_precisions.txt", p.layer_precisions() + "\n")
        atomic_write_json(out_dir / "autocast_nodes_to_exclude.json", p.autocast_exclude())
        result.files["layer_precisions"] = str(out_dir / "layer_precisions.txt")
        result.files["autocast_nodes_to_exclude"] = str(out_dir / "autocast_nodes_to_exclude.json")
        r = result.renderings()
        atomic_write_text(out_dir / "commands.sh", "\n".join([
            "# Apply the trtbisect plan with the tool you deploy with.",
            "# TensorRT 10 (weak typing):", str(r["trtexec_trt10"]),
            "# TensorRT 11 (strong typing: the mixed model carries the precisions):",
            str(r["trtexec_trt11"]),
            "# Polygraphy:", str(r["polygraphy"]),
            "# ModelOpt AutoCast:", str(r["autocast"]), ""]))
        result.files["commands"] = str(out_dir / "commands.sh")
    if result.stats:
        atomic_write_json(out_dir / "layerwise.json", [s.to_json() for s in result.stats.values()])
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
    atomic_write_json(out_dir / "precision.json", result.to_json())


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
        result.verdict = "fixed" if result.fp32_nodes else "fp16_ok"
    write_outputs(result, ctx, out_dir)


# ---------------------------------------------------------------- check

@dataclass
class CheckResult:
    passed: bool
    errors: dict[str, OutputError]
    half_tensors: int
    samples: int

    def to_json(self) -> dict:
        return {"passed": self.passed, "samples": self.samples, "fp16_tensors": self.half_tensors,
                "errors": {k: v.to_json() for k, v in self.errors.items()}}


def check_mixed(mixed_path: str | Path, reference_path: str | Path, opts: Options) -> CheckResult:
    """Judge any mixed-precision ONNX against the FP32 reference model on the emulator."""
    ctx = prepare(reference_path, opts)
    problems = reference_problems(ctx)
    if problems:
        raise TrtBisectError(f"the FP32 reference is already broken: {problems[0]}",
                             EXIT_REFERENCE_INVALID)
    return judge_mixed(mixed_path, ctx, opts)


def judge_mixed(mixed_path: str | Path, ctx: Context, opts: Options) -> CheckResult:
    """The one judge of a written file: its float16 tensors rounded where produced."""
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
    judge = MixedModel(graph, opts.threads)
    errors = []
    for sample, ref in zip(ctx.samples, ctx.references):
        outs = judge.run(sample)
        errors.append(compare_outputs(ref, {k: outs[k] for k in names}, opts.tolerance))
    merged = worst(errors)
    return CheckResult(all(e.passed for e in merged.values()), merged, len(graph.half_typed),
                       len(ctx.samples))
