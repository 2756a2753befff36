"""What a resumed run reuses from `--out/.cache` (the FP32 reference outputs, the layer-wise
statistics), each file holding the sha256 of what it holds, checked on every read.

A cache file that is damaged, edited, cut short, from an older format, or anything but a
regular file (a link, a pipe) is not trusted: the caller recomputes it. The hash catches damage
and edits, not someone who recomputes it (as the journal's checksum); the key in the file's name
already ties it to the model, the samples and the options.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TrtBisectError
from . import files

log = logging.getLogger(__name__)

HASH_KEY = "__sha256__"


def _arrays_hash(arrays: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(json.dumps([name, a.dtype.str, list(a.shape)]).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def save_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """An .npz of `arrays` and their hash."""
    members: dict[str, Any] = {**arrays,
                               HASH_KEY: np.frombuffer(_arrays_hash(arrays).encode(), np.uint8)}

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, **members)
    files.atomic_write(path, write)


def load_arrays(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays, when the file is there and holds exactly what its hash says; else None."""
    try:
        fd = files.open_in_place(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except (OSError, TrtBisectError) as exc:
        _rejected(path, str(exc))
        return None
    try:
        with os.fdopen(fd, "rb") as fh, np.load(fh, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        _rejected(path, "not a readable .npz")
        return None
    digest = arrays.pop(HASH_KEY, None)
    if digest is None or digest.dtype != np.uint8 or bytes(digest) != _arrays_hash(arrays).encode():
        _rejected(path, "its contents do not match their hash")
        return None
    return arrays


def save_records(path: Path, rows: list[dict]) -> None:
    """A JSON list of flat records, one a line, with their hash."""
    body = [json.dumps(r, sort_keys=True) for r in rows]
    digest = hashlib.sha256("\n".join(body).encode()).hexdigest()
    text = ('{"sha256": "' + digest + '", "rows": [\n' + ",\n".join(body) + "\n]}\n")

    def write(tmp: str) -> None:
        Path(tmp).write_text(text, encoding="utf-8")
    files.atomic_write(path, write)


def load_records(path: Path) -> list[dict] | None:
    data = _read(path)
    if data is None:
        return None
    try:
        doc = json.loads(data.decode("utf-8"))
        rows = doc["rows"]
        body = [json.dumps(r, sort_keys=True) for r in rows]
        ok = doc["sha256"] == hashlib.sha256("\n".join(body).encode()).hexdigest()
    except (ValueError, KeyError, TypeError, AttributeError):
        _rejected(path, "not a cache file of this version")
        return None
    if not ok or not all(isinstance(r, dict) for r in rows):
        _rejected(path, "its contents do not match their hash")
        return None
    return rows


def _read(path: Path) -> bytes | None:
    try:
        return files.read_in_place(path)
    except (OSError, TrtBisectError) as exc:
        _rejected(path, str(exc))
        return None


def _rejected(path: Path, why: str) -> None:
    log.warning("cache %s is not trusted (%s); recomputing it", path, why)
    return None
