"""The layer-wise comparison: every stored float tensor of the judged graph, FP32 against the
low-precision side (all-FP16 or a plan applied), reduced to statistics tensor by tensor.

Both sides expose one batch of tensors at a time under the memory budget, and only the
statistics are kept: a 20k-node model's tensors never sit in memory together.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from ..backends.ort import Emulator, Reference
from ..base import cache as result_cache
from ..base.limits import EvalTimeout
from ..context import Context, JudgeOptions, SearchOptions
from ..data.inputs import Sample
from ..errors import TrtBisectError
from ..graph import Graph, structure
from ..judge.compare import TensorStats, merge_stats, tensor_stats
from ..judge.precision import FP16, Precision

log = logging.getLogger(__name__)


def layerwise(ctx: Context, judge: JudgeOptions, search: SearchOptions,
              progress: Callable[[int, int], None] | None = None,
              plan: frozenset[str] = frozenset(),
              fp16_first: Sequence[Mapping[str, np.ndarray]] = (),
              batches: list[list[str]] | None = None) -> dict[str, TensorStats]:
    """Statistics of every stored float tensor, FP32 vs FP16 (all-FP16, or `plan` applied),
    worst over all samples (`judge`: its threads; `search`: its memory budget).

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
    batches = batches or layerwise_batches(ctx, search)
    total, done = sum(len(b) for b in batches), 0
    for k, batch in enumerate(batches):
        # one session at a time: ONNX Runtime holds its own copy of the weights in each
        ref = Reference(g, judge.threads)
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
            emu = Emulator(g, judge.threads, expose=batch, active=plan, rules=ctx.rules)
            for s, a in zip(ctx.samples, fp32):
                try:
                    b = emu.run_tensors_for(plan, s, batch)
                except EvalTimeout as exc:  # statistics only: the sample adds none
                    log.warning("the layer-wise comparison skips a sample: %s", exc)
                    continue
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


def layerwise_batches(ctx: Context, search: SearchOptions) -> list[list[str]]:
    """The stored tensors in the batches `layerwise` exposes: each side of a batch, held for
    every sample while the other side runs one sample, fits the memory budget."""
    return _batches(ctx.judged, ctx.samples[0], search.memory_budget // (len(ctx.samples) + 1))


def cached_layerwise(ctx: Context, judge: JudgeOptions, search: SearchOptions,
                     cache: Path | None, fingerprint: dict,
                     progress: Callable[[int, int], None] | None,
                     fp16_first: Sequence[Mapping[str, np.ndarray]] = (),
                     batches: list[list[str]] | None = None) -> dict[str, TensorStats]:
    """The layer-wise statistics, reused when a resumed run has the same fingerprint
    (`cache`: the output folder's cache, None when nothing is reused or kept)."""
    path = None
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
    stats = layerwise(ctx, judge, search, progress, fp16_first=fp16_first, batches=batches)
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
