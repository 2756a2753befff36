"""An append-only journal of evaluations, so that an interrupted search resumes where it was.

Each line is canonical JSON with a `sum`: the sha256 of the run's fingerprint followed by the
record (without `sum`), both as canonical JSON, so a record is valid only for the run it was written by. A `start` line
is written before an evaluation runs and a `done` line after. On resume:

- a `done` plan is replayed without running it;
- a plan with a `start` but no `done` was in flight when the process died (SIGKILL, Ctrl-C,
  power loss) and is run again: a kill says nothing about the plan;
- a plan started `MAX_ATTEMPTS` times without ever finishing crashes the process itself (as
  Polygraphy's `debug` replay files record) and is judged failed instead of crashing it again;
  an `abandon` line takes back a start that bad input stopped (a `--check` hook that raised):
  no verdict is ever recorded from it;
- a journal whose header, fingerprint or any complete line fails validation is set aside
  (renamed, with a warning), never trusted; only a last line cut short by a kill is tolerated.

The checksum catches damage, truncation, a foreign or hand-edited journal; it is not a
signature against someone who recomputes it.

Durability: every line is flushed to the OS at once, which is what survives SIGKILL (the kernel
keeps written data). fsync only guards against power loss, so it is grouped: at most once per
`SYNC_SECONDS` (a second), and on close; a power cut loses at most the last second of
evaluations, which the resumed run simply repeats.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..base import files
from ..errors import TrtBisectError

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3  # starts without a done before a plan is judged to crash the process
SYNC_SECONDS = 1.0  # group commit: at most one fsync per second
FORMAT = 3  # 3: each verdict records its pressure per output (search/noise.py)


def plan_key(fp32: Iterable[str]) -> str:
    return json.dumps(sorted(fp32))


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


class JournalRejected(Exception):
    """The journal on disk cannot be used; it is set aside. `intact`: a sound journal of
    another run (another model, inputs or options), not a damaged one."""

    def __init__(self, why: str, intact: bool = False) -> None:
        super().__init__(why)
        self.intact = intact


def _other_runs_header(line: bytes, fingerprint: dict[str, Any]) -> bool:
    """A sound header (its checksum holds under its own fingerprint) of another run's journal."""
    try:
        rec = json.loads(line.decode("utf-8"))
        theirs = rec.get("fingerprint")
        if not isinstance(theirs, dict) or theirs == fingerprint:
            return False
        given = rec.pop("sum", None)
        h = hashlib.sha256(canonical(theirs))
        h.update(canonical(rec))
        return given == h.hexdigest()
    except (UnicodeDecodeError, ValueError, AttributeError, TypeError):
        return False


class Journal:
    """Records evaluations of one run (identified by `fingerprint`) in `path`."""

    def __init__(self, path: Path, fingerprint: dict[str, Any]) -> None:
        self.path = Path(path)
        self.fingerprint = fingerprint
        self._salted = hashlib.sha256(canonical(fingerprint))  # the checksum's prefix
        self.done: dict[str, dict[str, Any]] = {}
        self.starts: Counter[str] = Counter()
        self._synced_at = time.monotonic()
        self._load()
        # appended in place: never through a planted link or into a hard-linked file
        fd = files.open_in_place(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        self._fh = os.fdopen(fd, "a", encoding="utf-8")
        if os.fstat(fd).st_size == 0:
            self._write({"fingerprint": fingerprint, "format": FORMAT})

    # ------------------------------------------------------------------ reading

    def _load(self) -> None:
        if files.lstat_or_none(self.path) is None:
            return
        try:
            good_bytes = self._parse()
        except JournalRejected as why:
            self.done.clear()
            self.starts.clear()
            self._set_aside(str(why), why.intact)
            return
        if good_bytes is not None:  # drop a last line cut short by a kill before appending
            fd = files.open_in_place(self.path, os.O_WRONLY)
            try:
                os.ftruncate(fd, good_bytes)
            finally:
                os.close(fd)
        if self.done or self.starts:
            log.warning("resuming: %d evaluations already in %s (--no-resume starts afresh)",
                        len(self.done), self.path)

    def _parse(self) -> int | None:
        """Fill done/starts; return the length to truncate to when the last line is partial."""
        try:
            data = files.read_in_place(self.path) or b""
        except TrtBisectError:
            raise JournalRejected("not a regular file") from None
        except OSError as exc:
            raise JournalRejected(f"unreadable ({exc.strerror})") from exc
        complete, sep, partial = data.rpartition(b"\n")
        lines = complete.split(b"\n") if sep else []
        if not lines:
            if partial:  # a header cut short: nothing was recorded yet
                return 0
            return None
        if _other_runs_header(lines[0], self.fingerprint):
            raise JournalRejected("from a different model, inputs, options or version",
                                  intact=True)
        header = self._decode(lines[0], 1)
        if header.get("fingerprint") != self.fingerprint or header.get("format") != FORMAT:
            raise JournalRejected("from a different model, inputs, options or version")
        for number, line in enumerate(lines[1:], 2):
            rec = self._decode(line, number)
            if isinstance(rec.get("start"), str):
                self.starts[rec["start"]] += 1
            elif isinstance(rec.get("abandon"), str):  # not a crash: bad input stopped it
                self.starts[rec["abandon"]] = max(self.starts[rec["abandon"]] - 1, 0)
            elif isinstance(rec.get("done"), str) and isinstance(rec.get("passed"), bool):
                self.done[rec["done"]] = rec
            else:
                raise JournalRejected(f"line {number} is no journal record")
        return len(complete) + 1 if partial else None

    def _decode(self, line: bytes, number: int) -> dict[str, Any]:
        try:
            rec = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise JournalRejected(f"line {number} is not JSON") from None
        if not isinstance(rec, dict) or rec.pop("sum", None) != self._checksum(rec):
            if number == 1:
                raise JournalRejected("from a different model, inputs, options or version")
            raise JournalRejected(f"line {number} fails its checksum")
        return rec

    def _checksum(self, rec: dict[str, Any]) -> str:
        return self._seal(canonical(rec))

    def _seal(self, body: bytes) -> str:
        h = self._salted.copy()
        h.update(body)
        return h.hexdigest()

    def _set_aside(self, why: str, intact: bool = False) -> None:
        """Rename it (a link as a link); an intact journal of another run is kept as
        `journal.previous.jsonl` without alarm, a damaged one as `journal.rejected.jsonl`."""
        aside = self.path.with_name(
            f"{self.path.stem}.{'previous' if intact else 'rejected'}{self.path.suffix}")
        try:
            files.check_target(aside)
            os.replace(self.path, aside)
        except (OSError, TrtBisectError) as exc:
            raise TrtBisectError(f"cannot set aside the journal {self.path} ({why}): "
                                 f"{getattr(exc, 'strerror', None) or exc}; move it away or "
                                 "choose another --out") from None
        if intact:
            log.info("journal %s is another run's (%s); kept as %s, this run starts its own",
                     self.path, why, aside)
        else:
            log.warning("journal %s is not trusted (%s); set it aside as %s and starting afresh",
                        self.path, why, aside)

    # ------------------------------------------------------------------ the API

    def lookup(self, key: str) -> dict[str, Any] | None:
        """The finished record of a plan, or None when it must be run (again)."""
        if key in self.done:
            return self.done[key]
        attempts = self.starts.get(key, 0)
        if attempts >= MAX_ATTEMPTS:
            log.warning("plan %s was started %d times and never finished (it crashes the "
                        "process?); judging it failed", key, attempts)
            self.record(key, False, {"crashed": True, "attempts": attempts})
            return self.done[key]
        if attempts:
            log.info("plan %s was in flight when the last run stopped; running it again", key)
        return None

    def peek(self, key: str) -> bool | None:
        """The verdict `lookup` would give without running the plan, writing nothing."""
        if key in self.done:
            return bool(self.done[key]["passed"])
        return False if self.starts.get(key, 0) >= MAX_ATTEMPTS else None

    def start(self, key: str) -> None:
        self.starts[key] += 1
        self._write({"start": key})

    def abandon(self, key: str) -> None:
        """The evaluation started for `key` was stopped by bad input (a --check hook that
        raised): no verdict, and the start does not count towards a crash."""
        self.starts[key] = max(self.starts[key] - 1, 0)
        self._write({"abandon": key})

    def record(self, key: str, passed: bool, detail: dict[str, Any]) -> None:
        rec = {**detail, "done": key, "passed": bool(passed)}
        self._write(rec)
        self.done[key] = rec

    def sync(self) -> None:
        """Force what was written to stable storage (power-loss safety)."""
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._synced_at = time.monotonic()

    def _write(self, rec: dict[str, Any]) -> None:
        body = canonical(rec)  # one serialisation: the checksum is spliced in as the last key
        sealed = f'{body[:-1].decode()}{"," if len(body) > 2 else ""}"sum":"{self._seal(body)}"}}'
        try:
            self._fh.write(sealed + "\n")
            self._fh.flush()  # in the kernel now: survives SIGKILL
            if time.monotonic() - self._synced_at >= SYNC_SECONDS:
                self.sync()
        except OSError as exc:  # a full disk names no file: say which
            raise files.named(exc, self.path) from None

    def close(self) -> None:
        if not self._fh.closed:
            self.sync()
            self._fh.close()
