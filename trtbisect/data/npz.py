"""A stack of samples in one .npz, read one sample at a time.

`np.savez(path, x=batch)` with a leading sample axis is how many users hand over a validation
set (and how `trtbisect export --samples N` saves one). Reading the file whole would hold every
sample at once, and reading it again for each sample a search asks for would read it whole
each time. An .npz is a zip of .npy files, so instead:

- a member `np.savez` stored uncompressed, in C order, is read by offset: sample k of it is
  `row_bytes` at `data + k * row_bytes` in the file, whenever it is asked for;
- a member `np.savez_compressed` deflated is decompressed as a stream, one sample after the
  other: in order once, so the sample set spools what it cannot hold (data/store.py);
- a Fortran-order member (a sample is not contiguous in it) is read whole during that pass.

The file's size and modification time are taken when the stack is first read; a sample read
again from a file that changed since is refused (the run's fingerprint hashed what was there).
"""

from __future__ import annotations

import math
import os
import struct
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from ..base.limits import MAX_SAMPLES
from ..errors import TrtBisectError
from ..graph import Graph
from .inputs import Sample, guard_size, member_name, npy_header, npz_members, read_npz, validate_npz

_READ_ERRORS = (OSError, EOFError, ValueError, RuntimeError, NotImplementedError, struct.error,
                zlib.error, zipfile.BadZipFile, zipfile.LargeZipFile)
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature ... file name length, extra field length


@dataclass(frozen=True)
class Member:
    info: zipfile.ZipInfo
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran: bool
    data: int | None  # where the array's bytes start in the file, when stored plainly

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.shape[1:]

    @property
    def row_bytes(self) -> int:
        return math.prod(self.row_shape) * self.dtype.itemsize


class Stack:
    """The members of one .npz whose every input is stacked along a leading sample axis."""

    def __init__(self, path: str, members: Mapping[str, Member], count: int) -> None:
        self.path, self.members, self.count = path, dict(members), count
        st = os.stat(path)
        self._stamp = (st.st_size, st.st_mtime_ns)

    @property
    def random_access(self) -> bool:
        """Every member can be read at any sample without reading the ones before it."""
        return all(m.data is not None for m in self.members.values())

    def rows(self) -> Iterator[Sample]:
        """Every sample in order, each member read once."""
        try:
            yield from self._rows()
        except _READ_ERRORS as exc:
            raise TrtBisectError(f"cannot read {self.path} as .npz ({exc})") from None

    def _rows(self) -> Iterator[Sample]:
        with zipfile.ZipFile(self.path) as zf, open(self.path, "rb") as raw:
            streams, whole = {}, {}
            try:
                for name, m in self.members.items():
                    if m.data is None and m.fortran:
                        with zf.open(m.info) as fh:
                            whole[name] = np.lib.format.read_array(fh, allow_pickle=False)
                    elif m.data is None:
                        streams[name] = fh = zf.open(m.info)
                        fh.read(npy_header(zf, m.info, self.path)[3])
                for k in range(self.count):
                    yield {name: (whole[name][k, ...].copy() if name in whole else
                                  _read_row(streams[name], m, self.path) if name in streams
                                  else self._pread(raw, m, k))
                           for name, m in self.members.items()}
            finally:
                for fh in streams.values():
                    fh.close()

    def row(self, k: int) -> Sample:
        """Sample k again (random access only)."""
        st = os.stat(self.path) if os.path.isfile(self.path) else None
        if st is None or (st.st_size, st.st_mtime_ns) != self._stamp:
            raise TrtBisectError(f"{self.path} changed during the run; its samples were hashed "
                                 "when it was first read: start the run again")
        try:
            with open(self.path, "rb") as raw:
                return {name: self._pread(raw, m, k) for name, m in self.members.items()}
        except OSError as exc:
            raise TrtBisectError(f"cannot read {self.path} again ({exc})") from None

    def _pread(self, raw, m: Member, k: int) -> np.ndarray:
        assert m.data is not None
        raw.seek(m.data + k * m.row_bytes)
        return _read_row(raw, m, self.path)


def _read_row(fh, m: Member, path: str) -> np.ndarray:
    """One sample of `m` from where `fh` stands, into a writable array of its own (as np.load
    gives; a 0-d sample stays an array)."""
    out = np.empty(m.row_shape, m.dtype)
    view, got = out.data.cast("B") if out.nbytes else memoryview(b""), 0
    while got < out.nbytes:
        n = fh.readinto(view[got:])
        if not n:
            raise TrtBisectError(f"{path}: {m.info.filename!r} ends early (truncated or corrupt)")
        got += n
    return out


def read(graph: Graph, path: str, shapes: Mapping[str, tuple[int, ...]],
         max_samples: int = MAX_SAMPLES) -> tuple[list[Sample], Stack | None]:
    """The samples of one .npz, validated: a file of one sample is read (and returned) whole;
    a stack is validated from its headers and returned as a `Stack`, nothing read yet. A stack
    longer than `max_samples` is refused from its headers (10^9 empty samples fit in 200
    bytes)."""
    members = _members(path)
    if members is None:  # not a plain zip of .npy: the whole-file reader says what is wrong
        return validate_npz(graph, read_npz(path), path, shapes, max_samples), None
    standins = {n: np.broadcast_to(np.zeros((), m.dtype), m.shape) for n, m in members.items()}
    part = validate_npz(graph, standins, path, shapes, max_samples)
    if all(part[0][n].ndim == len(m.shape) for n, m in members.items()):  # one sample
        return validate_npz(graph, read_npz(path), path, shapes, max_samples), None
    for name, m in members.items():
        guard_size(m.row_shape, m.dtype, f"one sample of {name!r} in {path}")
    return [], Stack(path, members, len(part))


def _members(path: str) -> dict[str, Member] | None:
    """Each member's header and, for one stored plainly in C order, where its data starts;
    None where the file is not a readable zip of .npy members (left to read_npz's errors)."""
    try:
        with zipfile.ZipFile(path) as zf, open(path, "rb") as raw:
            out = {}
            for info in npz_members(zf, path):
                name = member_name(info, path)
                shape, fortran, dtype, header = npy_header(zf, info, path)
                data = None
                if (info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 1
                        and not fortran and len(shape) >= 1):
                    raw.seek(info.header_offset)
                    sig, name_len, extra_len = _LOCAL_HEADER.unpack(raw.read(_LOCAL_HEADER.size))
                    if sig == b"PK\x03\x04":
                        data = (info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
                                + header)
                out[name] = Member(info, shape, dtype, fortran, data)
            return out or None
    except _READ_ERRORS:
        return None
