"""The run's samples and FP32 references as workers read them: one file per sample (local
workers) or one object-store entry per sample (Ray), never a pickled copy of the whole set
per task. A worker keeps what it read in memory up to a byte budget and reads the rest again
when a task needs it, as data/store.py does for the parent."""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

Arrays = Mapping[str, np.ndarray]
Pair = tuple[dict[str, np.ndarray], dict[str, np.ndarray]]
KEEP_BYTES = 256 << 20  # samples and references a worker keeps in memory


def _nbytes(pair: Pair) -> int:
    return sum(a.nbytes for part in pair for a in part.values())


class _Kept:
    """Pairs read once and kept while under the budget."""

    def __init__(self, budget: int = KEEP_BYTES) -> None:
        self._memory: dict[int, Pair] = {}
        self._budget = budget

    def get(self, k: int, read) -> Pair:
        got = self._memory.get(k)
        if got is None:
            got = read(k)
            if _nbytes(got) <= self._budget:
                self._memory[k] = got
                self._budget -= _nbytes(got)
        return got


class FolderData:
    """Sample k and its reference pickled as `k.pkl` in a private folder the run made (0700):
    trusted, as the parent wrote it."""

    def __init__(self, folder: str, count: int) -> None:
        self.folder, self.count = folder, count
        self._kept: _Kept | None = None

    @classmethod
    def write(cls, samples: Sequence[Arrays], references: Sequence[Arrays],
              parent: Path | None = None) -> FolderData:
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        folder = tempfile.mkdtemp(prefix="workers-", dir=parent)
        count = 0
        for k, (s, r) in enumerate(zip(samples, references)):
            path = os.path.join(folder, f"{k}.pkl")
            with open(path, "wb") as fh:
                pickle.dump(({n: np.asarray(v) for n, v in s.items()},
                             {n: np.asarray(v) for n, v in r.items()}), fh, protocol=5)
            count += 1
        return cls(folder, count)

    def __getstate__(self) -> dict[str, Any]:
        return {"folder": self.folder, "count": self.count}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.folder, self.count, self._kept = state["folder"], state["count"], None

    def _read(self, k: int) -> Pair:
        with open(os.path.join(self.folder, f"{k}.pkl"), "rb") as fh:
            return pickle.load(fh)

    def pairs(self, indices: Sequence[int]) -> Iterator[Pair]:
        if self._kept is None:
            self._kept = _Kept()
        for k in indices:
            yield self._kept.get(k, self._read)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


class ObjectData:
    """Sample k and its reference as one entry of Ray's object store each."""

    def __init__(self, refs: Sequence[Any]) -> None:
        self.refs = list(refs)
        self.count = len(self.refs)
        self._kept: _Kept | None = None

    @classmethod
    def put(cls, samples: Sequence[Arrays], references: Sequence[Arrays]) -> ObjectData:
        import ray
        return cls([ray.put(({n: np.asarray(v) for n, v in s.items()},
                             {n: np.asarray(v) for n, v in r.items()}))
                    for s, r in zip(samples, references)])

    def __getstate__(self) -> dict[str, Any]:
        return {"refs": self.refs}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.refs, self.count, self._kept = state["refs"], len(state["refs"]), None

    def _read(self, k: int) -> Pair:
        import ray
        return ray.get(self.refs[k])

    def pairs(self, indices: Sequence[int]) -> Iterator[Pair]:
        if self._kept is None:
            self._kept = _Kept()
        for k in indices:
            yield self._kept.get(k, self._read)

    def remove(self) -> None:
        self.refs = []
