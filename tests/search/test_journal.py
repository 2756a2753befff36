"""The journal: what resumes, what is re-run, what is skipped, what is never trusted."""

from __future__ import annotations

import json
import logging
import os

import pytest

from trtbisect.search import journal as journal_mod
from trtbisect.search.journal import MAX_ATTEMPTS, Journal, plan_key

FP = {"model": "m" * 64, "samples": "s" * 64, "tolerance": {"rtol": 0.01}, "strict": False}
A, B, C = plan_key(["a"]), plan_key(["a", "b"]), plan_key([])


def write_some(path, fingerprint=FP):
    j = Journal(path, fingerprint)
    j.start(A)
    j.record(A, True, {"rel": {"y": 0.001}})
    j.start(B)
    j.record(B, False, {"rel": {"y": float("inf")}})
    j.close()


def test_finished_evaluations_are_replayed(tmp_path):
    path = tmp_path / "journal.jsonl"
    write_some(path)
    j = Journal(path, FP)
    assert j.lookup(A)["passed"] is True and j.lookup(B)["passed"] is False
    assert j.lookup(C) is None
    j.close()


def test_an_evaluation_in_flight_at_a_kill_is_run_again(tmp_path):
    path = tmp_path / "journal.jsonl"
    write_some(path)
    j = Journal(path, FP)
    j.start(C)  # killed here: the start is on disk, the done never comes
    del j
    again = Journal(path, FP)
    assert again.lookup(C) is None  # run again, not judged failed
    assert C not in again.done


def test_a_plan_that_crashes_every_attempt_is_skipped(tmp_path):
    path = tmp_path / "journal.jsonl"
    for attempt in range(MAX_ATTEMPTS):
        j = Journal(path, FP)
        assert j.lookup(C) is None, f"attempt {attempt + 1} must run the plan"
        j.start(C)  # ...and crash
        j._fh.close()
    j = Journal(path, FP)
    rec = j.lookup(C)
    assert rec is not None and rec["passed"] is False and rec["crashed"] is True
    j.close()
    assert Journal(path, FP).lookup(C)["passed"] is False  # the verdict is journaled too


def test_a_forged_record_sets_the_journal_aside(tmp_path, caplog):
    caplog.set_level(logging.WARNING)  # an earlier CLI test may have quietened the root logger
    path = tmp_path / "journal.jsonl"
    write_some(path)
    lines = path.read_text().splitlines()
    forged = json.loads(lines[-1])
    forged["passed"] = True  # flip a failed verdict, keep the old checksum
    path.write_text("\n".join([*lines[:-1], json.dumps(forged)]) + "\n")
    j = Journal(path, FP)
    assert j.done == {} and j.lookup(B) is None
    assert (tmp_path / "journal.rejected.jsonl").exists()
    assert "not trusted" in caplog.text


def test_a_record_without_checksum_is_not_trusted(tmp_path):
    path = tmp_path / "journal.jsonl"
    write_some(path)
    with open(path, "a") as fh:
        fh.write(json.dumps({"done": C, "passed": True}) + "\n")
    assert Journal(path, FP).lookup(C) is None


@pytest.mark.parametrize("content", [b"", b"\xff\xfe garbage\n", b"[1, 2]\n", b"{}\n",
                                     b'{"fingerprint": {}}\n'])
def test_corrupt_or_foreign_journals_are_set_aside(tmp_path, content):
    path = tmp_path / "journal.jsonl"
    path.write_bytes(content)
    j = Journal(path, FP)
    j.start(A)
    j.record(A, True, {})
    j.close()
    assert Journal(path, FP).lookup(A)["passed"] is True  # the fresh journal works


def test_a_journal_of_another_run_is_set_aside(tmp_path):
    """Another run's sound journal is not "rejected" (nothing is wrong with it): it is kept as
    journal.previous.jsonl, byte for byte; a forged one is still rejected."""
    path = tmp_path / "journal.jsonl"
    write_some(path, {**FP, "strict": True})
    before = path.read_bytes()
    assert Journal(path, FP).lookup(A) is None
    assert (tmp_path / "journal.previous.jsonl").read_bytes() == before
    assert not (tmp_path / "journal.rejected.jsonl").exists()
    forged = before.replace(b'"strict":true', b'"strict":false', 1)
    path.write_bytes(forged.replace(b"{", b"{\"x\":1,", 1))
    Journal(path, {**FP, "tolerance": 1}).close()
    assert (tmp_path / "journal.rejected.jsonl").exists()


@pytest.mark.parametrize("planted", ["symlink", "hardlink", "fifo"])
def test_the_journal_never_writes_through_a_planted_file(tmp_path, planted):
    """A journal.jsonl that is a link to another file (or a pipe) is set aside, never
    appended to or truncated: the other file keeps its bytes, and no open blocks."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    path = tmp_path / "out" / "journal.jsonl"
    path.parent.mkdir()
    if planted == "symlink":
        path.symlink_to(victim)
    elif planted == "hardlink":
        os.link(victim, path)
    else:
        os.mkfifo(path)
    j = Journal(path, FP)
    j.start(A)
    j.record(A, True, {})
    j.close()
    assert victim.read_bytes() == b"precious\n"
    assert path.is_file() and not path.is_symlink() and os.stat(path).st_nlink == 1
    assert Journal(path, FP).lookup(A)["passed"] is True


def test_a_folder_in_place_of_the_journal_is_set_aside(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.mkdir()
    Journal(path, FP).close()
    assert path.is_file()


def test_a_last_line_cut_short_is_tolerated_and_dropped(tmp_path):
    path = tmp_path / "journal.jsonl"
    write_some(path)
    with open(path, "ab") as fh:
        fh.write(b'{"done": "[\\"x')  # a kill in the middle of a write
    j = Journal(path, FP)
    assert j.lookup(A)["passed"] is True
    j.record(C, True, {})
    j.close()
    assert Journal(path, FP).lookup(C)["passed"] is True  # appended after the cut, not onto it


class FrozenClock:
    """The journal's clock, moved by the test alone: fsync grouping without wall-clock time."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_fsync_is_grouped(tmp_path, monkeypatch):
    calls = []
    clock = FrozenClock()
    monkeypatch.setattr(journal_mod, "time", clock)
    monkeypatch.setattr(journal_mod.os, "fsync", lambda fd: calls.append(fd))
    j = Journal(tmp_path / "journal.jsonl", FP)
    for k in range(500):
        j.start(plan_key([str(k)]))
        j.record(plan_key([str(k)]), True, {})
    assert calls == []  # 1000 lines within one SYNC_SECONDS: no fsync at all
    clock.now += journal_mod.SYNC_SECONDS
    j.record(plan_key(["late"]), True, {})
    assert len(calls) == 1  # a second later, one fsync for everything so far
    j.record(plan_key(["later"]), True, {})
    assert len(calls) == 1
    j.close()
    assert len(calls) == 2  # close makes everything durable


def test_journal_costs_under_a_tenth_of_an_evaluation(tmp_path, monkeypatch):
    """What journaling one evaluation costs, counted (its time against an evaluation's is
    measured by scripts/bench_journal.py, docs/search_benchmark.md): one lookup in a dict, two
    short lines each written and flushed once, and no fsync within SYNC_SECONDS."""
    writes, flushes, syncs = [], [], []
    monkeypatch.setattr(journal_mod, "time", FrozenClock())
    monkeypatch.setattr(journal_mod.os, "fsync", lambda fd: syncs.append(fd))
    j = Journal(tmp_path / "journal.jsonl", FP)
    fh = j._fh
    real_write, real_flush = fh.write, fh.flush
    monkeypatch.setattr(fh, "write", lambda text: writes.append(text) or real_write(text))
    monkeypatch.setattr(fh, "flush", lambda: flushes.append(1) or real_flush())
    plans = [plan_key([f"/blocks.{k}/ln2/Pow", f"/blocks.{k}/ln2/Add"]) for k in range(20)]
    for key in plans:
        assert j.lookup(key) is None
        j.start(key)
        j.record(key, True, {"rel": {"y": 0.00123}, "nonfinite_tensors": []})
    assert len(writes) == len(flushes) == 2 * len(plans) and not syncs
    assert max(len(w) for w in writes) < 300  # a line is a few hundred bytes at most
    j.close()
