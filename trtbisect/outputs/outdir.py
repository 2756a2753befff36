"""One --out folder holds one generation of results, written by one run at a time; trtbisect
moves or deletes nothing there but files it listed itself.

A deploy script that reads precision.json must never find the layer precisions, mixed model or
commands of an earlier run beside it, and a user's own files in --out (a `report.md`, the
`inputs/` their samples live in, a `.previous/` of theirs) are never moved, overwritten or
deleted. The manifest `.trtbisect-manifest.json` is trtbisect's list of its own files:
`{"tool": "trtbisect", "format": 2, "complete": bool, "files": [...], "folders": [...]}`, every
file by its path under --out (`inputs/sample_000.npz`, never a whole folder).

A run writes a generation so:

1. `begin` looks at what the folder holds:
   - a complete generation (its manifest says complete and precision.json is there) is retired
     to `.previous/`: the files `.previous/`'s own manifest lists are deleted, file by file, then
     the generation's files move there, precision.json first, and `.previous/`'s manifest marks
     it complete. `.previous/` only ever holds a complete generation; one trtbisect did not
     make (no manifest of ours) is never touched: the run is refused instead;
   - an incomplete one (a run that failed or was killed while writing) is that run's debris:
     its listed files are deleted, file by file, and `.previous/` keeps the last complete
     generation, however many runs fail in a row;
   - no manifest: whatever is there belongs to the user and stays (a warning says so).
   The run's own inputs (the model and its external data, the --inputs files) are never moved
   or deleted, listed or not.
2. every file is listed in the manifest (marked incomplete) before it is written (`claim`,
   called by files.atomic_write in base/files.py); a name where something stands that is
   not trtbisect's (a user's file, a link, a folder) is refused with a one-line error;
3. `commit` marks the manifest complete, then writes precision.json (`trtbisect torch`'s
   torch_plan.json), last of all;
4. a generation whose writing fails is rolled back: its files are deleted and the retired one
   moves back in place, so the folder shows the last good plan again (if even that fails, the
   last good plan is in `.previous/`).

An exclusive, non-blocking flock on `<out>/.trtbisect.lock` refuses a second concurrent run
with a one-line error; the kernel releases it when the process dies, so a stale lock cannot
block the next run. The lock is re-entrant within a process. The lock, the journal, the caches
and every file are opened or replaced without following links (base/files.py).
"""

from __future__ import annotations

import fcntl
import fnmatch
import json
import logging
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ..base import files
from ..errors import TrtBisectError

log = logging.getLogger(__name__)

LOCK = ".trtbisect.lock"
MANIFEST = ".trtbisect-manifest.json"
PREVIOUS = ".previous"
PLAN = "precision.json"
TORCH_PLAN = "torch_plan.json"  # `trtbisect torch`'s plan: its generation ends with it
PLANS = (PLAN, TORCH_PLAN)
JOURNAL = "journal.jsonl"
CACHE = ".cache"
STAGING = ".staging"
CACHE_MARK = ".trtbisect-cache"  # inside .cache/: the folder is trtbisect's own
STAGING_MARK = ".trtbisect-staging"
FORMAT = 2
# trtbisect's own bookkeeping beside a generation: never listed, never retired
OWN = frozenset({LOCK, MANIFEST, JOURNAL, "journal.rejected.jsonl", "journal.previous.jsonl",
                 CACHE, STAGING, PREVIOUS, "trt"})
# What a run writes; {stem} is the model file's stem (`preflight` checks these up front).
RUN_FILES = (PLAN, "layer_precisions.txt", "autocast_nodes_to_exclude.json", "commands.sh",
             "layerwise.json", "trace.json", "data_loader.py", "{stem}.mixed.onnx",
             "{stem}.mixed.emulated.onnx", "{stem}.named.onnx", "{stem}.annotated.onnx")
REPORT_FILES = ("report.html", "report.md", "report_plot.png")  # run --report
REWRITE_FILES = ("{stem}.rewritten.onnx",)  # run --rewrite
SAMPLE = "inputs/sample_{k:03d}.npz"
# Names runs before manifests wrote, for a legacy precision.json's "files" (never folders).
LEGACY_SAMPLES = "sample_[0-9][0-9][0-9]*.npz"
SCRATCH_FILES = ("reference-*.npz", "layerwise-*.json", "*.mixed.onnx", "*.mixed.onnx.data")

_held: dict[str, list[int]] = {}  # resolved folder -> [fd, depth]


class OutputDir:
    """The --out folder of a run."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    @contextmanager
    def locked(self) -> Iterator[OutputDir]:
        """Hold the folder's lock; a second run (another process) gets a usage error. Every
        file written under the folder meanwhile is guarded (base/files.py)."""
        self._mkdir()
        key = os.path.realpath(self.path)
        created = False
        if key in _held:
            _held[key][1] += 1
        else:
            created = files.lstat_or_none(self.path / LOCK) is None
            _held[key] = [self._acquire(), 1]
        failed = False
        try:
            with files.guarded(self.path):
                yield self
        except BaseException:
            failed = True
            raise
        finally:
            _held[key][1] -= 1
            if _held[key][1] == 0:
                self._drop_staging()
                if created and failed and files.lstat_or_none(self.path / MANIFEST) is None:
                    self._drop_lock()  # a refused run leaves the user's folder as it was
                os.close(_held.pop(key)[0])  # closing the descriptor drops the flock

    def _mkdir(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrtBisectError(f"cannot create --out {self.path}: {exc.strerror or exc}") from None
        if not self.path.is_dir():
            raise TrtBisectError(f"--out {self.path} is not a folder")

    def _drop_lock(self) -> None:
        """Unlink the lock file while still holding its flock (`_acquire` makes a run that
        opened it meanwhile try again on the path)."""
        try:
            os.unlink(self.path / LOCK)
        except OSError:
            pass

    def _acquire(self) -> int:
        for _ in range(100):
            fd = self._acquire_once()
            try:
                same = os.path.samestat(os.fstat(fd), os.lstat(self.path / LOCK))
            except OSError:
                same = False
            if same:
                return fd
            os.close(fd)  # the run that held it unlinked it (`_drop_lock`): take the new one
        raise TrtBisectError(f"cannot lock {self.path / LOCK}: it keeps being replaced")

    def _acquire_once(self) -> int:
        lock = self.path / LOCK
        try:
            fd = files.open_in_place(lock, os.O_RDWR | os.O_CREAT)
        except TrtBisectError:
            raise
        except OSError as exc:
            raise TrtBisectError(f"cannot write to --out {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            holder = holder if holder.isdigit() else "?"
            raise TrtBisectError(f"another trtbisect run (pid {holder}) is writing to {self.path}; "
                                 "wait for it to finish or choose another --out") from None
        except OSError as exc:
            os.close(fd)
            raise TrtBisectError(f"cannot lock {lock}: {exc.strerror or exc}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    # ------------------------------------------------------------ scratch folders

    def cache(self) -> Path | None:
        """`.cache/`, when it is trtbisect's own (made here, marked); None when something
        else stands there (a user's `.cache`: resumes then recompute, nothing is written)."""
        return self._own_folder(CACHE, CACHE_MARK)

    def staging(self) -> Path | None:
        """An empty `.staging/` of trtbisect's own for the judged mixed model (moved into place
        by the generation); None when a folder of the user's stands there."""
        folder = self._own_folder(STAGING, STAGING_MARK)
        if folder is not None:
            self._clear(folder)
        return folder

    def _own_folder(self, name: str, mark: str) -> Path | None:
        with files.guarded(self.path):
            folder = self.path / name
            st = files.lstat_or_none(folder)
            if st is None:
                files.ensure_folder(folder)
                _mark(folder / mark)
                return folder
            if stat.S_ISDIR(st.st_mode) and not _is_file(folder / mark) and _adoptable(folder):
                _mark(folder / mark)  # an older trtbisect's, from before folders were marked
            if stat.S_ISDIR(st.st_mode) and _is_file(folder / mark):
                return folder
        log.info("%s is not trtbisect's own (no %s in it); it is left alone", folder, mark)
        return None

    @staticmethod
    def _clear(folder: Path) -> None:
        """The regular files of a marked scratch folder, file by file (the mark stays)."""
        for entry in os.scandir(folder):
            if entry.name != STAGING_MARK and entry.name != CACHE_MARK:
                files.remove_file(entry.path)

    def _drop_staging(self) -> None:
        """A run leaves no `.staging/` behind, whatever ended it."""
        folder = self.path / STAGING
        st = files.lstat_or_none(folder)
        if st is None or not stat.S_ISDIR(st.st_mode) or files.lstat_or_none(
                folder / STAGING_MARK) is None:
            return
        try:
            self._clear(folder)
            files.remove_file(folder / STAGING_MARK)
            os.rmdir(folder)
        except OSError:
            pass

    # ------------------------------------------------------------ generations

    def preflight(self, stem: str, keep: Iterable[str | os.PathLike] = (), samples: int = 0,
                  report: bool = False, rewrite: bool = False) -> None:
        """Refuse, before any long work, a run whose files would land on something that is
        not trtbisect's (a user's report.md, a link, one of the run's own inputs) or that would
        have to retire into a `.previous/` of the user's; warn about the user's files."""
        with self.locked():
            gen = Generation(self, keep)
            names = [n.format(stem=stem) for n in (*RUN_FILES, *(REPORT_FILES if report else ()),
                                                   *(REWRITE_FILES if rewrite else ()))]
            names += [f"{n}.data" for n in names if n.endswith(".onnx")]  # external data
            names += [SAMPLE.format(k=k) for k in range(samples)]
            ours = set(gen.old.files) if gen.old is not None else set()
            for name in names:
                if name not in ours or gen.is_kept(self.path / name):
                    gen.check_free(name)
            if gen.old is not None and gen.old.complete:
                gen.previous_state()
            gen.warn_foreign()

    @contextmanager
    def exporting(self, names: Sequence[str]) -> Iterator[None]:
        """Hold the lock while `run FILE.py:FACTORY` writes its export (`names`: the model, its
        external data, its inputs) into the folder before the run's generation: a name that
        something not trtbisect's holds (the user's own file, a link) is refused, as
        `preflight` refuses the run's files. What the export wrote, whether or not it then
        passed its check against PyTorch, is listed as the manifest's `exported`: out of
        every generation (`Generation.begin` carries it), replaced by the next export."""
        with self.locked():
            gen = Generation(self)
            ours = {*gen.old.files, *gen.old.exported} if gen.old is not None else set()
            for name in names:
                if name not in ours:
                    gen.check_free(name)
            try:
                yield
            finally:
                wrote = [n for n in names if _is_file(self.path / n)]
                if wrote:
                    listed = gen.old or Manifest([], [], False)
                    listed.exported = sorted({*listed.exported, *wrote})
                    listed.write(self.path)

    @contextmanager
    def generation(self, keep: Iterable[str | os.PathLike] = ()) -> Iterator[Generation]:
        """Retire or clear what the folder holds (see the module's docstring), then let the
        caller write the new generation and `commit` it; a failure rolls it back."""
        with self.locked():
            gen = Generation(self, keep)
            gen.begin()
            files.set_claim(self.path, gen.claim)
            try:
                yield gen
            except BaseException:
                files.set_claim(self.path, None)
                gen.rollback()
                raise
            finally:
                files.set_claim(self.path, None)


class Manifest:
    """A listing of trtbisect's files under one folder."""

    def __init__(self, files_: list[str], folders: list[str], complete: bool,
                 exported: Sequence[str] = ()) -> None:
        self.files, self.folders, self.complete = files_, folders, complete
        # what `run FILE.py:FACTORY` exported here (`OutputDir.exporting`): trtbisect's, out of
        # every generation (never retired or deleted by one), replaced by the next export
        self.exported = list(exported)

    def to_json(self) -> dict:
        return {"tool": "trtbisect", "format": FORMAT, "complete": self.complete,
                "files": self.files, "folders": self.folders,
                **({"exported": self.exported} if self.exported else {})}

    @classmethod
    def read(cls, folder: Path) -> Manifest | None:
        """The folder's manifest; an older trtbisect's (`{"files": [...]}`, or only a
        precision.json of trtbisect's) read as complete; None when the folder has none."""
        try:
            data = json.loads(files.read_in_place(folder / MANIFEST) or b"null")
        except (OSError, ValueError, TrtBisectError):
            data = None
        if isinstance(data, dict) and isinstance(data.get("files"), list):
            names = [n for n in data["files"] if isinstance(n, str) and _plain(n)]
            folders = [n for n in data.get("folders", []) if isinstance(n, str) and _plain(n)]
            if data.get("tool") == "trtbisect":
                exported = data.get("exported", [])
                return cls(names, folders, data.get("complete") is True,
                           [n for n in exported if isinstance(n, str) and _plain(n)]
                           if isinstance(exported, list) else [])
            return cls(_legacy(folder, names), [], True)
        for name in PLANS:  # a run from before manifests (or a `torch` run's): its plan
            plan = _trtbisect_plan(folder / name)  # lists its files
            if plan is not None:
                listed = plan.get("files")
                names = [Path(v).name for v in (listed.values() if isinstance(listed, dict)
                                                 else []) if isinstance(v, str)]
                return cls(_legacy(folder, [*names, name]), [], True)
        return None

    def write(self, folder: Path) -> None:
        from ..base.files import atomic_write_json
        atomic_write_json(folder / MANIFEST, self.to_json())


class Generation:
    """The files one run writes to its --out folder."""

    def __init__(self, out: OutputDir, keep: Iterable[str | os.PathLike] = ()) -> None:
        self.out = out
        self.folder = out.path
        self.keep = {_identity(p) for p in keep} - {None}
        self.old = Manifest.read(self.folder)
        self.new = Manifest([], [], False)
        self.retired: list[str] = []  # what moved to .previous in this run (for rollback)
        self.began = False

    # ------------------------------------------------------------ what is there

    def is_kept(self, path: Path) -> bool:
        return _identity(path) in self.keep

    def check_free(self, name: str) -> None:
        """Nothing stands at `name` but trtbisect's own listed file."""
        path = self.folder / name
        st = files.lstat_or_none(path)
        if st is None:
            return
        if not stat.S_ISREG(st.st_mode):
            raise files.refusal(path, st)
        if self.is_kept(path):
            raise TrtBisectError(f"{path} is an input of this run, and the run must write a file "
                                 "of that name there; copy it elsewhere or choose another --out")
        raise TrtBisectError(f"--out {self.folder} holds {name}, which no trtbisect run wrote "
                             "there; move it away or choose another --out (trtbisect never "
                             "overwrites a file it did not list)")

    def previous_state(self) -> Manifest | None:
        """`.previous/`'s manifest (None: absent); refused when something of the user's
        stands there."""
        prev = self.folder / PREVIOUS
        st = files.lstat_or_none(prev)
        if st is None:
            return None
        manifest = Manifest.read(prev) if stat.S_ISDIR(st.st_mode) else None
        if manifest is None:
            raise TrtBisectError(f"{prev} was not made by trtbisect (it holds no manifest of "
                                 "ours) and the earlier results must move there; move it away "
                                 "or choose another --out")
        return manifest

    def foreign(self) -> list[str]:
        listed = {n.split("/", 1)[0]
                  for n in ([*self.old.files, *self.old.exported] if self.old else [])}
        return sorted(n for n in os.listdir(self.folder)
                      if n not in OWN and n not in listed and not n.startswith(".trtbisect-"))

    def warn_foreign(self) -> None:
        other = self.foreign()
        if other:
            shown = ", ".join(repr(n) for n in other[:5]) + (", ..." if len(other) > 5 else "")
            log.warning("--out %s already holds %d entr%s no trtbisect run wrote (%s); they "
                        "stay untouched", self.folder, len(other), "y" if len(other) == 1 else "ies",
                        shown)

    # ------------------------------------------------------------ the generation

    def begin(self) -> None:
        old = self.old
        if old is not None and old.complete and any(
                name in old.files and _is_file(self.folder / name) for name in PLANS):
            self._retire(old)
        elif old is not None:  # a run that failed or was killed while writing: its debris
            self._delete(self.folder, old)
        self.new.exported = [n for n in (old.exported if old is not None else [])
                             if _is_file(self.folder / n)]  # the export stays trtbisect's
        self.new.write(self.folder)
        self.began = True

    def _retire(self, old: Manifest) -> None:
        prev_dir = self.folder / PREVIOUS
        prev = self.previous_state()
        if prev is not None and prev.complete:
            self._delete(prev_dir, prev)
            carried: list[str] = []
        else:  # an interrupted retire's files: they are this generation's, keep them
            carried = prev.files if prev is not None else []
        files.ensure_folder(prev_dir)
        moving = [n for n in old.files if not self.is_kept(self.folder / n)]
        listed = sorted({*carried, *moving})
        Manifest(listed, _parents(listed), False).write(prev_dir)
        for name in sorted(moving, key=lambda n: n not in PLANS):  # the plan leaves first
            if files.move_file(self.folder / name, prev_dir / name):
                self.retired.append(name)
        listed = sorted({*carried, *self.retired})
        Manifest(listed, _parents(listed), True).write(prev_dir)
        _remove_folders(self.folder, old.folders)

    def _delete(self, folder: Path, manifest: Manifest) -> None:
        """The listed files, file by file (never the run's inputs), then the listed folders
        that are left empty, then the manifest."""
        for name in manifest.files:
            if not self.is_kept(folder / name):
                files.remove_file(folder / name)
        _remove_folders(folder, manifest.folders)
        files.remove_file(folder / MANIFEST)

    def claim(self, name: str) -> None:
        """List `name` (a path under --out) before it is written; refuse it when something
        not trtbisect's stands there. Scratch and bookkeeping paths are not listed."""
        if name.split("/", 1)[0] in OWN or name in self.new.files:
            return
        if not _plain(name):
            raise TrtBisectError(f"trtbisect will not write {name!r} under --out")
        self.check_free(name)
        parts = name.split("/")[:-1]
        for k in range(1, len(parts) + 1):
            sub = "/".join(parts[:k])
            if files.lstat_or_none(self.folder / sub) is None and sub not in self.new.folders:
                self.new.folders.append(sub)
        self.new.files.append(name)
        self.new.write(self.folder)

    def commit(self, plan: object, name: str = PLAN) -> None:
        """The manifest says complete, then the plan (precision.json; `trtbisect torch`'s
        torch_plan.json): the plan appears last, with all its files."""
        from ..base.files import atomic_write_json

        assert name in PLANS, name
        self.claim(name)
        self.new.complete = True
        self.new.write(self.folder)
        atomic_write_json(self.folder / name, plan)

    def rollback(self) -> None:
        """A failed write: delete what this generation wrote, move the retired one back."""
        if not self.began:
            return
        try:
            self.new.complete = False
            self._delete(self.folder, self.new)
            prev_dir = self.folder / PREVIOUS
            if self.retired:
                for name in self.retired:
                    files.move_file(prev_dir / name, self.folder / name)
                assert self.old is not None
                Manifest(self.old.files, self.old.folders, True,
                         self.old.exported).write(self.folder)
                files.remove_file(prev_dir / MANIFEST)
                _remove_folders(prev_dir, _parents(self.retired), remove_root=True)
            elif self.new.exported:  # still trtbisect's: the next export may replace it
                Manifest([], [], False, self.new.exported).write(self.folder)
        except (OSError, TrtBisectError) as exc:  # the last good plan is still in .previous/
            log.warning("could not restore the earlier results after the failure (%s); they "
                        "are in %s", exc, self.folder / PREVIOUS)


# ---------------------------------------------------------------- helpers

def _plain(name: str) -> bool:
    """A relative path under --out without `..`, `.`, absolute parts or backslashes."""
    parts = name.split("/")
    return (bool(name) and "\\" not in name and "\0" not in name and len(parts) <= 2
            and all(p not in ("", ".", "..") for p in parts))


def _parents(names: Iterable[str]) -> list[str]:
    return sorted({n.rsplit("/", 1)[0] for n in names if "/" in n})


def _is_file(path: Path) -> bool:
    st = files.lstat_or_none(path)
    return st is not None and stat.S_ISREG(st.st_mode)


def _identity(path: str | os.PathLike) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _trtbisect_plan(path: Path) -> dict | None:
    try:
        data = json.loads(files.read_in_place(path) or b"null")
    except (OSError, ValueError, TrtBisectError):
        return None
    return data if isinstance(data, dict) and data.get("tool") == "trtbisect" else None


def _legacy(folder: Path, names: list[str]) -> list[str]:
    """An older trtbisect's listing: regular files only; its `inputs` folder stands for the
    samples it wrote there (`inputs/sample_NNN.npz`), not for the user's files beside them."""
    out = []
    for name in dict.fromkeys(names):
        if name == "inputs" and (folder / "inputs").is_dir():
            out += sorted(f"inputs/{n}" for n in os.listdir(folder / "inputs")
                          if fnmatch.fnmatchcase(n, LEGACY_SAMPLES))
        elif _is_file(folder / name):
            out.append(name)
    return out


def _mark(path: Path) -> None:
    def write(tmp: str) -> None:
        Path(tmp).write_text("made by trtbisect: its own scratch, safe to delete\n",
                             encoding="utf-8")
    files.atomic_write(path, write)


def _adoptable(folder: Path) -> bool:
    """A scratch folder an older trtbisect made before folders were marked: nothing in it but
    what trtbisect puts there."""
    return all(any(fnmatch.fnmatchcase(n, p) for p in SCRATCH_FILES) for n in os.listdir(folder))


def _remove_folders(folder: Path, names: Iterable[str], remove_root: bool = False) -> None:
    """Folders trtbisect made, once empty (deepest first); a folder with anything in it stays."""
    for name in sorted(set(names), key=lambda n: -n.count("/")):
        _rmdir(folder / name)
    if remove_root:
        _rmdir(folder)


def _rmdir(path: Path) -> None:
    st = files.lstat_or_none(path)
    if st is not None and stat.S_ISDIR(st.st_mode):
        try:
            os.rmdir(path)
        except OSError:
            pass
