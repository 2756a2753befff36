"""The run's verdict decided in one place (judge/verdict.py), and the certificate's decision
rules (stages/spread.py): what `fixed` needs, what makes it `fragile` at once."""

from __future__ import annotations

import dataclasses

import pytest

from trtbisect.judge.compare import Tolerance
from trtbisect.judge.verdict import PASSING, decide, on_tensorrt
from trtbisect.result import VERDICT_EXIT
from trtbisect.stages.spread import AIM_FACTOR, SPREAD_SHARE, Certificate, OutputMargin


@pytest.mark.parametrize("proposed", PASSING)
def test_a_passing_verdict_needs_every_finding_in_order(proposed):
    assert decide(proposed) == proposed  # nothing judged: nothing decided
    assert decide(proposed, file_passed=True, certified=True, validated=True,
                  covered=True) == proposed
    # the first finding that fails names the verdict: file, certificate, validation, coverage
    assert decide(proposed, file_passed=False, certified=False, validated=False,
                  covered=False) == "no_plan"
    assert decide(proposed, file_passed=True, certified=False, validated=False) == "fragile"
    assert decide(proposed, certified=True, validated=False, covered=False) == "unvalidated"
    assert decide(proposed, certified=True, validated=True, covered=False) == "partial"


def test_other_verdicts_stay_and_a_budget_plan_whose_file_passes_is_fixed():
    for v in ("no_plan", "reference_invalid", "reference_unstable", "nothing_to_judge",
              "fragile", "unvalidated"):
        assert decide(v, file_passed=False, certified=False, validated=False,
                      covered=False) == v
    assert decide("over_budget", file_passed=True) == "fixed"
    assert decide("over_budget", file_passed=False) == "over_budget"
    assert decide("over_budget") == "over_budget"


def test_tensorrts_own_search_decides_its_plan():
    assert on_tensorrt("fixed", found=False, changed=False, planned=True) == "no_plan"
    assert on_tensorrt("fp16_ok", found=True, changed=True, planned=True) == "fixed"
    assert on_tensorrt("fixed", found=True, changed=True, planned=False) == "fp16_ok"
    assert on_tensorrt("unvalidated", found=True, changed=False, planned=True) == "unvalidated"


def test_every_verdict_has_an_exit_code():
    from typing import get_args

    from trtbisect.judge.verdict import VerdictName
    assert set(get_args(VerdictName)) <= set(VERDICT_EXIT)
    assert VERDICT_EXIT["unvalidated"] == 9 and VERDICT_EXIT["fragile"] == 7


def _cert(bound: float, worst: float, spread: float) -> Certificate:
    return Certificate({"y": OutputMargin(bound, worst, spread, 0.0)}, {"v": True})


def test_a_spread_over_a_quarter_of_the_bound_is_hopeless_at_once():
    assert _cert(1.0, 0.9, 0.2).hopeless() is None  # 20%: an aimed round may help
    why = _cert(1.0, 0.9, 0.3).hopeless()
    assert why is not None and "noise is as large as the effect" in why
    assert _cert(1.0, 0.5, 0.3).hopeless() is None  # certified: nothing to decide


def test_an_aimed_ceiling_never_falls_below_half_the_bound():
    """The rule in docs/trust.md: a spread above SPREAD_SHARE of the bound is fragile at once,
    so every ceiling a search aims at keeps at least 1 - AIM_FACTOR * SPREAD_SHARE of it."""
    assert 1 - AIM_FACTOR * SPREAD_SHARE >= 0.5
    cert = _cert(1.0, 0.95, SPREAD_SHARE)  # the widest spread still aimed at
    assert cert.hopeless() is None
    tol = cert.aim(Tolerance())
    assert tol is not None and tol.ceiling["y"] == pytest.approx(1 - AIM_FACTOR * SPREAD_SHARE)
    for spread in (0.01, 0.1, SPREAD_SHARE):  # a second round, whatever its plan's spread
        again = _cert(1.0, 1.0 - spread / 2, spread).aim(tol)
        assert again is None or 0.5 <= again.ceiling["y"] <= tol.ceiling["y"]


def test_a_spread_that_grows_with_the_nearer_plan_is_seen():
    assert _cert(1.0, 0.95, 0.1).spread_grew(_cert(1.0, 0.7, 0.2))
    assert not _cert(1.0, 0.95, 0.1).spread_grew(_cert(1.0, 0.7, 0.05))
    assert not _cert(1.0, 0.5, 0.1).spread_grew(_cert(1.0, 0.7, 0.2))  # it was certified


def test_the_file_as_given_is_held_to_what_fp16_as_it_is_is_held_to():
    """The quantized road's `quantized_ok` under decide's rules (as `fp16_ok`)."""
    assert decide("quantized_ok", file_passed=False) == "no_plan"
    assert decide("quantized_ok", certified=False) == "fragile"
    assert decide("quantized_ok", certified=True, validated=False) == "unvalidated"
    assert decide("quantized_ok", certified=True, validated=None) == "quantized_ok"
    assert decide("fixed", certified=True, validated=False) == "unvalidated"
    assert decide("no_plan", certified=True) == "no_plan"


def test_findings_decide_from_the_proposal_whatever_their_order():
    """A result's findings (Found.findings_with) decide from the search's proposal over all
    of them: a budget plan whose file passes is then held to its certificate like any
    `fixed` one; TensorRT's own search comes last. Every road's result is frozen."""
    from trtbisect.judge.verdict import Findings, TensorRT
    from trtbisect.result import Found, RunResult

    assert decide("over_budget", file_passed=True, certified=False) == "fragile"
    assert Findings("fixed", covered=False).verdict() == "partial"
    trt = TensorRT(found=True, changed=True, planned=True)
    assert Findings("fixed", file_passed=True, covered=False, tensorrt=trt).verdict() == "fixed"
    r: Found = Found("over_budget", fp32_nodes=["a"], candidates=1, evaluations=1,
                     inferences=1, samples=1, tolerance=Tolerance(), errors_before={},
                     errors_after={})
    steps = []
    for finding in [dict(certified=False), dict(file_passed=True), dict(validated=True),
                    dict(tensorrt=TensorRT(found=False, changed=False, planned=True))]:
        f = r.findings_with(**finding)
        r = dataclasses.replace(r, verdict=f.verdict(), verdict_findings=f)
        steps.append(r.verdict)
    # the file not judged yet; then the certificate holds it; TensorRT finds nothing
    assert steps == ["over_budget", "fragile", "fragile", "no_plan"]
    assert r.verdict_findings is not None and r.verdict_findings.proposed == "over_budget"
    assert r.verdict_findings.certified is False and r.verdict_findings.file_passed is True
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.verdict = "fixed"  # type: ignore[misc]
    # a run's result is assembled once: a finding after it (TensorRT's) makes a new one
    run = RunResult("fixed", fp32_nodes=["a"], candidates=1, evaluations=1, inferences=1,
                    samples=1, tolerance=Tolerance(), errors_before={}, errors_after={},
                    model_path="m.onnx", model_sha256="0", nodes=1, strict=False,
                    verdict_findings=Findings("fixed", file_passed=True, certified=True))
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.verdict = "no_plan"  # type: ignore[misc]
    later = run.settled(tensorrt=TensorRT(found=False, changed=False, planned=True))
    assert later.verdict == "no_plan" and run.verdict == "fixed"
    assert later.verdict_findings == Findings("fixed", file_passed=True, certified=True,
                                              tensorrt=TensorRT(False, False, True))


def test_the_certificate_records_the_margins_it_measured_one_type_for_both():
    """stages/spread measures result.OutputMargin and ScoreMargin, frozen; the record a run
    keeps holds those very margins, and precision.json's JSON of them makes them again (a
    non-finite number written as text, "margin" and "certified" following from the rest)."""
    import json
    import math

    from trtbisect.result import CertificateRecord, ScoreMargin

    out = OutputMargin(1.0, math.inf, 0.2, 0.1, {"opt": math.inf}, 0, 1)
    score = ScoreMargin(0.99, 0.995, True, 0.5, 0.1, 2)
    cert = Certificate({"y": out}, {"opt": True}, scores={"y:cosine:0.99": score})
    rec = cert.record()
    assert rec.outputs["y"] is out and rec.scores["y:cosine:0.99"] is score
    assert not rec.certified and out.margin == -math.inf and score.certified
    d = json.loads(json.dumps(rec.to_json()))
    assert d["outputs"]["y"] == {"bound": 1.0, "worst": "inf", "margin": "-inf", "spread": 0.2,
                                 "noise_floor": 0.1, "certified": False,
                                 "variants": {"opt": "inf"}, "sample": 0, "bound_sample": 1}
    assert list(d["scores"]["y:cosine:0.99"]) == ["bound", "worst", "severity", "margin",
                                                  "spread", "higher_is_better", "certified",
                                                  "sample"]
    back = CertificateRecord.from_json(d)
    assert back == rec and json.dumps(back.to_json()) == json.dumps(rec.to_json())
    assert "spread: FRAGILE" not in score.text("y:cosine:0.99")
