"""An aimed search (stages/spread.py: the margin too thin, the bound capped inside the spread)
journals its verdicts like the first search, each under its own bound: a killed run resumes
them to the plan an uninterrupted run reaches, and a verdict under one bound is never replayed
under another."""

from __future__ import annotations

import json
import math
import signal
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.judge.test_trust import _conv_detector
from trtbisect.judge.compare import Tolerance, compare_outputs
from trtbisect.search.journal import Journal
from trtbisect.stages.evaluator import Evaluator
from trtbisect.stages.search import aimed_scope

# The detector head's error with conv1 alone kept FP32, over all-FP16's: the first search finds
# {conv1}, passing a bound a hair above it by less than the spread, and one aimed round
# searches again (10 evaluations) and keeps conv1 and the head.
CONV1_RATIO = 0.6403610631732244


def _planted(tmp_path: Path) -> tuple[Path, Path, Tolerance]:
    from trtbisect.backends.ort import Emulator, Reference
    from trtbisect.graph import Graph

    m, path, inputs = _conv_detector(tmp_path)
    g, x = Graph(m), dict(np.load(inputs))
    ref = Reference(g).run(x)
    rel = compare_outputs(ref, Emulator(g).run(frozenset(), x), Tolerance(0.0))["score"].rel
    assert math.isclose(compare_outputs(ref, Emulator(g).run(frozenset({"conv1"}), x),
                                        Tolerance(0.0))["score"].rel / rel, CONV1_RATIO,
                        rel_tol=1e-6)
    return path, inputs, Tolerance(rel * CONV1_RATIO * (1 + 1e-6))


def _counting(monkeypatch) -> list[frozenset[str]]:
    """The plans judged by inference (a replayed verdict is not)."""
    calls: list[frozenset[str]] = []
    real = Evaluator.measure

    def measure(self, plan, stop_early=False, full=False):
        calls.append(plan)
        return real(self, plan, stop_early, full)
    monkeypatch.setattr(Evaluator, "measure", measure)
    return calls


def _records(journal: Path) -> tuple[str, list[str]]:
    header, *lines = journal.read_text().splitlines()
    return header, lines


def _same_bar_timings(a: dict, b: dict) -> None:
    """precision.json of two runs, equal but for the seconds and the inferences this process
    ran (a replayed verdict runs none)."""
    for doc in (a, b):
        doc.pop("seconds"), doc.pop("inferences")
        for s in doc["stages"]:
            s.pop("seconds")
    assert a == b


def test_a_run_cut_in_an_aimed_round_resumes_to_the_same_plan(tmp_path, monkeypatch):
    from trtbisect.context import Options
    from trtbisect.pipeline import run

    path, inputs, tol = _planted(tmp_path)
    # the resume of an aimed round is the subject: no validation (test_validation.py has it)
    opts = Options.of(inputs=[str(inputs)], tolerance=tol, semantics="strict", validation_share=0)
    out = tmp_path / "out"
    calls = _counting(monkeypatch)
    fresh = run(path, opts, out)
    fresh_calls, fresh_doc = list(calls), json.loads((out / "precision.json").read_text())
    assert fresh.verdict == "fixed" and fresh.certificate.certified
    (aim,) = fresh.aimed_searches
    assert aim.found and aim.evaluations >= 6
    header, lines = _records(out / "journal.jsonl")
    aimed = [k for k, ln in enumerate(lines) if "#aim:" in ln]
    first = [ln for ln in lines if "#aim:" not in ln and '"done"' in ln]
    # each aimed evaluation is journaled, but those a looser bound's failure answered
    assert first and len([k for k in aimed if '"done"' in lines[k]]) == \
        aim.evaluations - aim.known_failing
    assert min(aimed) > max(k for k, ln in enumerate(lines) if "#aim:" not in ln)

    # killed in the aimed round: three of its evaluations done, the fourth in flight
    done_at = [k for k in aimed if '"done"' in lines[k]]
    cut = done_at[2] + 2
    assert '"start"' in lines[cut - 1] and "#aim:" in lines[cut - 1]
    in_flight = json.loads(lines[cut - 1])["start"]
    (out / "journal.jsonl").write_text("\n".join([header, *lines[:cut]]) + "\n")
    calls.clear()
    again = run(path, opts, out)
    assert again.fp32_nodes == fresh.fp32_nodes and again.aimed_searches == fresh.aimed_searches
    _same_bar_timings(json.loads((out / "precision.json").read_text()), fresh_doc)
    # every verdict journaled before the cut is replayed, the plan in flight runs again: the
    # new evaluations are those after it (their journal starts)
    _, after = _records(out / "journal.jsonl")
    new = [ln for ln in after[cut:] if '"start"' in ln]
    fresh_starts = sum('"start"' in ln for ln in lines)
    assert len(new) == fresh_starts - len(first) - 3 < fresh_starts == len(fresh_calls)
    assert json.loads(new[0])["start"] == in_flight
    assert sum(json.loads(ln).get("done") == in_flight for ln in after) == 1
    # by inference: those, and the written plan's judge once (a fresh run reuses the
    # search's last inference of it)
    assert len(calls) == len(new) + 1 and frozenset({"conv1"}) in calls
    # resumed once more, whole: no evaluation of either search runs again
    again = run(path, opts, out)
    _, final = _records(out / "journal.jsonl")
    assert final == after and again.aimed_searches == fresh.aimed_searches


def test_a_verdict_under_one_bound_is_never_replayed_under_another(tmp_path):
    """The same plans judged under round 1's cap and a tighter round 2's: each round's
    journal record is its own; a forged verdict under round 1's bound decides round 1 (so the
    journal is read) and nothing under round 2's or the run's own bound."""
    from trtbisect.context import Options, prepare

    path, inputs, tol = _planted(tmp_path)
    # the resume of an aimed round is the subject: no validation (test_validation.py has it)
    opts = Options.of(inputs=[str(inputs)], tolerance=tol, semantics="strict", validation_share=0)
    ctx = prepare(path, opts)
    one = opts.but(tolerance=replace(tol, ceiling={"score": tol.rtol * 0.9}))
    two = opts.but(tolerance=replace(tol, ceiling={"score": tol.rtol * 0.8}))
    assert len({aimed_scope(one.judge), aimed_scope(two.judge), aimed_scope(opts.judge)}) == 3
    fingerprint = {"run": "test"}
    j = Journal(tmp_path / "journal.jsonl", fingerprint)
    plan = frozenset({"conv1"})  # passes the user's bound; fails both caps
    ev1 = Evaluator(ctx, one.judge, {}, j, scope=aimed_scope(one.judge))
    assert ev1.check(plan) is False and ev1.runs == 1
    j.close()

    # the journal says plan passed under round 1's bound (forged, with a valid checksum)
    forged = Journal(tmp_path / "journal.jsonl", fingerprint)
    key = next(iter(forged.done))
    assert key.endswith("#" + aimed_scope(one.judge))
    forged.record(key, True, {"severity": 0.0})
    forged.close()
    j = Journal(tmp_path / "journal.jsonl", fingerprint)
    assert Evaluator(ctx, one.judge, {}, j, scope=aimed_scope(one.judge)).check(plan) is True  # replayed
    ev2 = Evaluator(ctx, two.judge, {}, j, scope=aimed_scope(two.judge))
    assert ev2.check(plan) is False and ev2.runs == 1  # judged under its own bound
    own = Evaluator(ctx, opts.judge, {}, j)
    assert own.check(plan) is True and own.runs == 1  # the run's own bound: judged, passes
    j.close()


def test_sigkill_in_an_aimed_round_resumes_to_the_same_plan(tmp_path):
    """A real kill, while an aimed evaluation is in flight (the gated CLI of
    test_reliability.py: no timing involved)."""
    from tests.search.test_reliability import (
        HANG,
        cli,
        plan_of,
        records_of,
        release,
        wait_for_start,
    )

    path, inputs, tol = _planted(tmp_path)
    args = ("run", path, "--inputs", inputs, "--rtol", repr(tol.rtol), "--semantics",
            "strict", "--validation-share", "0", "--out")
    ref = cli(*args, tmp_path / "ref")
    _, err = ref.communicate(timeout=HANG)
    assert ref.returncode == 0, err
    out = tmp_path / "out"
    victim = cli(*args, out, gated=True)
    starts = 1
    while True:  # release evaluations until two aimed ones are done and a third is in flight
        key = wait_for_start(out / "journal.jsonl", starts, victim)
        assert key is not None, victim.communicate()
        if sum("#aim:" in r.get("done", "") for r in records_of(out / "journal.jsonl")) >= 2:
            break
        release(victim)
        starts += 1
    assert "#aim:" in key
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=HANG)
    assert victim.returncode == -signal.SIGKILL
    resumed = cli(*args, out)
    _, err = resumed.communicate(timeout=HANG)
    assert resumed.returncode == 0, err
    done = [r["done"] for r in records_of(out / "journal.jsonl") if "done" in r]
    assert done.count(key) == 1 and len(done) == len(set(done))  # nothing judged twice
    a, b = plan_of(out), plan_of(tmp_path / "ref")
    assert a["fp32_nodes"] == b["fp32_nodes"] and a["aimed_searches"] == b["aimed_searches"]
    assert a["certificate"] == b["certificate"] and a["verdict"] == "fixed"


@pytest.mark.parametrize("cap", [0.9, 0.8])
def test_an_aimed_scope_names_its_bound(tmp_path, cap):
    """Two caps give two scopes; the same cap gives the same scope in another process's
    options (a digest of the settings, not of the object)."""
    from trtbisect.context import Options

    t = Tolerance(1e-2)
    a = Options.of(tolerance=replace(t, ceiling={"y": 1e-2 * cap}))
    b = Options.of(tolerance=Tolerance(1e-2, ceiling={"y": 1e-2 * cap}))
    assert aimed_scope(a.judge) == aimed_scope(b.judge) != aimed_scope(Options.of(tolerance=t).judge)
