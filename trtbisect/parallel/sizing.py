"""How many workers: the cores this process may use, bounded by memory.

A worker holds one emulator session: its FP16-rounded weights beside the FP32 ones it switches
to (about twice the weights; ONNX Runtime reads both by reference, without a copy), the
session's activations (a small multiple of the largest tensors of one inference) and the
interpreter with numpy, onnx and ONNX Runtime loaded. The pool takes at most `MEMORY_SHARE` of
the memory available when it starts (the parent keeps the rest: its graph, the samples and
the judge of the written file).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

BASE_BYTES = 200 << 20  # measured: a worker with a tiny model (docs/search_benchmark.md)
WEIGHT_COPIES = 2  # the rounded weights and the FP32 ones a switch reads
ACTIVATION_COPIES = 4  # live tensors of one inference, in units of the largest ones
MEMORY_SHARE = 0.6


@dataclass(frozen=True)
class WorkerPlan:
    workers: int
    threads: int | None  # each worker's ORT intra-op threads (the judge's)
    per_worker: int  # estimated bytes of one worker
    available: int  # bytes of memory available when the pool was sized
    cores: int
    why: str  # one line for stderr


def cores() -> int:
    """The cores this process may run on (its affinity, a container's limit included)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def available_memory() -> int:
    """Bytes of memory the kernel says are available (MemAvailable), else half of it all."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    from ..base.limits import memory_limit
    return memory_limit()


def worker_bytes(weights: int, activations: int) -> int:
    """Estimated peak memory of one worker: `weights` bytes of weights, `activations` bytes
    of the largest tensors one inference holds at once."""
    return BASE_BYTES + WEIGHT_COPIES * weights + ACTIVATION_COPIES * activations


def plan_workers(requested: int | None, threads: int | None, weights: int, activations: int,
                 *, ncores: int | None = None, available: int | None = None) -> WorkerPlan:
    """`requested` workers (None: as many as the cores and the memory allow), each running
    `threads` intra-op threads."""
    ncores = cores() if ncores is None else ncores
    available = available_memory() if available is None else available
    per = worker_bytes(weights, activations)
    fit = max(1, int(MEMORY_SHARE * available) // per)
    by_cores = max(1, ncores // max(threads or 1, 1))
    if requested is not None:
        n = requested
        why = f"{n} worker{'s' if n != 1 else ''} as asked"
        if n > fit:
            why += (f" (each needs about {_mib(per)}; {_mib(available)} available: "
                    f"{fit} would fit)")
    else:
        n = min(by_cores, fit)
        why = (f"{n} worker{'s' if n != 1 else ''}: {ncores} core{'s' if ncores != 1 else ''}"
               + (f" at {threads} threads each" if threads and threads > 1 else "")
               + f", each about {_mib(per)} of {_mib(available)} available")
    return WorkerPlan(n, threads, per, available, ncores, why)


def _mib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n >> 20} MiB"
