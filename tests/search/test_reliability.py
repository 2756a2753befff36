"""Promises under faults: kill/resume reaches the same plan, Ctrl-C and SIGTERM say how to
resume, one generation per --out under a lock, files with the user's umask."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import save_zoo_model
from trtbisect.cli import main

ROOT = Path(__file__).resolve().parents[2]
# `python -c DRIVER gate|free run ...`: the CLI; with `gate`, every evaluation, once its start
# is journaled, waits for a line on stdin, so the test decides when each one runs and a signal
# lands while an evaluation is in flight, whatever the machine's load (no timing involved).
DRIVER = """
import signal, sys
# a suite started as a background job of a non-interactive shell (`nohup pytest &`, some CI
# runners) hands SIGINT down ignored, and Python then keeps ignoring it: Ctrl-C is what is
# tested here, so it gets Python's own handler back
signal.signal(signal.SIGINT, signal.default_int_handler)
from trtbisect import journal
gated = sys.argv.pop(1) == "gate"
start = journal.Journal.start
def held(self, key):
    start(self, key)
    if gated:
        sys.stdin.readline()  # until the test releases this evaluation
journal.Journal.start = held
from trtbisect.cli import main
main(prog_name="trtbisect")
"""
HANG = 900  # seconds: a guard against a hung process, never a bound on speed


def cli(*args, gated: bool = False) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", DRIVER, "gate" if gated else "free", "-q",
                             *map(str, args)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def records_of(journal: Path) -> list[dict]:
    lines = journal.read_text().splitlines() if journal.exists() else []
    return [json.loads(line) for line in lines[1:] if line.endswith("}")]


def wait_for_start(journal: Path, starts: int, proc: subprocess.Popen) -> str | None:
    """Wait until the gated run has journaled `starts` starts and waits in the last one; its
    plan key (None when the run finished without another evaluation)."""
    deadline = time.monotonic() + HANG
    while time.monotonic() < deadline:
        records = records_of(journal)
        if sum("start" in r for r in records) >= starts and "start" in records[-1]:
            return records[-1]["start"]
        if proc.poll() is not None:
            return None
        time.sleep(0.02)
    raise AssertionError("the gated run hung")


def release(proc: subprocess.Popen) -> None:
    """Let the evaluation the gated run waits in go on."""
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.flush()


def wait_for_flight(journal: Path, done: int, proc: subprocess.Popen) -> str:
    """Release evaluations one at a time until `done` have finished and the next one is in
    flight (held); its plan key."""
    starts = 1
    while True:
        key = wait_for_start(journal, starts, proc)
        assert key is not None, ("the search ended before the kill point", proc.communicate())
        if sum("done" in r for r in records_of(journal)) >= done:
            return key
        release(proc)
        starts += 1


def plan_of(out: Path) -> dict:
    return json.loads((out / "precision.json").read_text())


@pytest.fixture
def model(zoo, tmp_path):
    return save_zoo_model(zoo["two_outputs"], tmp_path / "in")


def reference_plan(model, tmp_path) -> dict:
    path, inputs = model
    ref = cli("run", path, "--inputs", inputs, "--out", tmp_path / "ref")
    _, stderr = ref.communicate(timeout=HANG)
    assert ref.returncode == 0, stderr
    return plan_of(tmp_path / "ref")


def kill_and_resume(model, tmp_path, sig: int, done: int, reference: dict) -> None:
    path, inputs = model
    out = tmp_path / f"out-{sig}-{done}"
    args = ("run", path, "--inputs", inputs, "--out", out)
    victim = cli(*args, gated=True)
    in_flight = wait_for_flight(out / "journal.jsonl", done, victim)
    victim.send_signal(sig)
    victim.communicate(timeout=HANG)
    assert victim.returncode != 0  # it died in flight, not after finishing
    resumed = cli(*args)
    _, stderr = resumed.communicate(timeout=HANG)
    assert resumed.returncode == 0, stderr
    plan = plan_of(out)
    assert plan["verdict"] == reference["verdict"]
    assert plan["fp32_nodes"] == reference["fp32_nodes"] and plan["one_minimal"]
    records = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()[1:]]
    rerun = [r for r in records if r.get("done") == in_flight]
    assert rerun and not rerun[-1].get("crashed"), "the plan in flight must be run again"


def test_sigkill_mid_search_resumes_to_the_same_plan(model, tmp_path):
    kill_and_resume(model, tmp_path, signal.SIGKILL, 3, reference_plan(model, tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("done", [0, 1, 3, -1])  # -1: in the last journaled evaluation
def test_kill_at_many_points_resumes_to_the_same_plan(model, tmp_path, sig, done):
    reference = reference_plan(model, tmp_path)
    lines = (tmp_path / "ref" / "journal.jsonl").read_text().splitlines()[1:]
    journaled = sum('"done"' in line for line in lines)
    assert journaled > 3, "the search should journal enough evaluations to kill between"
    kill_and_resume(model, tmp_path, sig, done % journaled, reference)


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_exits_with_one_line_saying_how_to_resume(model, tmp_path, sig, code):
    path, inputs = model
    out = tmp_path / "out"
    proc = cli("run", path, "--inputs", inputs, "--out", out, gated=True)
    wait_for_flight(out / "journal.jsonl", 1, proc)
    proc.send_signal(sig)  # it waits in an evaluation until released: the signal lands there
    _, stderr = proc.communicate(timeout=HANG)
    assert proc.returncode == code, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: interrupted"), stderr
    assert "same command again" in lines[0] and "--no-resume" in lines[0]


def invoke(*args):
    return CliRunner().invoke(main, ["-q", *map(str, args)])


def test_a_run_without_plan_leaves_no_stale_plan_files(model, tmp_path):
    path, inputs = model
    out = tmp_path / "out"
    assert invoke("run", path, "--inputs", inputs, "--out", out).exit_code == 0
    assert (out / "layer_precisions.txt").exists() and (out / "commands.sh").exists()
    r = invoke("run", path, "--inputs", inputs, "--out", out, "--max-evals", "1", "--no-resume")
    assert r.exit_code == 4, r.output
    assert plan_of(out)["verdict"] == "no_plan"
    for stale in ("layer_precisions.txt", "commands.sh", f"{path.stem}.mixed.onnx",
                  "autocast_nodes_to_exclude.json"):
        assert not (out / stale).exists(), stale
        assert (out / ".previous" / stale).exists(), stale  # moved aside, not lost
    manifest = json.loads((out / ".trtbisect-manifest.json").read_text())["files"]
    assert sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.startswith(".")
                  and p.name != "journal.jsonl") == sorted(manifest)


def test_a_second_concurrent_run_is_refused(model, tmp_path):
    path, inputs = model
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out / ".trtbisect.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the first run holds the lock
        r = invoke("run", path, "--inputs", inputs, "--out", out)
    finally:
        os.close(fd)
    assert r.exit_code == 2 and "another trtbisect run" in r.stderr, r.output
    assert not (out / "precision.json").exists()
    assert invoke("run", path, "--inputs", inputs, "--out", out).exit_code == 0  # lock released


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_get_the_users_umask(model, tmp_path, umask, mode):
    path, inputs = model
    old = os.umask(umask)
    try:
        assert invoke("run", path, "--inputs", inputs, "--out", tmp_path / "out").exit_code == 0
    finally:
        os.umask(old)
    for name in ("precision.json", "layer_precisions.txt", f"{path.stem}.mixed.onnx"):
        assert (tmp_path / "out" / name).stat().st_mode & 0o777 == mode, name
