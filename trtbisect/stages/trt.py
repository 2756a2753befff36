"""The TensorRT search: the emulator's plan verified on real engines, refined where they disagree.

Driven from here, beside the other searches; `backends/trt.py` only builds and runs engines
(`TrtBackend`) and `parallel/trt_pool.py` only builds them on several GPUs. The search itself
(`search/refine.emulator_then_trt`) knows neither: it is handed a check, as search.py's is. What
the run's flags say about it is one small frozen object, `TrtSearchOptions`; the judge's part
of it (tolerance and criteria) reaches the GPU workers as the run's `JudgeSettings`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from ..backends.trt import TrtBackend, latency_clock
from ..base.files import atomic_write_text
from ..base.limits import EVAL_TIMEOUT, EvalTimeout
from ..context import Options
from ..errors import TrtBisectError
from ..judge import trt_layers as tl
from ..judge.compare import Tolerance
from ..judge.criteria import Criteria
from ..judge.engine import engine_passes
from ..judge.flags import criteria_flags
from ..judge.settings import JudgeSettings, criteria_digest
from ..outputs import render
from ..parallel import trt_pool
from ..search.minimal import Check
from ..search.refine import emulator_then_trt

log = logging.getLogger(__name__)

Feeds = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class TrtSearchOptions:
    """How the TensorRT search builds and judges engines: the `--backend trt` share of a run's
    flags (`of`). `criteria` None or default: `tolerance` alone judges every output."""

    tolerance: Tolerance = field(default_factory=Tolerance)
    criteria: Criteria | None = None  # judge/criteria.py, as the emulator's judge has them
    shapes: Mapping[str, Sequence[int]] | None = None  # --shape: a dynamic input's build shape
    cache_dir: str | Path | None = None  # None: backends/trt.default_cache_dir()
    typing: str = "auto"  # auto | weak | strong (TensorRT 11 types strongly only)
    workers: int | None = None  # > 1: build on up to this many visible GPUs at once
    max_builds: int | None = None  # a bound on engines built, the FP32 reference included
    certify: bool = False  # remove every node of the final plan once more, on TensorRT
    eval_timeout: float = EVAL_TIMEOUT  # --eval-timeout: one engine execution (base/limits.py)
    # runs in each GPU worker before TensorRT is imported (tests: the fake TensorRT)
    worker_setup: Callable[[], None] | None = None

    @classmethod
    def of(cls, opts: Options) -> TrtSearchOptions:
        """The options `trtbisect run --backend trt` gives the search (context.Options: the
        whole, as they come from three of its groups, the judge, the samples' and the search's)."""
        judge = opts.judge
        return cls(tolerance=judge.tolerance, criteria=judge.criteria, shapes=opts.sample.shapes,
                   workers=opts.search.workers, eval_timeout=judge.eval_timeout)

    @property
    def judged_by(self) -> Criteria | None:
        """The criteria engines are judged by, None for trtbisect's default."""
        return None if self.criteria is None or self.criteria.default else self.criteria

    def judge(self) -> JudgeSettings:
        """The judge's settings a GPU worker rebuilds the criteria from (judge/settings.py;
        the hook files are read for their fingerprint, so only when workers start)."""
        crit = self.judged_by
        if crit is None:
            return JudgeSettings(tolerance=self.tolerance, eval_timeout=self.eval_timeout)
        return JudgeSettings(tolerance=self.tolerance, criteria_flags=tuple(criteria_flags(crit)),
                             criteria_fingerprint=criteria_digest(crit),
                             eval_timeout=self.eval_timeout)


def run_trt_search(model: onnx.ModelProto | str | Path, samples: Sequence[Feeds],
                   out_dir: str | Path, options: TrtSearchOptions = TrtSearchOptions(), *,
                   emulator_plan: Sequence[str] | None = None,
                   emulator_check: Check | None = None, candidates: Sequence[str] | None = None,
                   seeds: Iterable[str] = (), ranking: Sequence[str] = (),
                   say: Callable[[str], None] = log.info) -> tl.TrtSearchReport:
    """Emulator plan -> one TensorRT verification -> TensorRT-driven refinement if they disagree.

    Builds the FP32 reference, the all-FP16 engine and the final plan (three builds when the
    emulator and TensorRT agree), then writes the final engine, the layer map and the ONNX the
    rendered trtexec command reads into `out_dir`. The emulator's lead is its plan
    (`emulator_plan`) or a check to search with (`emulator_check`), with its `seeds` and
    `ranking`. With `options.workers` > 1 and several GPUs visible, the search's plans are
    built on up to that many GPUs at once (parallel/trt_pool.py; the same plan, trace and
    builds); `say` tells which. Every engine's outputs are judged by `options.criteria` as the
    emulator's judge does (judge/engine.py).
    """
    if not samples:
        raise TrtBisectError("the TensorRT search needs at least one input sample")
    tol = options.tolerance
    backend = TrtBackend(model, shapes=options.shapes, tolerance=tol,
                         cache_dir=options.cache_dir, typing=options.typing,
                         eval_timeout=options.eval_timeout)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        cand = list(candidates) if candidates is not None else backend.candidates()
        refs = [backend.reference(s) for s in samples]
        crit = options.judged_by
        if crit is not None:  # a typo or a misfit is a usage error before any plan is built
            crit.validate(list(refs[0]))
            crit.check_fit(refs[0])

        def trt_check(fp32: frozenset[str]) -> bool:
            return engine_passes(lambda s: backend.run(fp32, s), samples, refs, crit, tol)

        groups = tl.layer_groups(backend.engine_layers((), samples[0]), cand)
        gpus, parallel = _gpu_batch(options, backend, samples, refs, say)
        max_builds = options.max_builds
        try:
            result = emulator_then_trt(
                cand, gpus if gpus is not None else trt_check, emulator_check, emulator_plan,
                groups, seeds, ranking, certify=options.certify,
                max_trt_checks=None if max_builds is None else max(max_builds - 1, 1))
        finally:
            if gpus is not None:
                gpus.close()
                parallel = gpus.summary(parallel)
        return _report(backend, result, samples[0], out, gpus, parallel, crit)
    finally:
        backend.close()


def _report(backend: TrtBackend, result: tl.TrtPlanResult, sample: Feeds, out: Path,
            gpus: trt_pool.TrtBatch | None, parallel: dict | None,
            crit: Criteria | None) -> tl.TrtSearchReport:
    """The final plan's engine inspected, timed and written to `out`, with the commands that
    rebuild it."""
    plan = result.fp32  # not found: every candidate asked FP32 (and still failing)
    layers = backend.engine_layers(plan, sample)
    precision = tl.check_precisions(layers, plan)
    warnings = backend.warnings + tl.precision_warnings(precision)
    for w in warnings:
        log.warning(w)
    latency = {k: _latency(backend, p, sample, warnings)
               for k, p in (("fp32", None), ("fp16", frozenset()), ("final", plan))}
    onnx_name = "final_mixed.onnx" if backend.strong else "model_named.onnx"
    files = {"engine": str(backend.save_engine(out / "final.engine", plan)),
             "layer_map": str(out / "layer_map.json"),
             "onnx": str(backend.write_onnx(out / onnx_name, plan))}
    atomic_write_text(Path(files["layer_map"]), json.dumps(tl.layer_map_json(layers), indent=1))
    forced = backend.forced_layers(plan)
    trtexec, poly = _commands(files, list(forced), forced, backend.shapes, backend.strong)
    builds, hits = backend.builds, backend.cache_hits
    if gpus is not None:  # the taken plans' engines, built by the workers (the rest apart)
        builds, hits = builds + gpus.builds, hits + gpus.cache_hits
    return tl.TrtSearchReport(result, backend.trt_version, backend.strong, builds, hits,
                              latency, tl.describe_culprits(plan, layers),
                              precision, files, trtexec, poly, warnings, latency_clock(),
                              parallel, crit.describe() if crit is not None else None)


def _latency(backend: TrtBackend, plan: Collection[str] | None, sample: Feeds,
             warnings: list[str]) -> float | None:
    """The plan's median latency in ms; None where an execution ran past --eval-timeout (the
    all-FP16 engine of a Loop that FP16 never lets end)."""
    try:
        return backend.latency_ms(plan, sample)
    except EvalTimeout as exc:
        what = "the FP32 engine" if plan is None else f"the engine of {len(plan)} FP32 nodes"
        warnings.append(f"no latency for {what}: an execution ran past --eval-timeout "
                        f"{exc.seconds:g} s")
        log.warning(warnings[-1])
        return None


def _gpu_batch(options: TrtSearchOptions, backend: TrtBackend, samples: Sequence[Feeds],
               refs: Sequence[Feeds], say: Callable[[str], None],
               ) -> tuple[trt_pool.TrtBatch | None, dict | None]:
    """The GPU workers' batch (None: build in this process) and the report's `parallel`
    note, when `--workers` > 1 asks for them."""
    workers = options.workers
    if workers is None or workers <= 1:
        return None, None
    devices, why = trt_pool.choose_gpus(workers)
    say(why)
    note = {"gpus": devices, "chosen": why}
    if len(devices) <= 1:
        return None, note
    return trt_pool.start(backend, samples, refs, devices, options.judge(),
                          options.worker_setup), note


def _commands(files: Mapping[str, str], layers: Sequence[str],
              output_types: Mapping[str, Sequence[str]],
              shapes: Mapping[str, Sequence[int]] | None, strong: bool) -> tuple[str, str]:
    """trtexec and `polygraphy convert` lines rebuilding the final engine (render.py), or a
    `#` line saying why a layer name cannot be written."""
    ranges = {k: (tuple(v), tuple(v), tuple(v)) for k, v in (shapes or {}).items()}
    out = []
    for build in (
            lambda: render.trtexec_argv(files["onnx"], files["engine"], strongly_typed=strong,
                                        fp32_layers=layers, output_types=output_types,
                                        shape_ranges=ranges, profiling=True,
                                        known_names=()),
            lambda: render.polygraphy_convert_argv(files["onnx"], files["engine"],
                                                   strongly_typed=strong, fp32_layers=layers,
                                                   shape_ranges=ranges)):
        try:
            out.append(render.command_line(build()))
        except render.Unrenderable as exc:
            out.append(f"# cannot be rendered: {exc}")
    return out[0], out[1]
