"""Samples and their FP32 reference outputs as sequences that stream.

A `SampleSet` reads its sources once (data/sources.py), validating every sample and hashing
them for the resume fingerprint in that one pass, and keeps what it read in memory only up to
a byte budget; past it, a sample is read again from its file when asked for, or, when it came
from a data loader or a JSON document, from a copy spooled to disk. The references are
computed one sample at a time and kept the same way, each cached on disk under --out/.cache
by a key of the model, the sample and the thread count, so a resumed run recomputes only what
it lacks. A 1,000-sample set never sits in memory at once; a set under the budget behaves as
the in-memory lists it replaces.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import overload

import numpy as np

from ..base import cache as result_cache
from ..base.limits import DEFAULT as DEFAULT_LIMITS
from ..base.limits import Limits, Meter, memory_limit
from ..errors import TrtBisectError
from .inputs import read_npz
from .sources import Item

log = logging.getLogger(__name__)

Arrays = dict[str, np.ndarray]


def default_budget() -> int:
    """Bytes of samples (and, separately, of references) held in memory."""
    return min(256 << 20, memory_limit() // 8)


def update_hash(h, sample: Mapping[str, np.ndarray]) -> None:
    """The resume fingerprint's hash of one sample (context.samples_hash: every sample's)."""
    for k in sorted(sample):
        h.update(k.encode())
        h.update(str(sample[k].dtype).encode() + str(sample[k].shape).encode())
        h.update(np.ascontiguousarray(sample[k]).tobytes())


def spool_meter(limits: Limits = DEFAULT_LIMITS) -> Meter:
    """The bytes a run may spool (samples and references together): --max-spool-bytes."""
    return Meter(limits.spool_bytes, "--max-spool-bytes", "samples and outputs spooled to disk")


class _Spool:
    """One .npz per index in a folder of its own, removed with its owner; every byte counted
    against `meter` before it is written."""

    def __init__(self, owner: object, parent: Path | None, prefix: str,
                 meter: Meter | None = None) -> None:
        self._owner, self._parent, self._prefix = weakref.ref(owner), parent, prefix
        self.folder: Path | None = None
        self.meter = meter or spool_meter()

    def write(self, k: int, arrays: Mapping[str, np.ndarray]) -> Path:
        from ..base.files import npz_bytes
        data = npz_bytes(arrays)
        self.meter.add(len(data), f"{self._prefix.rstrip('-')} {k}")
        if self.folder is None:
            if self._parent is not None:
                self._parent.mkdir(parents=True, exist_ok=True)
            self.folder = Path(tempfile.mkdtemp(prefix=self._prefix, dir=self._parent))
            owner = self._owner()
            if owner is not None:
                weakref.finalize(owner, shutil.rmtree, self.folder, True)
        path = self.folder / f"{k:07d}.npz"
        _write_bytes(path, data)
        return path


def _write_bytes(path: Path, data: bytes) -> None:
    from ..base.files import atomic_write

    def write(tmp: str) -> None:
        Path(tmp).write_bytes(data)
    atomic_write(path, write)


def _read(path: Path) -> Arrays:
    return read_npz(path)


class _Stored(Sequence[Arrays]):
    """Per index a dict of arrays: held while under the budget, else read back on demand."""

    def __init__(self, budget: int) -> None:
        self._budget, self._used = budget, 0
        self._memory: dict[int, Arrays] = {}
        self._reload: list[Callable[[], Arrays]] = []

    def _add(self, arrays: Arrays, reload: Callable[[], Arrays] | None,
             spool: Callable[[int, Arrays], Path]) -> None:
        k = len(self._reload)
        size = sum(a.nbytes for a in arrays.values())
        if self._used + size <= self._budget:
            self._memory[k] = arrays
            self._used += size
        if reload is None and k not in self._memory:
            path = spool(k, arrays)
            reload = lambda path=path: _read(path)  # noqa: E731
        self._reload.append(reload or (lambda: self._memory[k]))

    def __len__(self) -> int:
        return len(self._reload)

    @overload
    def __getitem__(self, k: int) -> Arrays: ...

    @overload
    def __getitem__(self, k: slice) -> list[Arrays]: ...

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(k)
        got = self._memory.get(k)
        return got if got is not None else self._reload[k]()

    def __iter__(self) -> Iterator[Arrays]:
        for k in range(len(self)):
            yield self[k]

    def view(self, indices: Sequence[int]) -> View:
        return View(self, indices)

    @property
    def in_memory(self) -> int:
        return len(self._memory)


class View(Sequence[Arrays]):
    """Some of a stored sequence's items, in the given order (the search's subset)."""

    def __init__(self, base: Sequence[Arrays], indices: Sequence[int]) -> None:
        self.base, self.indices = base, list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self.base[i] for i in self.indices[k]]
        return self.base[self.indices[k]]

    def __iter__(self) -> Iterator[Arrays]:
        for i in self.indices:
            yield self.base[i]


class SampleSet(_Stored):
    """Every sample, validated and hashed in one streaming pass over `items`."""

    def __init__(self, items: Iterable[Item], budget: int | None = None,
                 spool: Path | None = None, limits: Limits = DEFAULT_LIMITS) -> None:
        super().__init__(default_budget() if budget is None else budget)
        self.spooled = spool_meter(limits)  # shared with the references (reference_set)
        self._spool = _Spool(self, spool, "samples-", self.spooled)
        self.where: list[str] = []
        self.digests: list[str] = []  # per sample: the references' cache key
        total = Meter(limits.total_input_bytes, "--max-input-bytes", "the samples")
        h = hashlib.sha256()
        for item in items:
            total.add(sum(a.nbytes for a in item.sample.values()), item.where)
            update_hash(h, item.sample)
            one = hashlib.sha256()
            update_hash(one, item.sample)
            self.digests.append(one.hexdigest())
            self.where.append(item.where)
            self._add(item.sample, item.reload, self._spool.write)
        if not self.where:
            raise TrtBisectError("no samples to judge on: give --inputs, a data loader, or "
                                 "--samples N for random data")
        self.sha256 = h.hexdigest()


class ReferenceSet(_Stored):
    """The FP32 reference outputs, one dict per sample, computed as they are first needed
    and cached per sample under `cache` (when given)."""

    def __init__(self, budget: int | None = None, spool: Path | None = None,
                 meter: Meter | None = None) -> None:
        super().__init__(default_budget() if budget is None else budget)
        self._spool = _Spool(self, spool, "references-", meter)

    def add(self, outputs: Arrays, cached: Path | None) -> None:
        names = list(outputs)
        self._add(outputs, (lambda: _reload(cached, names)) if cached is not None else None,
                  self._spool.write)


def _cached(path: Path, names: Sequence[str]) -> Arrays | None:
    """The outputs cached at `path` when it holds exactly what its hash says, and every
    output; else None (recomputed)."""
    got = result_cache.load_arrays(path)
    if got is None or not set(names) <= set(got):
        return None
    return {n: got[n] for n in names}


def _reload(path: Path, names: Sequence[str]) -> Arrays:
    got = _cached(path, names)
    if got is None:
        raise TrtBisectError(f"the cached reference outputs {path} changed during the run")
    return got


def reference_set(graph, samples: SampleSet, threads: int | None, model_sha: str,
                  cache: Path | None, spool: Path | None = None, meter: Meter | None = None
                  ) -> ReferenceSet:
    """Every sample's FP32 outputs (the model as given, ORT CPU), one sample at a time; an
    output set where every output of every sample is empty is refused (nothing to judge).
    `meter`: the --max-spool-bytes count the samples began (default: the samples')."""
    from ..backends.ort import Reference

    names = graph.output_names()
    refs = ReferenceSet(spool=spool, meter=meter or getattr(samples, "spooled", None))
    ref = None
    judged_elements = 0
    for k, sample in enumerate(samples):
        key = hashlib.sha256(json.dumps({"model": model_sha, "sample": samples.digests[k],
                                         "threads": threads}).encode()).hexdigest()[:24]
        path = cache / "references" / f"{key}.npz" if cache is not None else None
        outs = _cached(path, names) if path is not None else None
        if outs is None:
            ref = ref or Reference(graph, threads)
            outs = ref.run(sample)
            if path is not None:
                try:  # hash-checked, written without following links (base/cache.py)
                    result_cache.save_arrays(path, outs)
                except (OSError, TrtBisectError) as exc:  # a cache: never fail the run over it
                    log.info("reference outputs not cached: %s", exc)
                    path = None
        elif k == 0 and path is not None:
            log.info("reference outputs reused from %s", path.parent)
        judged_elements += sum(int(np.size(v)) for v in outs.values())
        refs.add(outs, path if path is not None and path.is_file() else None)
    if ref is not None:
        ref.close()
    if judged_elements == 0:
        raise TrtBisectError(f"every output of the model ({', '.join(names)}) is empty on every "
                             "sample: there is nothing to judge; give inputs for which some "
                             "output has elements")
    return refs
