"""Evaluations on worker processes (#23): the plan, the trace, the evaluations and the judge of
the written file are the same bit for bit with 1, 2 and 3 workers; a worker that dies is
replaced and its evaluation run again, never lost nor counted twice; the pool is sized by
cores and memory and says so."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import save_zoo_model
from tests.models.make_models import deep_model
from trtbisect.context import Options
from trtbisect.judge.compare import OutputError
from trtbisect.judge.criteria import Judgement
from trtbisect.judge.flags import parse_criteria
from trtbisect.parallel import judge as pjudge
from trtbisect.parallel import plan_workers
from trtbisect.parallel.pool import DIE_ONCE_ENV
from trtbisect.pipeline import check_mixed, run
from trtbisect.result import RunResult
from trtbisect.stages.batch import chunks


def _run(model, inputs, out, workers: int, **kw):
    r = run(model, Options.of(inputs=[str(inputs)], workers=workers, threads=1, **kw), out)
    return r, json.loads((out / "precision.json").read_text())


def _same(a, b, why: str) -> None:
    (ra, pa), (rb, pb) = a, b
    assert ra.verdict == rb.verdict, why
    assert ra.fp32_nodes == rb.fp32_nodes, why
    assert ra.evaluations == rb.evaluations and ra.inferences == rb.inferences, why
    assert [t.to_json() for t in ra.search.trials] == [t.to_json() for t in rb.search.trials], why
    assert ra.search.certificate == rb.search.certificate, why
    for key in ("errors_after", "mixed_model_check", "one_judge", "cost"):
        assert pa.get(key) == pb.get(key), f"{why}: {key}"


def _stacked(z, samples: int, seed: int = 1):
    """The zoo model's input and `samples - 1` jittered copies, stacked on a leading axis."""
    rng = np.random.default_rng(seed)
    return {n: np.stack([v] + [v * (1 + 0.05 * rng.standard_normal(v.shape)).astype(v.dtype)
                               for _ in range(samples - 1)])
            for n, v in z.inputs.items()}


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deep")
    z = deep_model(blocks=4, overflow_blocks=(1, 3))
    model, inputs = save_zoo_model(z, folder)
    np.savez(inputs, **_stacked(z, 4))
    return z, model, inputs


@pytest.mark.parametrize("name", ["layernorm_overflow", "two_outputs", "attention_logits"])
def test_zoo_plans_identical_with_1_2_3_workers(zoo, tmp_path, name):
    model, inputs = save_zoo_model(zoo[name], tmp_path / "in")
    runs = {w: _run(model, inputs, tmp_path / f"w{w}", w) for w in (1, 2, 3)}
    assert runs[1][0].verdict == "fixed"
    for w in (2, 3):
        _same(runs[1], runs[w], f"{name}: {w} workers")
        assert runs[w][1]["workers"]["workers"] == w
        assert runs[w][1]["workers"]["rounds"] <= runs[w][1]["workers"]["evaluations"]
        held = runs[w][0].workers  # result.WorkersRecord: what precision.json writes
        assert held.workers == w and held.backend == "local"
        assert held.to_json() == runs[w][1]["workers"]
        assert RunResult.typed_from_json(runs[w][1])["workers"] == held
    assert "workers" not in runs[1][1]  # --workers 1: judged in this process, as always
    # the written file is judged as `check` judges it
    checked = check_mixed(tmp_path / "w3" / f"{name}.mixed.onnx", model,
                          Options.of(inputs=[str(inputs)], threads=1))
    for out, e in checked.errors.items():
        assert runs[3][1]["errors_after"][out] == e.to_json()


@pytest.mark.parametrize("name,kw", [("layernorm_overflow", {"strict": True}),
                                     ("layernorm_overflow", {"semantics": "strict"}),
                                     ("precision_loss", {"rewrite": True}),
                                     ("precision_loss", {"precision": "bf16"})])
def test_strict_semantics_and_rewrites_identical_with_workers(zoo, tmp_path, name, kw):
    """--strict's non-finite watch, per-node rounding, the rewritten model (saved for the
    workers, who judge it as the parent does; precision_loss still needs a plan after its
    rewrites), and BF16 plans (the workers round to bfloat16 too)."""
    model, inputs = save_zoo_model(zoo[name], tmp_path / "in")
    one = _run(model, inputs, tmp_path / "w1", 1, **kw)
    two = _run(model, inputs, tmp_path / "w2", 2, **kw)
    _same(one, two, str(kw))
    assert two[1]["workers"]["workers"] == 2
    if kw.get("rewrite"):
        assert two[1]["rewrites"] and two[1]["rewrites"] == one[1]["rewrites"]
    left = tmp_path / "w2" / ".cache" / "workers"  # the samples and rewritten model it saved
    assert not left.exists() or not any(left.iterdir())


def test_deep_model_many_samples_identical_with_1_2_3_workers(deep, tmp_path):
    """Several samples and a pass rate: a round with fewer plans than workers splits each
    plan's samples among them, and the chunks merge into the sequential verdict, stopping
    where it stops (the same inferences)."""
    z, model, inputs = deep
    crit = parse_criteria(pass_rate=0.75)
    runs = {w: _run(model, inputs, tmp_path / f"w{w}", w, criteria=crit) for w in (1, 2, 3)}
    assert set(z.expected_fp32) <= set(runs[1][0].fp32_nodes)  # their fused layers too
    for w in (2, 3):
        _same(runs[1], runs[w], f"{w} workers")
    stats = runs[3][1]["workers"]
    assert stats["rounds"] < stats["evaluations"]  # plans ran side by side


def test_a_worker_that_dies_is_replaced_and_its_plan_retried(deep, tmp_path, monkeypatch):
    z, model, inputs = deep
    reference = _run(model, inputs, tmp_path / "ref", 1)
    flag = tmp_path / "died"
    monkeypatch.setenv(DIE_ONCE_ENV, str(flag))
    got = _run(model, inputs, tmp_path / "w2", 2)
    assert flag.exists(), "the hook killed no worker: the test tests nothing"
    _same(reference, got, "a worker died")
    assert got[1]["workers"]["replaced"] == 1
    done = [json.loads(line).get("done") for line in
            (tmp_path / "w2" / "journal.jsonl").read_text().splitlines()[1:]]
    done = [d for d in done if d is not None]
    assert len(done) == len(set(done)), "a plan journaled twice"


def _judgement(passed: bool) -> Judgement:
    e = OutputError(max_abs=0.0 if passed else 1.0, bound=0.5, rel=0.0 if passed else 2.0,
                    mean_abs=0.0, p99_abs=0.0, cosine=1.0, nonfinite=0, passed=passed)
    return Judgement({"y": e})


def test_merge_of_chunks_is_the_sequential_verdict():
    crit = parse_criteria(pass_rate=0.5)
    fail, ok = _judgement(False), _judgement(True)
    for pattern in ("ffff", "pfpf", "ppff", "fffp", "pppp", "fpfpff"):
        results = [(ok if c == "p" else fail, []) for c in pattern]
        total = len(results)
        sequential = pjudge.take(iter(results), crit, total, True)
        for parts in (1, 2, 3):
            pieces = []
            for idx in chunks(list(range(total)), parts):
                mine, judged = [], []
                for k in idx:
                    mine.append(results[k])
                    judged.append(results[k][0])
                    if pjudge.stops(crit, judged, [], total):
                        break
                pieces.append((mine, len(mine) == len(idx)))
            merged = pjudge.merge(pieces, crit, total, True)
            assert (merged.passed, len(merged.judged), merged.stopped) == \
                (sequential.passed, len(sequential.judged), sequential.stopped), (pattern, parts)


def test_chunks_are_consecutive_and_even():
    assert chunks(list(range(7)), 3) == [(0, 1, 2), (3, 4), (5, 6)]
    assert chunks([4, 5], 5) == [(4,), (5,)]
    assert chunks([1, 2, 3], 1) == [(1, 2, 3)]


def test_pool_size_is_bounded_by_cores_and_memory():
    gib = 1 << 30
    by_cores = plan_workers(None, 1, weights=10 << 20, activations=1 << 20, ncores=8,
                            available=64 * gib)
    assert by_cores.workers == 8 and "8 cores" in by_cores.why
    by_memory = plan_workers(None, 1, weights=2 * gib, activations=0, ncores=64,
                             available=32 * gib)
    # a worker holds the weights twice plus its interpreter: 60% of 32 GiB fits 4 of them
    assert by_memory.workers == 4 and by_memory.per_worker > 4 * gib
    threaded = plan_workers(None, 4, weights=0, activations=0, ncores=16, available=64 * gib)
    assert threaded.workers == 4 and "4 threads" in threaded.why
    asked = plan_workers(6, 1, weights=2 * gib, activations=0, ncores=64, available=32 * gib)
    assert asked.workers == 6 and "4 would fit" in asked.why
    assert plan_workers(None, 1, weights=100 * gib, activations=0, ncores=8,
                        available=gib).workers == 1


# `python -c DRIVER run ...`: the CLI, every journaled verdict waiting for a line on stdin, so
# the test kills the run after a chosen number of verdicts, with other plans of the batch in
# flight on the workers, whatever the machine's load
DRIVER = """
import sys
from trtbisect.search import journal
record = journal.Journal.record
def held(self, key, passed, detail):
    record(self, key, passed, detail)
    sys.stdin.readline()
journal.Journal.record = held
from trtbisect.cli import main
main(prog_name="trtbisect")
"""


def test_a_run_killed_mid_batch_resumes_to_the_uninterrupted_plan(deep, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    _, model, inputs = deep
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    reference = _run(model, inputs, tmp_path / "ref", 1)
    out = tmp_path / "out"
    args = ["run", str(model), "--inputs", str(inputs), "--out", str(out), "--threads", "1"]
    victim = subprocess.Popen([sys.executable, "-c", DRIVER, "-q", *args, "--workers", "2"],
                              env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    journal = out / "journal.jsonl"
    deadline = time.monotonic() + 900  # a guard against a hang, not a bound on speed
    released = 0
    while True:
        lines = journal.read_text().splitlines()[1:] if journal.exists() else []
        done = sum('"done"' in line for line in lines)
        if done >= 3:
            break
        assert victim.poll() is None, victim.communicate()
        assert time.monotonic() < deadline, "the run hung"
        if done > released:  # let the run take the next verdict
            victim.stdin.write("\n")
            victim.stdin.flush()
            released += 1
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=60)
    assert victim.returncode != 0
    resumed = subprocess.run([sys.executable, "-m", "trtbisect.cli", "-q", *args, "--workers",
                              "2"], env=env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr
    plan = json.loads((out / "precision.json").read_text())
    ref = reference[1]
    assert plan["fp32_nodes"] == ref["fp32_nodes"] and plan["one_minimal"]
    assert plan["evaluations"] == ref["evaluations"]
    assert plan["errors_after"] == ref["errors_after"]


def test_the_default_workers_estimate_counts_inference_not_session_builds(deep, tmp_path,
                                                                          monkeypatch):
    """An evaluation reuses its session, so what the search will cost is estimated from the
    all-FP16 verdict's inference time; building a session must not count (on the 20k-node
    transformer it did, and started workers for a 10-evaluation search)."""
    from trtbisect import pipeline
    from trtbisect.backends import ort as ort_backend
    from trtbisect.stages import batch

    z, model, inputs = deep
    before = ort_backend.run_seconds()
    session = ort_backend.make_session(z.model)
    assert ort_backend.run_seconds() == before  # built, not run
    with np.load(inputs) as d:
        feeds = {n: d[n][0] for n in d.files}
    ort_backend.run_session(session, feeds)
    assert ort_backend.run_seconds() > before

    seen = {}
    clock = iter([100.0, 103.5])  # the run's two reads: before and after the all-FP16 verdict
    monkeypatch.setattr(pipeline, "run_seconds", lambda: next(clock))
    real_start = batch.start_workers

    def spy(ev, ctx, judge, search, prefetch, seconds_per_evaluation=None, *a, **kw):
        seen["estimate"] = seconds_per_evaluation
        return real_start(ev, ctx, judge, search, prefetch, seconds_per_evaluation, *a, **kw)

    monkeypatch.setattr(batch, "start_workers", spy)
    r = run(model, Options.of(inputs=[str(inputs)], threads=1), tmp_path / "out")
    assert r.verdict == "fixed"
    assert seen["estimate"] == pytest.approx(3.5)  # inference seconds, not the stage's wall


def test_workers_pay_off_only_when_they_save_more_than_their_start():
    """The default pool: a search under MIN_SEARCH_SECONDS never pays; a longer one pays when
    the share the other workers take is more than one worker's start."""
    from trtbisect.stages.batch import MIN_SEARCH_SECONDS, why_not_workers

    assert why_not_workers(MIN_SEARCH_SECONDS - 1, 2, 0.0) == ""
    # the 20k-node transformer under load: 48 likely evaluations of 0.8 s, a 25 s start
    why = why_not_workers(48 * 0.8, 2, 25.0)
    assert why is not None and "save about 19 s" in why and "25 s to start" in why
    assert why_not_workers(48 * 0.8, 2, 10.0) is None
    assert why_not_workers(100.0, 4, 74.0) is None  # 75 s saved by three more workers
    assert why_not_workers(100.0, 4, 75.0) is not None


def test_the_run_tells_the_workers_what_their_start_costs(deep, tmp_path, monkeypatch):
    """The run's own load and all-FP16 session build are the estimate of a worker's start."""
    from trtbisect.stages import batch

    z, model, inputs = deep
    seen = {}
    real_start = batch.start_workers

    def spy(*a, **kw):
        seen["start"] = kw.get("start_seconds")
        return real_start(*a, **kw)

    monkeypatch.setattr(batch, "start_workers", spy)
    r = run(model, Options.of(inputs=[str(inputs)], threads=1), tmp_path / "out")
    assert r.verdict == "fixed"
    assert seen["start"] is not None and seen["start"] > 0
