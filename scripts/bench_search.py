#!/usr/bin/env python3
"""Search cost, emulator cost and memory at scale, measured (issue #10). Writes docs/search_benchmark.md.

Every model is measured in a fresh child process, so its peak RSS is that model's alone. In it:

* `trtbisect run` (pipeline.run) end to end: wall time, evaluations, the plan, peak RSS;
* a plain FP32 ONNX Runtime inference of the untouched model (a default session from the file,
  same threads) and one emulator evaluation (median over several plans: all-FP16, the run's
  plan, a random subset), in the same process, and their ratio;
* plain ddmin (search.ddmin, no prior) on the same pipeline evaluator: wall time, evaluations.

The >2 GiB external-data model is run last, alone in its child: `trtbisect run` only, then a
plain FP32 session in another child for comparison.

    python scripts/bench_search.py                 # everything (20-40 min on 2 cores)
    python scripts/bench_search.py --quick         # small sizes: a smoke test
    python scripts/bench_search.py --only demo --only deep_24 --out /tmp/t.md
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_models import synthetic_transformer, wide_matmul_stack  # noqa: E402

from tests.models.make_models import deep_model, zoo  # noqa: E402
from trtbisect import pipeline  # noqa: E402
from trtbisect.backends.ort import Reference  # noqa: E402
from trtbisect.context import Context, Options, prepare  # noqa: E402
from trtbisect.judge import semantics  # noqa: E402
from trtbisect.search.minimal import ddmin  # noqa: E402
from trtbisect.stages.evaluator import Evaluator  # noqa: E402

GB = 1e9
HEALTHY = "no planted fault: the 'FP16 is fine' case"


@dataclass
class Case:
    """One benchmark model on disk, and what to measure on it."""

    name: str
    path: str
    inputs: str  # .npz
    mode: str = "full"  # full | run (run only: the big model) | plain (FP32 session only)
    expected: list[str] | None = None  # the planted set, when known
    weight_bytes: int = 0
    note: str = ""
    more_inputs: list[str] = field(default_factory=list)  # further samples (.npz)
    options: dict = field(default_factory=dict)  # Options beyond the defaults: rtol, semantics,
    # shapes (the trust cases of scripts/bench_trust.py)


@dataclass
class Row:
    case: str
    mode: str
    nodes: int = 0
    candidates: int = 0
    verdict: str = ""
    run_s: float = 0.0
    run_evals: int = 0
    run_set: int = 0
    found_planted: bool | None = None
    mixed_passed: bool | None = None
    run_rss: float = 0.0  # peak RSS (bytes) of the child after the run, imports included
    prepare_s: float = 0.0  # load + FP32 reference, what any verdict costs at least
    plain_ms: float = 0.0  # plain FP32 ORT session, default options
    reference_ms: float = 0.0  # trtbisect's own FP32 reference session
    eval_ms: dict[str, float] = field(default_factory=dict)  # plan label -> median ms
    ratios: dict[str, float] = field(default_factory=dict)  # plan label -> median eval/plain
    evaluator_s: float = 0.0  # building the evaluator and its first (all-FP16) evaluation
    ddmin_s: float = 0.0  # prepare + evaluator + ddmin
    # what the prior and the search cost, each: the run's all-FP16 verdict, layer-wise and
    # search stages; ddmin's evaluator and search (both without loading, the reference, the
    # written plan's judgement and the files, which a plan found either way needs alike)
    run_search_s: float = 0.0
    ddmin_search_s: float = 0.0
    ddmin_evals: int = 0
    ddmin_set: int = 0
    ddmin_stopped: bool = False
    weight_bytes: int = 0
    error: str = ""
    # the certificate and the validation (issue #45): what they cost beyond the search
    aimed_evals: int = 0  # evaluations of the aimed rounds (precision.json aimed_searches)
    aim_rounds: int = 0
    certified: bool | None = None  # the written plan's certificate
    decided: str = ""  # why the certificate stopped aiming (fragile at once, allowance, ...)
    certificates: int = 0  # written plans certified (each: the variations' sessions)
    variant_judgements: int = 0  # a written plan judged on one variation over its samples
    validations: int = 0  # written plans judged on the validation samples
    validation_inferences: int = 0  # ... and the inferences that took
    validation_references: int = 0  # FP32 reference inferences of perturbed copies (once)
    validation_kind: str = ""
    validation_passed: bool | None = None
    search_samples: int = 0  # samples the search judges a plan on (an evaluation's inferences)


# ------------------------------------------------------------------ the models


def _save(work: Path, name: str, model: onnx.ModelProto, inputs: dict) -> tuple[str, str]:
    path, npz = work / f"{name}.onnx", work / f"{name}.npz"
    if not path.exists():
        onnx.save(model, path)
        np.savez(npz, **inputs)
    return str(path), str(npz)


def _inputs_npz(work: Path, name: str, inputs: dict) -> str:
    npz = work / f"{name}.npz"
    np.savez(npz, **inputs)
    return str(npz)


def cases(work: Path, quick: bool, want: Callable[[str], bool] = lambda name: True,
          trust: bool = False) -> Iterator[Case | str]:
    """Every benchmark model `want`s, written under `work`; a string notes a skipped one."""
    if want("demo"):
        yield Case("demo", str(ROOT / "models" / "demo.onnx"),
                   str(ROOT / "models" / "demo_inputs.npz"))
    for name, z in zoo().items():
        if want(f"zoo/{name}"):
            yield Case(f"zoo/{name}", *_save(work, f"zoo_{name}", z.model, z.inputs),
                       expected=sorted(z.expected_fp32))
    blocks, sites = (12, (3, 9)) if quick else (24, (2, 11, 20))
    for label, bad in ((f"deep_{blocks}", sites), (f"deep_{blocks}_healthy", ())):
        if want(label):
            z = deep_model(blocks=blocks, overflow_blocks=bad)
            yield Case(label, *_save(work, label, z.model, z.inputs),
                       expected=sorted(z.expected_fp32), note="" if bad else HEALTHY)
    sizes = (500,) if quick else (500, 1300, 5000, 20000)
    healthy = sizes[-1] if quick else 5000
    for n, faults in [*((n, 2) for n in sizes), (healthy, 0)]:
        label = f"transformer_{n}" + ("" if faults else "_healthy")
        if want(label):
            m = synthetic_transformer(n, faults=faults)
            yield Case(label, *_save(work, label, m.model, m.inputs),
                       expected=sorted(m.expected_fp32), note="" if faults else HEALTHY)
    yield from _real_models(work, quick, want)
    if trust:
        yield from _trust_cases(work, want)
    size, label = (4e6, "wide_4MB") if quick else (2.5e9, "wide_2.5GB")
    if want(label):
        w = wide_matmul_stack(size, work / label)
        npz = _inputs_npz(work, label, w.inputs)
        note = f"{w.blocks} blocks of width {w.width}, external data"
        yield Case(label, str(w.path), npz, "run", sorted(w.expected_fp32), w.weight_bytes, note)
        yield Case(label, str(w.path), npz, "plain", weight_bytes=w.weight_bytes, note=note)


def _real_models(work: Path, quick: bool, want: Callable[[str], bool]) -> Iterator[Case | str]:
    names = [n for n in ("ppocr_det", "ppocr_rec") if want(n)]
    if quick or not names:
        return
    try:
        from fetch_models import MODELS, FetchError, fetch
    except ImportError as exc:  # pragma: no cover - the script ships beside this one
        yield f"real models skipped: {exc}"
        return
    for name in names:
        try:
            path = fetch(name, quiet=True)
        except (FetchError, OSError) as exc:
            yield f"{name} skipped: not fetchable offline ({str(exc).splitlines()[0]})"
            continue
        yield Case(name, str(path), _inputs_npz(work, name, MODELS[name].make_inputs(seed=0)))


def _trust_cases(work: Path, want: Callable[[str], bool]) -> Iterator[Case | str]:
    """The cases of scripts/bench_trust.py (issue #32's six, less the demo, measured above):
    the real page and its views, silero-vad's streamed chunks at rtol 1e-4, magika and
    MiniLM-L3 on seeded random inputs, and PP-OCRv5 rec on a line of text (#45: class
    probabilities judged by max|d|). Their plans pass near their bounds: the certificate's
    aimed rounds and the validation are exercised here."""
    try:
        import bench_trust
        from fetch_models import FetchError, fetch
    except ImportError as exc:  # pragma: no cover - the scripts ship beside this one
        yield f"trust cases skipped: {exc}"
        return
    try:
        det = str(fetch("ppocr_det", quiet=True))
        if want("trust/det_1"):
            (page,) = bench_trust._det_samples(work, 1)
            yield Case("trust/det_1", det, page)
        if want("trust/det_3"):
            first, *rest = bench_trust._det_samples(work, 3)
            yield Case("trust/det_3", det, first, more_inputs=rest)
        if want("trust/silero_if"):
            first, *rest = bench_trust._silero_samples(work)
            yield Case("trust/silero_if", str(fetch("silero_vad_if", quiet=True)), first,
                       more_inputs=rest, options={"rtol": 1e-4})
        if want("trust/magika"):
            yield Case("trust/magika", str(fetch("magika", quiet=True)), "",
                       options={"shapes": {"bytes": [1, 2048]}})
        if want("trust/v5rec"):  # issue #45's borderline output: class probabilities
            from page_image import line_input
            line = work / "line.npz"
            np.savez(line, x=line_input())
            yield Case("trust/v5rec", str(fetch("ppocrv5_rec", quiet=True)), str(line))
        if want("trust/minilm_strict"):
            yield Case("trust/minilm_strict", str(fetch("minilm_l3", quiet=True)), "",
                       options={"semantics": "strict",
                                "shapes": {"input_ids": [1, 64], "attention_mask": [1, 64]}})
    except (FetchError, OSError) as exc:
        yield f"trust cases skipped: not fetchable offline ({str(exc).splitlines()[0]})"


def _options(case: Case, threads: int) -> Options:
    from trtbisect.judge.compare import Tolerance

    rest = dict(case.options)
    if "rtol" in rest:
        rest["tolerance"] = Tolerance(rtol=rest.pop("rtol"))
    if "shapes" in rest:
        rest["shapes"] = {k: tuple(v) for k, v in rest["shapes"].items()}
    given = [p for p in (case.inputs, *case.more_inputs) if p]
    return Options.of(inputs=given, threads=threads, **rest)


# ------------------------------------------------------------------ measuring, in the child


def timed(fn: Callable[[], object], repeat: int, budget_s: float = 5.0) -> float:
    """Median seconds of `fn` after one warm-up call; fewer samples (>= 3) when it is slow."""
    fn()
    samples: list[float] = []
    while len(samples) < repeat and (len(samples) < 3 or sum(samples) < budget_s):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def timed_pair(plain: Callable[[], object], other: Callable[[], object], repeat: int,
               budget_s: float = 10.0, block: int = 5) -> tuple[float, float, float]:
    """Median seconds of each, and the median of their ratio other / plain per round: a round
    times a block of warm runs of each (warm: an alternation run by run would have each evict
    the other's caches, which a search's back-to-back evaluations do not do), so the
    machine's drift between minutes hits both alike."""
    a: list[float] = []
    b: list[float] = []
    ratios: list[float] = []
    spent = 0.0
    while len(ratios) < max(3, repeat // block) and (len(ratios) < 3 or spent < budget_s):
        medians = []
        for fn, out in ((plain, a), (other, b)):
            fn()
            runs = []
            for _ in range(block):
                t = time.perf_counter()
                fn()
                runs.append(time.perf_counter() - t)
            out.extend(runs)
            spent += sum(runs)
            medians.append(statistics.median(runs))
        ratios.append(medians[1] / medians[0])
    return statistics.median(a), statistics.median(b), statistics.median(ratios)


def peak_rss() -> int:
    """Peak resident set size of this process so far, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _plain_session(path: str, threads: int):
    so = onnxruntime.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def _evaluator(ctx: Context, opts: Options,
               units: bool = True) -> Evaluator:
    """The pipeline's own evaluator (same emulator and criterion as `run`), unjournaled;
    `units=False` (ddmin, whose plans are any sets of nodes): every node switches alone."""
    return Evaluator(ctx, opts.judge, {}, None, None if units else ())


# the run's stages (pipeline.run's stages) that decide the plan: the all-FP16
# verdict, the layer-wise pass behind the prior, the search
SEARCH_STAGES = ("all-FP16 evaluation", "layer-wise comparison, FP32 vs FP16", "searching")


def emit(row: Row) -> None:
    """Print the row so far: the parent keeps the last one, even when it times the child out."""
    print("ROW " + json.dumps(asdict(row)), flush=True)


@contextlib.contextmanager
def _counting(row: Row) -> Iterator[None]:
    """Count, during the run, the written plans certified (and the variations each was judged
    on) and validated (and the validation's inferences): what the certificate and the
    validation cost beyond the search's evaluations."""
    from trtbisect.backends import ort
    from trtbisect.judge import validation
    from trtbisect.stages import written

    validate, variant_runs, pairs = written.validate, ort.variant_runs, validation.Holdout.pairs

    def counted_pairs(held):
        if held.references is None:  # the copies' FP32 references, made on first use
            row.validation_references += len(held.samples)
        return pairs(held)

    def counted_validate(judge, ctx, opts):
        out = validate(judge, ctx, opts)
        row.validations += 1
        row.validation_inferences += len(out.judgements)
        return out

    def counted_variants(*args, **kw):
        row.certificates += 1
        seen = set()
        for v, k, ref, got in variant_runs(*args, **kw):
            if v.label not in seen:
                seen.add(v.label)
                row.variant_judgements += 1
            yield v, k, ref, got

    written.validate, ort.variant_runs = counted_validate, counted_variants
    validation.Holdout.pairs = counted_pairs  # type: ignore[method-assign]
    try:
        yield
    finally:
        written.validate, ort.variant_runs = validate, variant_runs
        validation.Holdout.pairs = pairs  # type: ignore[method-assign]


def _certificate_costs(row: Row, res) -> None:
    """What precision.json says of the certificate's aimed rounds and of the validation."""
    aims = res.aimed_searches or []
    row.aimed_evals = sum(a.evaluations for a in aims)  # result.AimedSearch
    row.aim_rounds = len(aims)
    cert = res.certificate  # result.CertificateRecord, read by attribute
    row.certified = cert.certified if cert is not None else None
    row.decided = (cert.decided if cert is not None else None) or ""
    val = res.validation  # judge/validation.Validation, read by attribute
    row.validation_kind = val.kind if val is not None else ""
    row.validation_passed = val.passed if val is not None else None
    searched = res.judged.search_samples if res.judged is not None else None
    row.search_samples = len(searched or ()) or max(
        1, (res.samples or 1) - len(val.indices if val is not None else ()))


def measure(case: Case, threads: int, repeat: int, ddmin_budget: int,
            counts_only: bool = False) -> Row:
    row = Row(case.name, case.mode, weight_bytes=case.weight_bytes)
    feeds: dict = {}
    if case.inputs:
        with np.load(case.inputs) as d:
            feeds = {k: d[k] for k in d.files}
    if case.mode == "plain":
        t = time.perf_counter()
        sess = _plain_session(case.path, threads)
        row.prepare_s = time.perf_counter() - t
        row.plain_ms = 1e3 * timed(lambda: sess.run(None, feeds), repeat)
        row.run_rss = peak_rss()
        return row
    opts = _options(case, threads)
    with tempfile.TemporaryDirectory() as tmp, _counting(row):
        t = time.perf_counter()
        res = pipeline.run(case.path, opts, Path(tmp) / "out")
        row.run_s = time.perf_counter() - t
    _certificate_costs(row, res)
    row.run_search_s = sum(s["seconds"] for s in (res.stages or [])
                           if s["stage"].startswith(SEARCH_STAGES))
    row.run_rss = peak_rss()
    row.nodes, row.candidates, row.verdict = res.nodes, res.candidates, res.verdict
    row.run_evals, row.run_set, row.mixed_passed = res.evaluations, len(res.fp32_nodes), \
        res.mixed_model_passed
    if case.expected is not None and res.verdict in ("fixed", "fp16_ok"):
        row.found_planted = sorted(res.fp32_nodes) == case.expected
    if case.mode == "run" or res.verdict == "reference_invalid":
        return row
    emit(row)
    if not counts_only and feeds:
        _emulator_cost(row, case, opts, feeds, frozenset(res.fp32_nodes), threads, repeat)
        emit(row)
    if ddmin_budget <= 0:  # --ddmin-budget 0: the run alone (ddmin's count is the code's own)
        return row
    t = time.perf_counter()
    ctx = prepare(case.path, opts)
    prepared = time.perf_counter()
    ev = _evaluator(ctx, opts, units=False)
    plain = ddmin(ctx.judged.candidates(), ev.check, max_evaluations=ddmin_budget)  # as searched
    row.ddmin_s = time.perf_counter() - t
    row.ddmin_search_s = time.perf_counter() - prepared
    row.ddmin_evals, row.ddmin_set, row.ddmin_stopped = plain.evaluations, len(plain.fp32), \
        plain.stopped_early
    return row


def _emulator_cost(row: Row, case: Case, opts: Options, feeds: dict,
                   plan: frozenset[str], threads: int, repeat: int) -> None:
    """FP32 inference vs one evaluation, in this process, same threads."""
    sess = _plain_session(case.path, threads)
    row.plain_ms = 1e3 * timed(lambda: sess.run(None, feeds), repeat)
    t = time.perf_counter()
    ctx = prepare(case.path, opts)
    row.prepare_s = time.perf_counter() - t
    ref = Reference(ctx.graph, threads)
    row.reference_ms = 1e3 * timed(lambda: ref.run(feeds), repeat)
    # 10% of the search's units (a predicted TensorRT layer, or a node), as a search's plan
    units = list(semantics.units(ctx.prepared, ctx.judged.candidates()).values()) \
        if ctx.prepared is not None else [(n,) for n in ctx.judged.candidates()]
    rng = np.random.default_rng(0)
    picked = rng.choice(len(units), size=max(1, len(units) // 10), replace=False)
    subset = frozenset(n for k in picked for n in units[k])
    plans = {"all-FP16": frozenset(), "plan": plan, "random 10%": subset}
    for label, p in plans.items():
        if label == "plan" and not p:
            continue
        # A fresh evaluator per plan: what the plan costs does not depend on what ran before
        # (an emulator may switch only the nodes that earlier plans kept in FP32).
        t = time.perf_counter()
        ev = _evaluator(ctx, opts)
        ev.emulator.run(p, feeds)
        if label == "all-FP16":
            row.evaluator_s = time.perf_counter() - t
        _, t_eval, ratio = timed_pair(lambda: sess.run(None, feeds),
                                      lambda ev=ev, p=p: ev.emulator.run(p, feeds), repeat)
        row.eval_ms[label], row.ratios[label] = 1e3 * t_eval, ratio
        ev.emulator.close()


def child(case_json: str, threads: int, repeat: int, ddmin_budget: int,
          counts_only: bool = False) -> None:
    case = Case(**json.loads(case_json))
    try:
        row = measure(case, threads, repeat, ddmin_budget, counts_only)
    except Exception as exc:  # a failure is a result too: report it in the table
        row = Row(case.name, case.mode, weight_bytes=case.weight_bytes,
                  error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        row.run_rss = peak_rss()
    emit(row)


# ------------------------------------------------------------------ the parent


def run_child(case: Case, args: argparse.Namespace) -> Row:
    cmd = [sys.executable, __file__, "--child", json.dumps(asdict(case)), "--threads",
           str(args.threads), "--repeat", str(args.repeat), "--ddmin-budget", str(args.ddmin_budget),
           *(["--counts-only"] if args.counts_only else [])]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        rows = [ln[4:] for ln in out.splitlines() if ln.startswith("ROW ")]
        row = Row(**json.loads(rows[-1])) if rows else Row(
            case.name, case.mode, weight_bytes=case.weight_bytes)
        row.error = f"timed out after {args.timeout} s" + (" (partial)" if rows else "")
        return row
    rows = [ln[4:] for ln in proc.stdout.splitlines() if ln.startswith("ROW ")]
    if not rows:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Row(case.name, case.mode, weight_bytes=case.weight_bytes,
                   error=f"exit {proc.returncode} after {time.perf_counter() - t:.0f} s: {tail}")
    return Row(**json.loads(rows[-1]))


def _s(x: float) -> str:
    return f"{x:.1f} s" if x >= 10 else f"{x:.2f} s"


def _ms(x: float) -> str:
    return f"{x:.0f} ms" if x >= 100 else f"{x:.2f} ms"


def _size(x: float) -> str:
    return f"{x / GB:.2f} GB" if x >= 0.1 * GB else f"{x / 1e6:.0f} MB"


def _yn(x: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "-"}[x]


def render(rows: list[Row], notes: list[str], args: argparse.Namespace,
           before: list[Row] | None = None) -> str:
    full = [r for r in rows if r.mode == "full" and r.eval_ms]
    lines = [
        "# Search cost, emulator cost and memory at scale",
        "",
        f"Measured by `python scripts/bench_search.py{' --quick' if args.quick else ''}` on "
        f"{datetime.date.today()}: {platform.machine()}, {os.cpu_count()} cores shared with other "
        f"jobs (its speed drifts by up to 2x between minutes: ratios are taken between alternating blocks of runs), "
        f"Python {platform.python_version()}, onnxruntime {onnxruntime.__version__}, onnx "
        f"{onnx.__version__}, {args.threads} ORT intra-op thread(s) everywhere. Every model runs "
        "in a fresh process, so its peak RSS (`ru_maxrss`, Python and imports included) is its own.",
        "",
        "Models: *demo* is models/demo.onnx; *zoo/...* the planted-fault zoo of "
        "tests/models/make_models.py; *deep_N* its `deep_model` (N pre-norm blocks, LayerNorm "
        "overflows planted in 2-3 of them; *_healthy*: none planted); *transformer_N* "
        "`synthetic_transformer(N)` of scripts/bench_models.py (about N nodes, d=64, seq=16, "
        "two planted LayerNorm overflows); *ppocr_det/rec* PP-OCRv4 from the "
        "rapidocr-onnxruntime 1.4.4 wheel (scripts/fetch_models.py, random input); *wide_...* "
        "`wide_matmul_stack` (RMSNorm + MatMul + Add + Relu blocks of width 4096, weights in "
        "one external-data file, one planted overflow).",
        "",
        "## One evaluation against one FP32 inference",
        "",
        "*plain FP32*: a default ONNX Runtime session on the untouched model file. *reference*: "
        "trtbisect's FP32 reference session. One evaluation: the pipeline's emulator running "
        "a plan, on a fresh evaluator per plan (median of warm runs, timed in blocks of 5 "
        "that alternate with blocks of plain FP32 runs); *random 10%*: a random tenth of the "
        "search's units (predicted TensorRT layers, or nodes). *ratio*: the median over the "
        "plans of the median over rounds of the block ratio evaluation / plain FP32 (both "
        "timed in the same minute: this shared machine drifts by 2x between minutes); "
        "issue #10 asks for <= 2x on "
        "models of >= 500 nodes. *evaluator build*: a new evaluator and its first, all-FP16, "
        "evaluation.",
        "",
        "| model | nodes | candidates | plain FP32 | reference | all-FP16 | the plan | random 10% "
        "| ratio | evaluator build |",
        "|" + "---|" * 10,
    ]
    for r in full:
        e = r.eval_ms
        lines.append(
            f"| {r.case} | {r.nodes} | {r.candidates} | {_ms(r.plain_ms)} | {_ms(r.reference_ms)} "
            f"| {_ms(e.get('all-FP16', 0))} | {_ms(e['plan']) if 'plan' in e else '-'} "
            f"| {_ms(e.get('random 10%', 0))} | {_ratio(r):.2f}x | {_s(r.evaluator_s)} |")
    lines += [
        "",
        "## trtbisect run against plain ddmin",
        "",
        "*run*: `pipeline.run` end to end (load, reference, layer-wise, search, final check, "
        "mixed-model check, files). *ddmin*: load + reference + evaluator + `search.ddmin` over "
        f"all candidates with the pipeline's evaluator (capped at {args.ddmin_budget} "
        "evaluations). *search*: what finding the plan costs, each way: the run's all-FP16 "
        "verdict, layer-wise and search stages (its `stages` in precision.json), against "
        "ddmin's evaluator and search; neither counts loading, the reference, the written "
        "plan's judgement, the per-node comparison or the files, which a plan found either way "
        "needs alike. *planted*: the run's set is exactly the planted fault set. *file "
        "passes*: the written mixed model passes the check.",
        "",
        "| model | verdict | run evals | set | run wall | ddmin evals | set | ddmin wall "
        "| run / ddmin | search: run | search: ddmin | search: run / ddmin | planted "
        "| file passes | peak RSS |",
        "|" + "---|" * 15,
    ]
    for r in rows:
        if r.mode != "full":
            continue
        if r.error and not r.verdict:
            lines.append(f"| {r.case} | error: {r.error} |" + " |" * 13)
            continue
        dd = (r.error or "-") if not r.ddmin_evals else (
            f"{r.ddmin_evals}{' (stopped)' if r.ddmin_stopped else ''}")
        ratio = f"{r.run_s / r.ddmin_s:.2f}x" if r.ddmin_s else "-"
        search = (f"{_s(r.run_search_s)} | {_s(r.ddmin_search_s)} | "
                  f"{r.run_search_s / r.ddmin_search_s:.2f}x") \
            if r.ddmin_search_s and r.run_search_s else "- | - | -"
        lines.append(
            f"| {r.case} | {r.verdict} | {r.run_evals} | {r.run_set} | {_s(r.run_s)} | {dd} | "
            f"{r.ddmin_set if r.ddmin_evals else '-'} | {_s(r.ddmin_s) if r.ddmin_s else '-'} | "
            f"{ratio} | {search} | {_yn(r.found_planted)} | {_yn(r.mixed_passed)} | "
            f"{_size(r.run_rss)} |")
    fine = [r for r in full if r.verdict == "fp16_ok"]
    lines += [
        "",
        "## When FP16 is fine",
        "",
        "What the verdict costs against what decides it: loading the model and running the "
        "reference (*prepare*), then building the emulator and running the all-FP16 plan "
        "once (*build + one evaluation*). Issue #10 asks that the verdict cost about that much.",
        "",
        "| model | nodes | run wall | prepare | build + one evaluation | run / (prepare + build + "
        "one evaluation) |",
        "|---|---|---|---|---|---|",
    ]
    for r in fine:
        lines.append(f"| {r.case} | {r.nodes} | {_s(r.run_s)} | {_s(r.prepare_s)} | "
                     f"{_s(r.evaluator_s)} | {r.run_s / (r.prepare_s + r.evaluator_s):.1f}x |")
    lines += _scale_section(rows)
    if before:
        lines += _comparison(before, rows)
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


CERT_BEGIN, CERT_END = "<!-- bench_certificate: begin -->", "<!-- bench_certificate: end -->"


def _validation_evals(r: Row) -> float:
    """The validation's inferences in evaluations: an evaluation judges a plan once on each
    sample the search judges on."""
    return r.validation_inferences / max(r.search_samples, 1)


def certificate_section(rows: list[Row], title: str) -> str:
    """Per model, what the certificate and the validation cost beyond the search, and the
    run's evaluations against ddmin's (issue #45 items 3 and 4), between markers that a later
    full run of this script keeps: the benchmark's models, then the trust cases (`--trust`),
    each with its totals, and the totals of both."""
    full = [r for r in rows if r.mode == "full" and r.verdict and r.verdict != "reference_invalid"]
    core = [r for r in full if not r.case.startswith("trust/")]
    trust = [r for r in full if r.case.startswith("trust/")]
    out = [CERT_BEGIN, "", f"## {title}", ""]
    for label, group in (("The benchmark's models", core), ("The trust cases", trust)):
        if not group:
            continue
        out += [f"{label}:", "",
                "| model | verdict | plan (FP32 nodes / candidates) | evaluations: search / "
                "aimed / validation | variations judged | ddmin evaluations | run / ddmin "
                "| validation | certificate |", "|" + "---|" * 9]
        out += [_certificate_row(r) for r in group] + [""]
    out += ["| models | run evaluations (against ddmin) | ddmin evaluations | run / ddmin (goal <= 1.5x) "
            "| search | aimed | validation | (aimed + validation) / search (goal <= 20%) "
            "| variations judged | (aimed + validation + variations) / search |",
            "|" + "---|" * 10]
    for label, group in (("the benchmark's", core), ("the trust cases", trust),
                         ("all", full if core and trust else [])):
        if group:
            out.append(_certificate_totals(label, group))
    return "\n".join([*out, "", CERT_END])


def _certificate_row(r: Row) -> str:
    dd = f"{r.ddmin_evals}{' (stopped)' if r.ddmin_stopped else ''}" if r.ddmin_evals \
        else (r.error or "-")
    ratio = f"{r.run_evals / r.ddmin_evals:.2f}x" if r.ddmin_evals else "-"
    val = "-" if not r.validation_kind else (
        f"{r.validation_kind}: " + {True: "passes", False: "**fails**", None: "none"}[
            r.validation_passed])
    cert = "-" if r.certified is None else "certified" if r.certified else (
        "fragile" + (f": {r.decided}" if r.decided else ""))
    return (f"| {r.case} | {r.verdict} | {r.run_set} / {r.candidates} | "
            f"{r.run_evals - r.aimed_evals} / {r.aimed_evals} / {_validation_evals(r):.3g} "
            f"({r.validations} file(s), {r.validation_inferences} inferences) | "
            f"{r.variant_judgements} | {dd} | {ratio} | {val} | {cert} |")


def _certificate_totals(label: str, group: list[Row]) -> str:
    paired = [r for r in group if r.ddmin_evals]  # against ddmin: where ddmin was measured
    run = sum(r.run_evals for r in paired)
    dd = sum(r.ddmin_evals for r in paired)
    label += f" ({len(group)})" + (f", {len(group) - len(paired)} without ddmin: run / ddmin "
                                   "over the others" if len(paired) < len(group) else "")
    search = sum(r.run_evals - r.aimed_evals for r in group)
    aimed = sum(r.aimed_evals for r in group)
    val = sum(_validation_evals(r) for r in group)
    variants = sum(r.variant_judgements for r in group)
    stopped = sum(r.ddmin_stopped for r in group)
    return (f"| {label} | {run} | {dd}{f' ({stopped} stopped)' if stopped else ''} "
            f"| {run / max(dd, 1):.2f}x | {search} | {aimed} | {val:.3g} "
            f"| {(aimed + val) / max(search, 1):.1%} | {variants} "
            f"| {(aimed + val + variants) / max(search, 1):.1%} |")


def _ratio(r: Row) -> float | None:
    """One evaluation over one plain FP32 inference: the median over the plans of the ratio
    measured in alternation (older rows: of the medians)."""
    if r.ratios:
        return statistics.median(r.ratios.values())
    return statistics.median(r.eval_ms.values()) / r.plain_ms if r.eval_ms and r.plain_ms else None


def _comparison(before: list[Row], after: list[Row]) -> list[str]:
    """Before -> after for the models measured both times (same script, older code)."""
    old = {(r.case, r.mode): r for r in before}
    out = ["", "## Before and after", "",
           "The same script on the code before the change (rows saved with `--rows`, given "
           "here with `--before`); models it did not measure are left out.", "",
           "| model | run wall | run evals | evaluation / FP32 | peak RSS |", "|---|---|---|---|---|"]

    def pair(a: str, b: str) -> str:
        return f"{a} -> {b}"

    for r in after:
        o = old.get((r.case, r.mode))
        if o is None or r.mode == "plain":
            continue
        fmt = [(lambda x: x.error[:40] if x.error else _s(x.run_s)),
               (lambda x: "-" if x.error else str(x.run_evals)),
               (lambda x: f"{_ratio(x):.2f}x" if _ratio(x) else "-"),
               (lambda x: _size(x.run_rss) if x.run_rss else "-")]
        out.append(f"| {r.case} | " + " | ".join(pair(f(o), f(r)) for f in fmt) + " |")
    return out


def _scale_section(rows: list[Row]) -> list[str]:
    big = [r for r in rows if r.mode in ("run", "plain")]
    if not big:
        return []
    out = ["", "## External data beyond one protobuf", "",
           "`trtbisect run` alone in its process on a MatMul stack whose weights live in one "
           "external-data file; a plain FP32 session on the same file, in another process, "
           "for comparison. Issue #10 asks for peak RSS <= 2.5x the weights.", "",
           "| model | weights | what | verdict | wall | peak RSS | RSS / weights |",
           "|---|---|---|---|---|---|---|"]
    for r in big:
        what = "trtbisect run" if r.mode == "run" else "plain FP32 session: load + inference"
        wall = _s(r.run_s) if r.mode == "run" else f"{_s(r.prepare_s)} + {_ms(r.plain_ms)}"
        verdict = f"error: {r.error}" if r.error else (r.verdict or "-")
        if r.mode == "run" and r.found_planted is not None:
            verdict += f", planted set {'found' if r.found_planted else 'missed'}"
        out.append(f"| {r.case} | {_size(r.weight_bytes)} | {what} | {verdict} | "
                   f"{wall if not r.error else '-'} | {_size(r.run_rss)} | "
                   f"{r.run_rss / max(r.weight_bytes, 1):.2f}x |")
    return out


def _before(args: argparse.Namespace) -> list[Row] | None:
    if not args.before:
        return None
    return [Row(**r) for r in json.loads(Path(args.before).read_text())["rows"]]


KEPT = re.compile(r"<!-- (bench_\w+): begin -->.*?<!-- \1: end -->", re.S)  # other scripts'


def write_page(path: Path, text: str) -> None:
    """The page, keeping every section other benchmark scripts write into it between their
    own markers (bench_constants.py, bench_cost.py, ...)."""
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    kept = [m.group(0) for m in KEPT.finditer(old) if m.group(0).split(" ")[1] not in text]
    if kept:
        text = text.rstrip("\n") + "\n\n" + "\n\n".join(kept) + "\n"
    path.write_text(text, encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes only: a smoke test")
    ap.add_argument("--only", action="append", default=[],
                    help="measure only this model (repeatable), e.g. --only demo --only zoo/")
    ap.add_argument("--repeat", type=int, default=50, help="timed runs per measurement (at most)")
    ap.add_argument("--threads", type=int, default=1,
                    help="ORT intra-op threads for the emulator and the FP32 baseline")
    ap.add_argument("--ddmin-budget", type=int, default=600,
                    help="ddmin's evaluation cap (0: no ddmin)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per model before giving up")
    ap.add_argument("--workdir", help="where generated models go (default: a temporary folder)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "search_benchmark.md"))
    ap.add_argument("--rows", help="also save the raw rows as JSON here")
    ap.add_argument("--from-rows", help="only render the markdown from rows saved by --rows "
                    "(with --certificate-section: several files, comma-separated)")
    ap.add_argument("--before", help="rows saved by --rows on older code: add a before/after table")
    ap.add_argument("--note", action="append", default=[],
                    help="a line for the doc's notes (repeatable), e.g. what the --before run skipped")
    ap.add_argument("--skip", action="append", default=[],
                    help="leave out the models whose name starts with this (repeatable), e.g. "
                         "--skip transformer_20000 --skip wide_")
    ap.add_argument("--trust", action="store_true",
                    help="also the cases of scripts/bench_trust.py (trust/...): plans near "
                         "their bounds, where the certificate aims and validates")
    ap.add_argument("--counts-only", action="store_true",
                    help="evaluations only: no emulator timing (the run and ddmin still run)")
    ap.add_argument("--certificate-section", metavar="TITLE",
                    help="with --from-rows: print only the certificate's and validation's "
                         "section (issue #45) under this title")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.threads, args.repeat, args.ddmin_budget, args.counts_only)
    if args.from_rows and args.certificate_section:
        rows = [Row(**r) for f in args.from_rows.split(",")
                for r in json.loads(Path(f).read_text())["rows"]]
        return print(certificate_section(rows, args.certificate_section))
    if args.from_rows:
        saved = json.loads(Path(args.from_rows).read_text())
        text = render([Row(**r) for r in saved["rows"]], saved["notes"] + args.note, args,
                      _before(args))
        write_page(Path(args.out), text)
        return print(text)
    with tempfile.TemporaryDirectory(prefix="trtbisect-bench-") as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        rows, notes = [], []

        def want(name: str) -> bool:
            return (not args.only or any(name.startswith(o) for o in args.only)) and not any(
                name.startswith(o) for o in args.skip)

        for case in cases(work, args.quick, want, args.trust):
            if isinstance(case, str):
                notes.append(case)
                continue
            print(f"[bench] {case.name} ({case.mode}) ...", file=sys.stderr, flush=True)
            rows.append(run_child(case, args))
            print(f"[bench]   {json.dumps(asdict(rows[-1]))}", file=sys.stderr, flush=True)
            if args.rows:  # after every model, so a long run that dies keeps what it measured
                Path(args.rows).write_text(json.dumps(
                    {"rows": [asdict(r) for r in rows], "notes": notes}, indent=1))
    text = render(rows, notes + args.note, args, _before(args))
    write_page(Path(args.out), text)
    print(text)


if __name__ == "__main__":
    main()
