"""One --out folder holds one generation of results, written by one run at a time.

A deploy script that reads precision.json must never find the layer precisions, mixed model or
commands of an earlier run beside it. So a run's files are written as a generation:

1. the earlier generation is retired first, precision.json before anything else: its files
   (listed in the manifest, or the names trtbisect writes when an older version left no
   manifest) move to `<out>/.previous/`, which holds the last retired generation only;
2. the new files are written, each atomically (plan.atomic_write);
3. the manifest (`.trtbisect-manifest.json`, the generation's file names) is written, and
   precision.json last of all.

While precision.json is absent the folder holds no plan; once it is present, every file the
manifest lists belongs to it. The journal (resume), the lock and the run's own inputs stay.

An exclusive, non-blocking flock on `<out>/.trtbisect.lock` refuses a second concurrent run
with a one-line error; the kernel releases it when the process dies, so a stale lock cannot
block the next run. The lock is re-entrant within a process.
"""

from __future__ import annotations

import fcntl
import fnmatch
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from .errors import TrtBisectError
from .plan import atomic_write_json

LOCK = ".trtbisect.lock"
MANIFEST = ".trtbisect-manifest.json"
PREVIOUS = ".previous"
PLAN = "precision.json"
JOURNAL = "journal.jsonl"
# What runs before manifests existed wrote; retired when no manifest says otherwise.
LEGACY = (PLAN, "layer_precisions.txt", "autocast_nodes_to_exclude.json", "commands.sh",
          "layerwise.json", "trace.json", "report.html", "report.md", "*.mixed.onnx",
          "*.named.onnx", "*.annotated.onnx")

_held: dict[str, list[int]] = {}  # resolved folder -> [fd, depth]


class OutputDir:
    """The --out folder of a run."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    @contextmanager
    def locked(self) -> Iterator["OutputDir"]:
        """Hold the folder's lock; a second run (another process) gets a usage error."""
        self._mkdir()
        key = str(self.path.resolve())
        if key in _held:
            _held[key][1] += 1
        else:
            _held[key] = [self._acquire(), 1]
        try:
            yield self
        finally:
            _held[key][1] -= 1
            if _held[key][1] == 0:
                os.close(_held.pop(key)[0])  # closing the descriptor drops the flock

    def _mkdir(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrtBisectError(f"cannot create --out {self.path}: {exc.strerror or exc}") from None

    def _acquire(self) -> int:
        lock = self.path / LOCK
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise TrtBisectError(f"cannot write to --out {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise TrtBisectError(f"another trtbisect run (pid {holder}) is writing to {self.path}; "
                                 "wait for it to finish or choose another --out") from None
        except OSError as exc:
            os.close(fd)
            raise TrtBisectError(f"cannot lock {lock}: {exc.strerror or exc}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    @contextmanager
    def generation(self, keep: Iterable[str | os.PathLike] = ()) -> Iterator["Generation"]:
        """Retire the earlier generation (never the paths in `keep`), then let the caller
        write the new one and `commit` it."""
        with self.locked():
            gen = Generation(self, {_resolved(p) for p in keep})
            gen.retire()
            yield gen


class Generation:
    """The files one run writes to its --out folder."""

    def __init__(self, out: OutputDir, keep: set[str]) -> None:
        self.out, self.keep = out, keep

    def retire(self) -> None:
        """Move the earlier generation into .previous/, precision.json first."""
        folder = self.out.path
        old = self._old_files()
        if not old:
            return
        previous = folder / PREVIOUS
        _remove(previous)
        previous.mkdir()
        for name in sorted(old, key=lambda n: n != PLAN):  # the plan leaves first
            os.replace(folder / name, previous / name)

    def _old_files(self) -> list[str]:
        folder = self.out.path
        try:
            listed = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["files"]
            names = [n for n in listed if isinstance(n, str) and _plain(n)]
        except (OSError, ValueError, KeyError, TypeError):
            present = [p.name for p in folder.iterdir()]
            names = [n for n in present if any(fnmatch.fnmatchcase(n, pat) for pat in LEGACY)]
        names = [n for n in dict.fromkeys([*names, PLAN, MANIFEST])
                 if n not in (JOURNAL, LOCK, PREVIOUS)
                 and _resolved(folder / n) not in self.keep
                 and ((folder / n).exists() or (folder / n).is_symlink())]
        return names

    def commit(self, files: Mapping[str, str], plan: object) -> None:
        """The manifest, then precision.json: the plan appears last, with all its files."""
        folder = self.out.path.resolve()
        names = sorted({Path(p).name for p in files.values()
                        if Path(p).resolve().parent == folder} - {JOURNAL, PLAN})
        atomic_write_json(self.out.path / MANIFEST, {"files": [*names, PLAN]})
        atomic_write_json(self.out.path / PLAN, plan)


def _plain(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name


def _resolved(path: str | os.PathLike) -> str:
    return str(Path(path).resolve())


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
