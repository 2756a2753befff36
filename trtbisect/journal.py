"""An append-only journal of evaluations, so that an interrupted search resumes where it was.

Each line is JSON. A `start` line is written before an evaluation runs and a `done` line after:
a plan that has a start but no done crashed the process last time and is judged failed on
rerun instead of crashing it again. A journal whose fingerprint (model, inputs, tolerance,
options) differs from this run's is set aside, never mixed in.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Iterable

log = logging.getLogger(__name__)


def plan_key(fp32: Iterable[str]) -> str:
    return json.dumps(sorted(fp32))


class Journal:
    def __init__(self, path: Path, fingerprint: dict[str, Any]) -> None:
        self.path = path
        self.fingerprint = fingerprint
        self.done: dict[str, dict[str, Any]] = {}
        self.crashed: set[str] = set()
        self._load()
        self._fh = open(self.path, "a", encoding="utf-8")
        if self.path.stat().st_size == 0:
            self._write({"fingerprint": fingerprint})

    def _load(self) -> None:
        if not self.path.exists():
            return
        lines = self.path.read_text(encoding="utf-8").splitlines()
        try:
            header = json.loads(lines[0]) if lines else {}
        except json.JSONDecodeError:
            header = {}
        if header.get("fingerprint") != self.fingerprint:
            stale = self.path.with_suffix(".stale.jsonl")
            os.replace(self.path, stale)
            log.warning("journal %s is from a different run; moved it to %s", self.path, stale)
            return
        started: set[str] = set()
        for line in lines[1:]:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            if "start" in rec:
                started.add(rec["start"])
            elif "done" in rec:
                self.done[rec["done"]] = rec
        self.crashed = started - self.done.keys()
        if self.done:
            log.info("resuming: %d evaluations already in %s", len(self.done), self.path)

    def lookup(self, key: str) -> dict[str, Any] | None:
        if key in self.done:
            return self.done[key]
        if key in self.crashed:
            log.warning("plan %s crashed the last run; judging it failed", key)
            self.record(key, False, {"crashed": True})
            return self.done[key]
        return None

    def start(self, key: str) -> None:
        self._write({"start": key})

    def record(self, key: str, passed: bool, detail: dict[str, Any]) -> None:
        rec = {"done": key, "passed": passed, **detail}
        self.done[key] = rec
        self._write(rec)

    def _write(self, rec: dict[str, Any]) -> None:
        self._fh.write(json.dumps(rec) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()
