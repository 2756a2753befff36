"""Input samples: loaded from .npz files or generated from a seed, validated against the model."""

from __future__ import annotations

import os
import zipfile
from typing import Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from .errors import TrtBisectError
from .graph import Graph

Sample = dict[str, np.ndarray]


def parse_shapes(specs: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """`name:1x3x224x224` (repeatable) -> {name: (1, 3, 224, 224)}; `name:` for a scalar."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = spec.rpartition(":")
        if not sep or not name:
            raise TrtBisectError(f"bad --shape {spec!r}: expected NAME:DxDxD, e.g. x:1x3x224x224")
        try:
            shapes[name] = tuple(int(d) for d in dims.split("x")) if dims else ()
        except ValueError:
            raise TrtBisectError(f"bad --shape {spec!r}: dimensions must be integers, e.g. 1x3x224x224")
    return shapes


def declared_shape(value: onnx.ValueInfoProto) -> list[int | str | None]:
    dims = value.type.tensor_type.shape.dim
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in dims]


def input_dtype(value: onnx.ValueInfoProto) -> np.dtype:
    if not value.type.HasField("tensor_type"):
        raise TrtBisectError(f"input {value.name!r} is not a tensor; only tensor inputs are supported")
    return np.dtype(helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))


def resolve_shape(value: onnx.ValueInfoProto, shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
    declared = declared_shape(value)
    if value.name in shapes:
        given = shapes[value.name]
        _check_shape(value.name, declared, given, "--shape")
        return given
    if any(not isinstance(d, int) or d <= 0 for d in declared):
        shown = "x".join(str(d) if d else "?" for d in declared)
        raise TrtBisectError(
            f"input {value.name!r} has a dynamic shape [{shown}]; give one with "
            f"--shape {value.name}:{'x'.join(str(d) if isinstance(d, int) and d > 0 else '1' for d in declared)}")
    return tuple(int(d) for d in declared)  # type: ignore[arg-type]


def _check_shape(name: str, declared: Sequence[int | str | None], got: Sequence[int], source: str) -> None:
    if not declared and not got:
        return
    if len(declared) != len(got) or any(
            isinstance(d, int) and d > 0 and d != g for d, g in zip(declared, got)):
        want = "x".join(str(d) if isinstance(d, int) and d > 0 else "?" for d in declared)
        have = "x".join(map(str, got))
        raise TrtBisectError(f"input {name!r}: {source} has shape {have or 'scalar'}, the model "
                             f"expects {want or 'scalar'}")


def random_sample(graph: Graph, shapes: Mapping[str, tuple[int, ...]], seed: int) -> Sample:
    """Seeded data of the right dtype and shape: N(0,1) floats, small non-negative integers."""
    rng = np.random.default_rng(seed)
    sample: Sample = {}
    for value in graph.fed_inputs():
        dtype, shape = input_dtype(value), resolve_shape(value, shapes)
        if dtype.kind == "f":
            sample[value.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            sample[value.name] = rng.integers(0, 2, size=shape).astype(dtype)
        elif dtype.kind == "b":
            sample[value.name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            raise TrtBisectError(f"input {value.name!r} has dtype {dtype}; pass it with --inputs")
    return sample


def load_samples(graph: Graph, paths: Sequence[str | os.PathLike],
                 shapes: Mapping[str, tuple[int, ...]], seed: int, count: int = 1) -> list[Sample]:
    """Every sample a plan must pass on.

    Each .npz is keyed by graph input name. An array with one more dimension than the input is
    a stack of samples along its first axis. Without files, `count` seeded random samples.
    """
    if not paths:
        return [random_sample(graph, shapes, seed + k) for k in range(count)]
    samples: list[Sample] = []
    for path in paths:
        samples.extend(_split_samples(graph, _read_npz(path), str(path)))
    return samples


def _read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    if not os.path.isfile(path):
        raise TrtBisectError(f"inputs file not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise TrtBisectError(f"cannot read {path} as .npz: {exc}")


def _split_samples(graph: Graph, arrays: dict[str, np.ndarray], source: str) -> list[Sample]:
    wanted = {v.name: v for v in graph.fed_inputs()}
    missing = sorted(set(wanted) - set(arrays))
    extra = sorted(set(arrays) - set(wanted))
    if missing:
        raise TrtBisectError(f"{source} lacks input(s) {', '.join(missing)}; it has "
                             f"{', '.join(sorted(arrays)) or 'nothing'}")
    if extra:
        raise TrtBisectError(f"{source} has array(s) {', '.join(extra)} that are not graph inputs "
                             f"(inputs: {', '.join(sorted(wanted))})")
    stacked: dict[str, bool] = {}
    for name, value in wanted.items():
        arr, dtype, declared = arrays[name], input_dtype(value), declared_shape(value)
        if arr.dtype != dtype:
            raise TrtBisectError(f"input {name!r} in {source} is {arr.dtype}, the model expects {dtype}")
        stacked[name] = arr.ndim == len(declared) + 1
        _check_shape(name, declared, arr.shape[1:] if stacked[name] else arr.shape, source)
    if not any(stacked.values()):
        return [dict(arrays)]
    counts = {len(arrays[n]) for n, s in stacked.items() if s}
    if len(counts) != 1 or not all(stacked.values()):
        raise TrtBisectError(f"{source}: stack every input along a leading sample axis of the "
                             "same length, or none")
    n = counts.pop()
    return [{name: arrays[name][k] for name in wanted} for k in range(n)]
