"""Derived weight arrays kept on disk, not in anonymous memory.

ONNX Runtime copies every initializer it is given into its own buffers, so an array the Python
side also holds counts twice. Arrays trtbisect derives from the weights (FP16-rounded copies,
float32 views of float16 weights, TF32-rounded copies) are therefore written once to a private
temporary file and memory-mapped; after each session is built, `release_pages` hands their
pages (and those of the model's own memory-mapped external data) back to the kernel. The
mapping stays valid, so a later rebuild simply reads the file again. Peak memory is then about
the weights ONNX Runtime holds for the sessions alive at the time, not that plus our copies.
"""

from __future__ import annotations

import atexit
import mmap
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

SPILL_BYTES = 1 << 20  # smaller arrays stay in memory: not worth a file

_folder: Path | None = None
_count = 0


PREFIX = "trtbisect-weights-"


def _dir() -> Path:
    global _folder
    if _folder is None:
        _sweep()
        _folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
        atexit.register(shutil.rmtree, _folder, True)
    return _folder


def _sweep() -> None:
    """Remove the folders of runs that were killed before their exit handler ran (SIGKILL):
    weights of a big model would otherwise stay behind in the temp folder."""
    for old in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        pid = old.name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to touch
        return True
    return True


def spill(arr: np.ndarray) -> np.ndarray:
    """`arr` as a read-only memory map of a private file (small arrays are returned as is)."""
    global _count
    if arr.nbytes < SPILL_BYTES:
        return arr
    _count += 1
    path = _dir() / f"{_count}.bin"
    np.ascontiguousarray(arr).tofile(path)
    return np.memmap(path, dtype=arr.dtype, mode="c", shape=arr.shape)


def release_pages(arrays: Iterable[np.ndarray]) -> None:
    """Drop the resident pages of memory-mapped arrays (no-op for ordinary arrays)."""
    seen: set[int] = set()
    for a in arrays:
        m = _mapping(a)
        if m is not None and id(m) not in seen:
            seen.add(id(m))
            try:
                m.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError, AttributeError):  # not supported: keep the pages
                pass


def _mapping(a: np.ndarray) -> mmap.mmap | None:
    at: np.ndarray | None = a
    while at is not None:
        m = getattr(at, "_mmap", None)
        if isinstance(m, mmap.mmap):
            return m
        at = at.base if isinstance(at.base, np.ndarray) else None
    return None
