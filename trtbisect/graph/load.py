"""Reading a model file: clear one-line errors for what cannot be read, external data
checked (safe location, present, within this machine's memory) before anything reads it,
the file and its data hashed, and the run's own copy made (repair.py)."""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper

from ..errors import TrtBisectError, first_line
from .control_flow import walk_graphs
from .repair import own_copy


def load_model(path: str | os.PathLike, min_opset: int = 1,
               shapes: Mapping[str, Sequence[int]] | None = None,
               notes: list[str] | None = None) -> onnx.ModelProto:
    """Load and validate an ONNX file, weights left where they are, as trtbisect's own copy
    (repair.py: what ONNX Runtime runs but the checker or the run's copies refuse is mended;
    `notes` gets a phrase per change). `min_opset`: the opset the copies need (13 for BF16).

    External data stays on disk (the returned proto points at it; `Graph.from_path` maps it), so
    a model of any size, beyond protobuf's 2 GiB too, loads in the memory of its graph alone.
    Every failure is a one-line TrtBisectError.
    """
    p = Path(path)
    if not p.is_file():
        raise TrtBisectError(f"model file not found: {p}")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except (DecodeError, RuntimeWarning, ValueError, UnicodeDecodeError) as exc:
        raise TrtBisectError(f"{p} is not a readable ONNX model (truncated or corrupt?): "
                             f"{first_line(exc)}") from exc
    except OSError as exc:
        raise TrtBisectError(f"cannot read {p}: {exc.strerror or exc}") from exc
    if not model.graph.node and not model.graph.output:
        raise TrtBisectError(f"{p} is not a readable ONNX model (empty graph: truncated?)")
    external = [t for g in walk_graphs(model.graph) for t in g.initializer  # bodies' too
                if t.data_location == TensorProto.EXTERNAL]
    for t in external:
        _check_external(p, t)
    check_weight_sizes(p, external)  # before anything reads (or hashes) the data
    problem = None
    try:
        # by path: the checker reads the file itself and never needs the weights in one proto
        onnx.checker.check_model(str(p))
    except (onnx.checker.ValidationError, ValueError, OSError) as exc:
        problem = first_line(exc)
    model, changed = own_copy(model, p, min_opset, shapes, problem)
    if notes is not None:
        notes.extend(changed)
    return model


def _check_external(model_path: Path, t: TensorProto) -> None:
    info = {e.key: e.value for e in t.external_data}
    where = info.get("location", "")
    data = model_path.parent / where
    need = int(info.get("offset", 0) or 0) + int(info.get("length", 0) or 0)
    if not where or Path(where).is_absolute() or ".." in Path(where).parts:
        raise TrtBisectError(f"{model_path}: initializer {t.name!r} has an unsafe external-data "
                             f"location {where!r}; keep the data files beside the model")
    if not data.is_file() or data.stat().st_size < need:
        raise TrtBisectError(f"{model_path} keeps weights in external data that could not be read "
                             f"({where!r} for {t.name!r} is missing or too short); keep the data "
                             "files beside the model")


def physical_memory() -> int:
    """Bytes of this machine's memory."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 1 << 34


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"


def tensor_bytes(t: TensorProto) -> int:
    """Bytes a tensor holds, from its declared dims and element type."""
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 1
    return math.prod(int(d) for d in t.dims) * itemsize


def check_weight_sizes(path: Path, external: list[TensorProto]) -> None:
    """Refuse, before 100 GB are hashed or mapped, external weights this machine cannot hold:
    ONNX Runtime copies every initializer it is given, so each must fit in memory, and so must
    all of them together. The error names the tensor and its size."""
    if not external:
        return
    memory = physical_memory()
    sizes = sorted(((tensor_bytes(t), t) for t in external), key=lambda x: -x[0])
    biggest, t = sizes[0]
    where = next((e.value for e in t.external_data if e.key == "location"), "?")
    total = sum(n for n, _ in sizes)
    if biggest > memory:
        raise TrtBisectError(f"{path}: initializer {t.name!r} holds {_gib(biggest)} of external "
                             f"data (in {where!r}), more than this machine's {_gib(memory)} of "
                             "memory; ONNX Runtime copies every weight it is given, so this model "
                             "cannot be judged here")
    if total > memory:
        raise TrtBisectError(f"{path}: its external weights total {_gib(total)} (the largest, "
                             f"{t.name!r}, {_gib(biggest)} in {where!r}), more than this "
                             f"machine's {_gib(memory)} of memory; ONNX Runtime copies every "
                             "weight it is given, so this model cannot be judged here")


def model_hash(path: str | os.PathLike) -> str:
    """sha256 of the model file, as `sha256sum` prints it (read in chunks)."""
    return _file_hash(Path(path)).hexdigest()


def external_files(path: str | os.PathLike) -> list[Path]:
    """The external data files the model's initializers name (load_model checked them)."""
    p = Path(path)
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception:  # the file was validated by load_model; nothing more to name
        return []
    return sorted({p.parent / e.value for g in walk_graphs(model.graph) for t in g.initializer
                   for e in t.external_data if e.key == "location"})


def external_data_hash(path: str | os.PathLike) -> str | None:
    """sha256 over the model's external data files (each file's name, then its bytes); None
    when it keeps none. Apart from `model_hash`, so that the model's hash is its file's."""
    found = external_files(path)
    if not found:
        return None
    h = hashlib.sha256()
    for f in found:
        h.update(f.name.encode())
        h.update(_file_hash(f).digest())
    return h.hexdigest()


def _file_hash(path: Path) -> hashlib._Hash:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 24), b""):
            h.update(chunk)
    return h
