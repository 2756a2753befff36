"""Where samples come from, read one at a time and validated against the model.

`--inputs` takes, in any mix and order:
- an `.npz` keyed by input name (one sample, or a stack along a leading axis);
- a folder: its `*.npz` files in name order (or, if it holds none, the per-iteration `*.json`
  files Polygraphy's `--save-inputs DIR` writes);
- a glob of `.npz` files (`'data/*.npz'`, quoted for the shell), in name order;
- a `.json` file written by Polygraphy's `--save-inputs` (a list of feed dicts), read with
  Polygraphy's own loader when it is installed, else with a reader of the same format
  (polygraphy/json/serde.py: each array an `np.save` payload in base64).

`--data-loader-script FILE.py[:FUNCTION]` runs Polygraphy's data-loader contract: FUNCTION
(default `load_data`) is called with no arguments and iterated; each item is a feed dict
(input name -> array). Its items cannot be read again without running it again, so the sample
set spools them to disk (data/store.py).
"""

from __future__ import annotations

import base64
import functools
import glob
import io
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..base.limits import DEFAULT as DEFAULT_LIMITS
from ..base.limits import Limits, size_text, too_many_samples
from ..errors import TrtBisectError
from ..graph import Graph
from . import npz
from .inputs import (
    Sample,
    check_sample,
    check_shape_names,
    guard_random_samples,
    member_name,
    npy_header,
    npz_samples,
    random_sample,
)

GLOB_CHARS = "*?["
_END = object()  # a data loader's iterator is exhausted


@dataclass(frozen=True)
class Item:
    """One sample as read, where it came from, and how to read it again without keeping it
    (None: it cannot be, it must be kept or spooled)."""

    where: str  # "a.npz", "a.npz[3]", "loader.py:load_data #5", "random seed 7"
    sample: Sample
    reload: Callable[[], Sample] | None


def iter_items(graph: Graph, inputs: Sequence[str], loader: str | None,
               shapes: Mapping[str, tuple[int, ...]], seed: int, count: int = 1,
               limits: Limits = DEFAULT_LIMITS) -> Iterator[Item]:
    """Every sample a plan must pass on, in order: --inputs, then the data loader's; without
    either, `count` seeded random samples. At most `limits.samples` of them: a source that
    declares more is refused before its samples are made, a data loader is not read past it."""
    n = 0
    for item in _items(graph, inputs, loader, shapes, seed, count, limits):
        n += 1
        if n > limits.samples:
            source = " and ".join(f for f, given in (("--inputs", inputs),
                                                      ("--data-loader-script", loader)) if given) or "--samples"
            raise too_many_samples(None, limits, source)
        yield item


def _items(graph: Graph, inputs: Sequence[str], loader: str | None,
           shapes: Mapping[str, tuple[int, ...]], seed: int, count: int, limits: Limits
           ) -> Iterator[Item]:
    check_shape_names(graph, shapes)
    if not inputs and not loader:
        if count < 1:
            raise TrtBisectError("at least one sample is needed (--samples N, N >= 1)")
        guard_random_samples(graph, shapes, count)  # all of them, before the first is made
        for k in range(count):
            yield Item(f"random seed {seed + k}", random_sample(graph, shapes, seed + k),
                       functools.partial(random_sample, graph, shapes, seed + k))
        return
    for spec in inputs:
        for path, kind in expand(spec):
            if kind == "npz":
                yield from _npz_items(graph, path, shapes, limits)
            else:
                yield from _json_items(graph, path, shapes)
    if loader:
        yield from loader_items(graph, loader, shapes)


def expand(spec: str) -> list[tuple[str, str]]:
    """One --inputs value -> (path, "npz" | "json") in the order they are read."""
    p = Path(spec)
    if p.is_dir():
        files = sorted(str(f) for f in p.iterdir() if f.suffix == ".npz" and f.is_file())
        if files:
            return [(f, "npz") for f in files]
        files = sorted(str(f) for f in p.iterdir() if f.suffix == ".json" and f.is_file())
        if files:
            return [(f, "json") for f in files]
        raise TrtBisectError(f"--inputs {spec}: the folder holds no .npz files (nor "
                             "Polygraphy --save-inputs .json files)")
    if not p.exists() and any(c in spec for c in GLOB_CHARS):
        files = sorted(f for f in glob.glob(spec) if os.path.isfile(f))
        if not files:
            raise TrtBisectError(f"--inputs {spec!r}: the pattern matches no file")
        return [(f, "json" if f.endswith(".json") else "npz") for f in files]
    if p.suffix == ".json":
        return [(spec, "json")]
    return [(spec, "npz")]


# ---------------------------------------------------------------- .npz

def _npz_items(graph: Graph, path: str, shapes: Mapping[str, tuple[int, ...]],
               limits: Limits = DEFAULT_LIMITS) -> Iterator[Item]:
    """One sample, read whole; or a stack, one sample at a time (data/npz.py): read again by
    offset when it is stored plainly, else spooled by the sample set past its budget. A stack
    is held to the limits by what its headers declare, before any sample is read."""
    samples, stack = npz.read(graph, path, shapes, limits.samples)
    if stack is not None:
        declared = stack.count * sum(m.row_bytes for m in stack.members.values())
        if declared > limits.total_input_bytes:
            raise TrtBisectError(f"{path} declares {size_text(declared)} of samples, more than "
                                 f"--max-input-bytes {size_text(limits.total_input_bytes)}; "
                                 "give less data or a larger --max-input-bytes")
    if stack is None:
        for k, sample in enumerate(samples):
            yield Item(f"{path}[{k}]" if len(samples) > 1 else path, sample,
                       functools.partial(_one_npz, graph, path, shapes) if len(samples) == 1
                       else None)
        return
    for k, sample in enumerate(stack.rows()):
        yield Item(f"{path}[{k}]", sample,
                   functools.partial(stack.row, k) if stack.random_access else None)


def _one_npz(graph: Graph, path: str, shapes: Mapping[str, tuple[int, ...]]) -> Sample:
    return npz_samples(graph, path, shapes)[0]


# ---------------------------------------------------------------- Polygraphy JSON

def _json_items(graph: Graph, path: str, shapes: Mapping[str, tuple[int, ...]]
                ) -> Iterator[Item]:
    data = load_polygraphy_json(path)
    feeds = data if isinstance(data, list) else [data]
    if not feeds:
        raise TrtBisectError(f"{path} holds no samples")
    for k, feed in enumerate(feeds):
        where = f"{path}[{k}]" if len(feeds) > 1 else path
        yield Item(where, _feed(feed, graph, shapes, where, "--inputs"), None)
    del data, feeds


def load_polygraphy_json(path: str) -> Any:
    """What Polygraphy's `load_json` returns for a --save-inputs file: feed dicts of arrays."""
    if not os.path.isfile(path):
        raise TrtBisectError(f"inputs file not found: {path}")
    try:
        from polygraphy.json import load_json
    except ImportError:
        load_json = None
    try:
        if load_json is not None:
            return load_json(path)
        with open(path, encoding="utf-8") as fh:
            return json.load(fh, object_hook=_decode_ndarray)
    except TrtBisectError:
        raise
    except (Exception, SystemExit) as exc:  # Polygraphy reports bad files with SystemExit too
        raise TrtBisectError(f"cannot read {path} as Polygraphy --save-inputs JSON "
                             f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
                             ) from None


def _decode_ndarray(dct: dict) -> Any:
    """polygraphy/json/serde.py's ndarray decoder: {"array": base64 of np.save bytes,
    "polygraphy_class": "ndarray"} (older files: the latin-1 form)."""
    legacy = dct.get("ndarray") == "polygraphy_serialized_json_type"  # constants.LEGACY_TYPE_MARKER
    if dct.get("polygraphy_class") != "ndarray" and not legacy:
        if dct.get("polygraphy_class") is not None:
            raise ValueError(f"a {dct['polygraphy_class']!r} needs polygraphy to decode: "
                             "pip install polygraphy")
        return dct
    payload = dct["array"]
    try:
        data = base64.b64decode(payload.encode(), validate=True)
    except ValueError:
        data = payload.encode("latin-1")
    arr = np.load(io.BytesIO(data), allow_pickle=False)
    if not isinstance(arr, np.ndarray):
        values = list(arr.values())
        arr = values[0]
    return arr


def _feed(feed: Any, graph: Graph, shapes: Mapping[str, tuple[int, ...]], where: str,
          flag: str, copy: bool = False) -> Sample:
    """`copy`: arrays of the sample's own (a loader may reuse its buffers, or hand over a
    torch tensor's memory)."""
    if not isinstance(feed, Mapping):
        raise TrtBisectError(f"{flag}: {where} is a {type(feed).__name__}, not a feed dict "
                             "(input name -> array)")
    sample = {str(k): _array(v, where, k) for k, v in feed.items()}
    if copy:
        sample = {k: np.array(v, copy=True) for k, v in sample.items()}
    check_sample(graph, sample, shapes, where)
    return sample


def _array(value: Any, where: str, name: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "numpy") and hasattr(value, "detach"):  # a CPU torch tensor
        return value.detach().cpu().numpy()
    raise TrtBisectError(f"input {name!r} in {where} is a {type(value).__name__}, not a numpy "
                         "array")


# ---------------------------------------------------------------- --data-loader-script

def loader_items(graph: Graph, spec: str, shapes: Mapping[str, tuple[int, ...]]
                 ) -> Iterator[Item]:
    """Polygraphy's contract: FUNCTION() is iterated, each item a feed dict."""
    from ..judge.hooks import HookError, load_function, user_code
    fn, path, name, _ = load_function(spec, "--data-loader-script", "load_data")
    label = f"{path}:{name}"
    n = 0
    try:
        with user_code():  # what it prints goes to stderr, as it runs
            feeds = iter(fn())
        while True:
            with user_code():
                feed = next(feeds, _END)
            if feed is _END:
                break
            where = f"{label} sample {n}"
            # copied: a loader that fills one buffer again for every sample (a common
            # pattern) would otherwise make every sample held the last one
            yield Item(where, _feed(feed, graph, shapes, where, "--data-loader-script",
                                    copy=True), None)
            n += 1
    except TrtBisectError:
        raise
    except (Exception, SystemExit) as exc:  # the user's code
        raise HookError(f"--data-loader-script {spec}: {name} raised {type(exc).__name__} "
                        f"after {n} sample(s): {' '.join(str(exc).split())[:200]}") from None
    if n == 0:
        raise HookError(f"--data-loader-script {spec}: {name} yielded no samples")


def npz_shapes(specs: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """The array shapes of the first --inputs .npz, from its headers (nothing is read): what
    a graph input that declares no shape is given (one sample, as the array is). Empty where
    it cannot be read; reading the samples then says why."""
    import zipfile

    try:
        path, kind = expand(specs[0])[0] if specs else ("", "")
        if kind != "npz":
            return {}
        with zipfile.ZipFile(path) as zf:
            return {member_name(i, path): tuple(npy_header(zf, i, path)[0])
                    for i in zf.infolist()}
    except (TrtBisectError, OSError, ValueError, EOFError, zipfile.BadZipFile, IndexError):
        return {}


def load_samples(graph: Graph, paths: Sequence[str | os.PathLike],
                 shapes: Mapping[str, tuple[int, ...]], seed: int, count: int = 1) -> list[Sample]:
    """Every sample a plan must pass on, as a list (iter_items streams them instead).

    Each .npz is keyed by graph input name. An array with one more dimension than the input is
    a stack of samples along its first axis. Without files, `count` seeded random samples.
    """
    return [item.sample for item in iter_items(graph, [str(p) for p in paths], None, shapes,
                                               seed, count)]
