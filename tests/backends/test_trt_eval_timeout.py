"""--eval-timeout reaches TensorRT's engine executions (docs/limits.md), on the fake TensorRT
made to hang on execute: an FP32 engine that never finishes is refused in one line (exit 2),
as the ORT reference is; a plan whose engine never finishes is judged failed, as on the
emulator, and the search keeps what makes it finish."""

from __future__ import annotations

import pytest

from tests.backends.test_trt_backend import LN, fake
from tests.conftest import save_zoo_model
from tests.test_cli import assert_one_line_error, invoke
from trtbisect.base.limits import EVAL_TIMEOUT
from trtbisect.judge.flags import parse_criteria
from trtbisect.stages.trt import TrtSearchOptions, run_trt_search

SECONDS = 0.5  # far above the fake's execution of these models (milliseconds)
HANG = "mlp/Relu"  # an engine that leaves it FP16 never finishes


def test_an_fp32_engine_that_never_finishes_is_refused_in_one_line(monkeypatch, zoo, tmp_path):
    fake.install(monkeypatch, hang="always")
    model, inputs = save_zoo_model(zoo[LN], tmp_path)
    monkeypatch.setenv("TRTBISECT_CACHE_DIR", str(tmp_path / "cache"))
    r = invoke("run", model, "--semantics", "strict", "--inputs", inputs, "--backend", "trt",
               "--out", tmp_path / "o", "--eval-timeout", str(SECONDS))
    assert_one_line_error(r, 2, f"--eval-timeout {SECONDS:g} s")


@pytest.mark.parametrize("criteria", [None, parse_criteria(metrics=["cosine:0.999"])],
                         ids=["default", "criteria"])
def test_a_plan_whose_engine_never_finishes_is_judged_failed(monkeypatch, zoo, tmp_path,
                                                             criteria):
    """The emulator's plan leaves mlp/Relu FP16: its engine hangs, so TensorRT disagrees and
    the refinement adds exactly mlp/Relu; the all-FP16 engine's latency is None, said why."""
    _, cuda = fake.install(monkeypatch, hang=HANG)
    z = zoo[LN]
    report = run_trt_search(z.model, [z.inputs], tmp_path / "out",
                            TrtSearchOptions(criteria=criteria, cache_dir=tmp_path / "c",
                                             eval_timeout=SECONDS),
                            emulator_plan=sorted(z.expected_fp32))
    r = report.result
    assert r.found and set(r.fp32) == z.expected_fp32 | {HANG} and r.trt_only == [HANG]
    assert not r.emulator_agreed
    assert report.latency_ms["fp16"] is None and report.latency_ms["final"] is not None
    assert any("past --eval-timeout" in w for w in report.warnings)


def test_an_engine_left_running_is_never_run_again(monkeypatch, zoo, tmp_path):
    """A stuck engine is set aside: the same plan builds a fresh one from the cache (and hangs
    again, as TensorRT would), while other plans run on."""
    from trtbisect.backends.trt import TrtBackend
    from trtbisect.base.limits import EvalTimeout

    fake.install(monkeypatch, hang=HANG)
    z = zoo[LN]
    backend = TrtBackend(z.model, cache_dir=tmp_path / "c", eval_timeout=SECONDS)
    ref = backend.reference(z.inputs)
    for _ in range(2):
        with pytest.raises(EvalTimeout):
            backend.run(frozenset(), z.inputs)
        assert len(backend._engines) == 1  # the FP32 reference's only
    assert backend.cache_hits == 1 and backend.builds == 2
    out = backend.run(frozenset({HANG}), z.inputs)
    assert set(out) == set(ref)
    backend.close()


def test_the_run_hands_its_eval_timeout_to_the_tensorrt_search_and_its_gpu_workers():
    from trtbisect.context import Options

    opts = Options.of(eval_timeout=7.0)
    t = TrtSearchOptions.of(opts)
    assert t.eval_timeout == 7.0 and t.judge().eval_timeout == 7.0
    assert TrtSearchOptions().judge().eval_timeout == EVAL_TIMEOUT
    crit = TrtSearchOptions(criteria=parse_criteria(metrics=["cosine:0.999"]), eval_timeout=3.0)
    assert crit.judge().eval_timeout == 3.0
