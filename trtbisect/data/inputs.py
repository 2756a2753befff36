"""Input samples: read from .npz files or generated from a seed, validated against the model.
The sources users have (folders, globs, data-loader scripts, Polygraphy JSON) and streaming
live in data/."""

from __future__ import annotations

import math
import os
import zipfile
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from ..base.limits import memory_limit
from ..errors import TrtBisectError
from ..graph import Graph

Sample = dict[str, np.ndarray]


def parse_shapes(specs: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """`name:1x3x224x224` (repeatable) -> {name: (1, 3, 224, 224)}; `name:` for a scalar."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = spec.rpartition(":")
        if not sep or not name:
            raise TrtBisectError(f"bad --shape {spec!r}: expected NAME:DxDxD, e.g. x:1x3x224x224")
        try:
            shape = tuple(int(d) for d in dims.split("x")) if dims else ()
        except ValueError:
            shape = (-1,)
        if any(d < 0 for d in shape):
            raise TrtBisectError(f"bad --shape {spec!r}: dimensions must be non-negative "
                                 "integers, e.g. 1x3x224x224 (0 for an empty dimension, as a "
                                 "decoder's first past_key_values)")
        shapes[name] = shape
    return shapes


def check_shape_names(graph: Graph, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """A --shape naming no graph input would be silently ignored: refuse it."""
    inputs = [v.name for v in graph.inputs()]
    for name in shapes:
        if name in inputs:
            continue
        what = "an output" if name in graph.output_names() else "no input"
        raise TrtBisectError(f"--shape {name!r} names {what} of the model; its inputs: "
                             f"{', '.join(inputs) or 'none'}")


def guard_size(shape: Sequence[int], dtype: np.dtype, what: str) -> None:
    """Refuse before allocating what cannot fit (a lying header, a dimension of 2**40)."""
    nbytes = math.prod(int(d) for d in shape) * dtype.itemsize
    if nbytes > memory_limit():
        raise TrtBisectError(f"{what} would take {nbytes / 2**30:.3g} GiB, more than half of "
                             "this machine's memory; give smaller shapes")


MAX_SAMPLES = 10_000  # random samples: every evaluation runs each one


def guard_random_samples(graph: Graph, shapes: Mapping[str, tuple[int, ...]], count: int) -> None:
    """Refuse, before generating any, random samples that could not all be held: their total
    bytes against half of this machine's memory (`--shape x:10000000x8 --samples 500` is 160 GB),
    and more than MAX_SAMPLES of them."""
    if count < 1:
        raise TrtBisectError("at least one sample is needed (--samples N, N >= 1)")
    if count > MAX_SAMPLES:
        raise TrtBisectError(f"--samples {count}: at most {MAX_SAMPLES} random samples (each is "
                             "run on every evaluation); pass real data with --inputs instead")
    each = 0
    for value in graph.fed_inputs():
        shape = resolve_shape(value, shapes)
        guard_size(shape, input_dtype(value), f"a random sample of input {value.name!r}")
        each += math.prod(shape) * input_dtype(value).itemsize
    if each * count > memory_limit():
        raise TrtBisectError(f"--samples {count} random samples of {_size(each)} each would take "
                             f"{_size(each * count)}, more than half of this machine's memory "
                             f"({_size(memory_limit())}); give fewer --samples or a smaller --shape")


def _size(n: int) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"


def declared_shape(value: onnx.ValueInfoProto) -> list[int | str | None]:
    dims = value.type.tensor_type.shape.dim
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in dims]


def input_dtype(value: onnx.ValueInfoProto) -> np.dtype:
    if not value.type.HasField("tensor_type"):
        raise TrtBisectError(f"input {value.name!r} is not a tensor; only tensor inputs are supported")
    elem = value.type.tensor_type.elem_type
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem))
    except (KeyError, TypeError, ValueError):
        raise TrtBisectError(f"input {value.name!r} has element type {elem}, which is no ONNX "
                             "tensor type this tool can feed") from None


def resolve_shape(value: onnx.ValueInfoProto, shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
    declared = declared_shape(value)
    if value.name in shapes:
        given = shapes[value.name]
        _check_shape(value.name, declared, given, "--shape")
        return given
    if any(not isinstance(d, int) or d <= 0 for d in declared):
        shown = "x".join(str(d) if d else "?" for d in declared)
        raise TrtBisectError(
            f"input {value.name!r} has a dynamic shape [{shown}]; give the size you deploy "
            f"with, e.g. --shape {value.name}:{'x'.join(map(str, suggest_shape(declared)))}")
    return tuple(int(d) for d in declared)  # type: ignore[arg-type]


def suggest_shape(declared: Sequence[int | str | None]) -> list[int]:
    """A plausible shape for the dynamic-shape error: known dimensions kept, a batch of 1,
    224 for the spatial dimensions of an image (rank 4), 128 for a sequence; a dimension's
    name (`height`, `seq_len`, ...) decides where it has one."""
    rank, out = len(declared), []
    for i, d in enumerate(declared):
        name = d.lower() if isinstance(d, str) else ""
        if isinstance(d, int) and d > 0:
            out.append(d)
        elif "batch" in name or i == 0:
            out.append(1)
        elif any(w in name for w in ("height", "width")) or (rank == 4 and not name):
            out.append(224)
        elif any(w in name for w in ("seq", "len", "token", "time")) or rank in (2, 3):
            out.append(128)
        else:
            out.append(16)
    return out


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
        guard_size(shape, dtype, f"a random sample of input {value.name!r}")
        if dtype.kind == "f" or dtype.name == "bfloat16":
            sample[value.name] = rng.standard_normal(shape).astype(np.float32).astype(dtype)
        elif dtype.kind in "iu":
            sample[value.name] = rng.integers(0, 2, size=shape).astype(dtype)
        elif dtype.kind == "b":
            sample[value.name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            raise TrtBisectError(f"input {value.name!r} has dtype {dtype}; pass it with --inputs")
    return sample


def npz_samples(graph: Graph, path: str, shapes: Mapping[str, tuple[int, ...]]) -> list[Sample]:
    """The samples of one .npz (one, or a stack along a leading axis), validated."""
    return validate_npz(graph, read_npz(path), path, shapes)


def validate_npz(graph: Graph, arrays: Mapping[str, np.ndarray], path: str,
                 shapes: Mapping[str, tuple[int, ...]], max_samples: int | None = None
                 ) -> list[Sample]:
    """`arrays` (an .npz's members, or stand-ins of their shape and dtype) split into samples
    and checked against the model and --shape; a stack of more than `max_samples` (default:
    limits.MAX_SAMPLES) is refused before it is split."""
    part = _split_samples(graph, arrays, str(path), max_samples=max_samples)
    if not part:
        raise TrtBisectError(f"{path} holds no samples (its leading sample axis is empty)")
    for sample in part:
        _check_given(sample, shapes, str(path))
    return part


def check_sample(graph: Graph, sample: Sample, shapes: Mapping[str, tuple[int, ...]],
                 source: str) -> None:
    """One sample from a data loader or Polygraphy JSON: the model's input names, dtypes and
    shapes, and --shape."""
    _split_samples(graph, sample, source, stacks=False)
    _check_given(sample, shapes, source)


def _check_given(sample: Sample, shapes: Mapping[str, tuple[int, ...]], source: str) -> None:
    """Data that contradicts --shape is a usage error, not a silent pass. (An empty tensor is
    data: a decoder's first step feeds past_key_values of sequence length 0.)"""
    for name, arr in sample.items():
        if name in shapes and tuple(arr.shape) != tuple(shapes[name]):
            raise TrtBisectError(f"--shape {name}:{'x'.join(map(str, shapes[name])) or '(scalar)'} "
                                 f"disagrees with {name!r} in {source} "
                                 f"({'x'.join(map(str, arr.shape)) or 'scalar'}); drop --shape or "
                                 "fix the data")


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of an .npz, each header checked against its size before anything is allocated."""
    if not os.path.isfile(path):
        raise TrtBisectError(f"inputs file not found: {path}")
    hint = "--inputs takes an .npz keyed by input name, e.g. np.savez('in.npz', x=array)"
    try:
        with open(path, "rb") as fh:
            magic = fh.read(6)
        if magic == b"\x93NUMPY":
            raise TrtBisectError(f"{path} is a single .npy array; {hint}")
        arrays: dict[str, np.ndarray] = {}
        with zipfile.ZipFile(path) as zf:
            members = npz_members(zf, path)
            budget = memory_limit()
            for info in members:
                arrays[member_name(info, path)] = _read_member(zf, info, path)
                budget -= arrays[member_name(info, path)].nbytes
                if budget < 0:
                    raise TrtBisectError(f"{path} holds more data than half of this machine's "
                                         "memory")
        if not arrays:
            raise TrtBisectError(f"{path} holds no arrays; {hint}")
        return arrays
    except (OSError, EOFError, ValueError, RuntimeError, NotImplementedError,
            zipfile.BadZipFile, zipfile.LargeZipFile) as exc:
        raise TrtBisectError(f"cannot read {path} as .npz ({exc}); {hint}") from None


def npz_members(zf: zipfile.ZipFile, path: str | os.PathLike) -> list[zipfile.ZipInfo]:
    """The members of an .npz; two of one name are refused (which one is meant is anyone's
    guess: numpy reads the last, a zip tool may show the first)."""
    members = zf.infolist()
    seen: set[str] = set()
    for info in members:
        if info.filename in seen:
            raise TrtBisectError(f"{path} holds two members named {info.filename!r} (a "
                                 "hand-made or damaged zip?); write it again with np.savez")
        seen.add(info.filename)
    return members


def member_name(info: zipfile.ZipInfo, path: str | os.PathLike) -> str:
    if not info.filename.endswith(".npy"):
        raise TrtBisectError(f"{path}: member {info.filename!r} is not a numpy array (.npy)")
    return info.filename[:-4]


def npy_header(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: str | os.PathLike
               ) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """A member's shape, Fortran order, dtype and header length, checked against its size
    before anything is allocated."""
    with zf.open(info) as fh:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        header = fh.tell()
    if dtype.hasobject:
        raise TrtBisectError(f"{path}: {info.filename!r} holds Python objects, not numbers")
    if any(d < 0 for d in shape):
        raise TrtBisectError(f"{path}: {info.filename!r} declares the shape {tuple(shape)}, "
                             "with a negative dimension (a damaged or hand-made file?)")
    need = math.prod(shape) * dtype.itemsize
    if need > info.file_size - header:
        raise TrtBisectError(f"{path}: {info.filename!r} declares {need} bytes of data but holds "
                             f"{info.file_size - header} (truncated or corrupt)")
    return tuple(shape), bool(fortran), dtype, header


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, path: str | os.PathLike) -> np.ndarray:
    npy_header(zf, info, path)
    with zf.open(info) as fh:
        return np.lib.format.read_array(fh, allow_pickle=False)


def _split_samples(graph: Graph, arrays: Mapping[str, np.ndarray], source: str,
                   stacks: bool = True, max_samples: int | None = None) -> list[Sample]:
    wanted = {v.name: v for v in graph.fed_inputs()}
    missing = sorted(set(wanted) - set(arrays))
    extra = sorted(set(arrays) - set(wanted))
    if missing:
        raise TrtBisectError(f"{source} lacks input(s) {', '.join(missing)}; it has "
                             f"{', '.join(sorted(arrays)) or 'nothing'}")
    if extra:
        weights = [n for n in extra if n in graph.initializers]
        why = (f"; {', '.join(weights)}: a default value (an initializer) the model holds, judged "
               "as the constant TensorRT's parser makes of it (docs/input_models.md)"
               if weights else "")
        raise TrtBisectError(f"{source} has array(s) {', '.join(extra)} that are not graph inputs "
                             f"(inputs: {', '.join(sorted(wanted))}){why}")
    stacked: dict[str, bool] = {}
    for name, value in wanted.items():
        arr, dtype, declared = arrays[name], input_dtype(value), declared_shape(value)
        if not isinstance(arr, np.ndarray):
            raise TrtBisectError(f"input {name!r} in {source} is a {type(arr).__name__}, not a "
                                 "numpy array")
        if arr.dtype != dtype:
            raise TrtBisectError(f"input {name!r} in {source} is {arr.dtype}, the model expects {dtype}")
        stacked[name] = stacks and arr.ndim == len(declared) + 1
        _check_shape(name, declared, arr.shape[1:] if stacked[name] else arr.shape, source)
    if not any(stacked.values()):
        return [dict(arrays)]
    counts = {len(arrays[n]) for n, s in stacked.items() if s}
    if len(counts) != 1 or not all(stacked.values()):
        raise TrtBisectError(f"{source}: stack every input along a leading sample axis of the "
                             "same length, or none")
    n = counts.pop()
    from ..base.limits import DEFAULT, Limits, check_count
    check_count(n, DEFAULT if max_samples is None else Limits(samples=max_samples), source)
    return [{name: arrays[name][k, ...] for name in wanted} for k in range(n)]  # 0-d stays an array
