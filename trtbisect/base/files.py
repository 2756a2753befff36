"""Files under --out, written and read without ever following a link someone planted there.

A results folder someone hands over, or an --out under /tmp, may hold symbolic links where
trtbisect writes (`.trtbisect.lock -> ~/victim`, `.cache -> /elsewhere`) or hard links to
another file. So, under a *guarded* folder (the --out a run holds the lock of):

- every folder between the guarded folder and a file is a real folder: a missing one is made
  with mkdir (which never follows a link), an existing one is checked with lstat;
- a file is written in a private temporary folder (mkdtemp: mode 0700, so nobody else can
  swap the file while it is written) and renamed into place; a rename replaces a link, it never
  writes through one, and a link or folder standing where the file goes is refused;
- a file opened in place (the lock, the journal, a cache) is opened with O_NOFOLLOW and must be
  a regular file with one link.

Anything refused is a one-line TrtBisectError (exit 2) naming the path.
"""

from __future__ import annotations

import errno
import io
import json
import os
import stat
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnx

from ..errors import TrtBisectError

# absolute path of a guarded folder (as given and as resolved) -> [holders, claim hook]
_roots: dict[str, list] = {}


def _abs(path: str | os.PathLike) -> str:
    return os.path.abspath(os.fspath(path))


@contextmanager
def guarded(folder: str | os.PathLike) -> Iterator[None]:
    """Files written under `folder` while this holds get the checks above (re-entrant)."""
    keys = list(dict.fromkeys([_abs(folder), os.path.realpath(folder)]))
    for k in keys:
        _roots.setdefault(k, [0, None])[0] += 1
    try:
        yield
    finally:
        for k in keys:
            _roots[k][0] -= 1
            if _roots[k][0] == 0:
                del _roots[k]


def set_claim(folder: str | os.PathLike, hook: Callable[[str], None] | None) -> None:
    """While set, every file atomic_write puts under the guarded `folder` is first announced
    to `hook` with its path relative to the folder (outdir.Generation lists it, or refuses)."""
    for k in {_abs(folder), os.path.realpath(folder)}:
        if k in _roots:
            _roots[k][1] = hook


def _root_of(path: str | os.PathLike) -> tuple[str, tuple[str, ...]] | None:
    a = _abs(path)
    for root in sorted(_roots, key=len, reverse=True):
        if a == root or a.startswith(root.rstrip(os.sep) + os.sep):
            return root, Path(a).relative_to(root).parts
    return None


def refusal(path: str | os.PathLike, st: os.stat_result | None = None,
            why: str | None = None) -> TrtBisectError:
    """The one-line error for something trtbisect will not write through or into."""
    if why is None:
        mode = st.st_mode if st is not None else 0
        why = ("a symbolic link" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode)
               else "a hard link to another file" if stat.S_ISREG(mode)
               else "not a regular file")
    return TrtBisectError(f"{os.fspath(path)} is {why}, not a file or folder of trtbisect's own; "
                          "remove it or choose another --out")


def ensure_folder(folder: str | os.PathLike) -> Path:
    """`folder` as a real folder. Under a guarded folder each component is made with mkdir or
    checked with lstat: a link there is refused, never followed."""
    folder = Path(folder)
    found = _root_of(folder)
    if found is None:
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    root, parts = found
    current = root
    for part in parts:
        current = os.path.join(current, part)
        try:
            os.mkdir(current)
        except FileExistsError:
            pass
        st = os.lstat(current)
        if not stat.S_ISDIR(st.st_mode):  # lstat: a link to a folder is not a folder
            raise refusal(current, st)
    return folder


def lstat_or_none(path: str | os.PathLike) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def check_target(path: str | os.PathLike) -> None:
    """Where a file will be renamed to: nothing, or a regular file (a link, a folder, a pipe
    standing there is refused)."""
    st = lstat_or_none(path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise refusal(path, st)


def claim(path: str | os.PathLike) -> None:
    """Announce a file about to be put under a guarded folder (see set_claim)."""
    found = _root_of(path)
    if found is not None and _roots[found[0]][1] is not None:
        _roots[found[0]][1]("/".join(found[1]))


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> None:
    """Write through a temporary file in a private folder beside `path`, then rename: never a
    half file, never through a link. `write` gets the temporary file's path."""
    path = Path(path)
    ensure_folder(path.parent)
    if _root_of(path) is not None:
        check_target(path)
        claim(path)
    tmpdir = tempfile.mkdtemp(dir=path.parent, prefix=".trtbisect-", suffix=".tmp")
    tmp = os.path.join(tmpdir, "file")
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())  # others may deploy it
        os.replace(tmp, path)
    except OSError as exc:
        raise named(exc, path) from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        try:
            os.rmdir(tmpdir)
        except OSError:
            pass


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
    atomic_write(path, write)


def atomic_write_json(path: str | os.PathLike, data: object) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def atomic_write_records(path: str | os.PathLike, rows: list[dict]) -> None:
    """A JSON list of flat records, one a line: as readable as `indent=2` for a table, and
    encoded by json's C encoder (`indent` makes json pure Python: 2.7 s for the statistics of
    20k tensors, written twice)."""
    atomic_write_text(path, "[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n"
                      if rows else "[]\n")


def save_model(path: str | os.PathLike, model: onnx.ModelProto) -> None:
    atomic_write(path, lambda tmp: onnx.save(model, tmp))


def named(exc: OSError, path: str | os.PathLike) -> OSError:
    """`exc` naming `path` where it names no file (a write on a full disk names none): the
    one-line error then says where."""
    if exc.filename is not None:
        return exc
    return type(exc)(exc.errno, exc.strerror or str(exc), str(path))


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def open_in_place(path: str | os.PathLike, flags: int, mode: int = 0o666) -> int:
    """A descriptor on a regular file with one link, never through a link (O_NOFOLLOW), never
    blocking on a planted pipe or device (O_NONBLOCK)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise refusal(path, why="a symbolic link") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise refusal(path, st)
    return fd


def read_in_place(path: str | os.PathLike) -> bytes | None:
    """A regular file's bytes; None when it is absent. A link or other oddity is refused."""
    try:
        fd = open_in_place(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def remove_file(path: str | os.PathLike) -> bool:
    """Delete a regular file or a link (the link only, never its target); folders and
    anything else stay. True when something was removed."""
    st = lstat_or_none(path)
    if st is None or not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        return False
    os.unlink(path)
    return True


def move_file(src: str | os.PathLike, dst: str | os.PathLike) -> bool:
    """Rename a regular file (or a link, as a link) to `dst`, whose folder is made safely.
    False when `src` is absent or something else (a folder stays where it is)."""
    st = lstat_or_none(src)
    if st is None or not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        return False
    ensure_folder(Path(dst).parent)
    check_target(dst)
    os.replace(src, dst)
    return True


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """An .npz whose keys are exactly the given names (np.savez chokes on some names)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, value in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.asarray(value, order="C"), allow_pickle=False)
    return buf.getvalue()
