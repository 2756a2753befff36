"""scripts/bench_quant.py's margin and validation columns, read from precision.json's
`margins`, `certificate.scores` and `validation` (docs/quantization.md, "Benchmark")."""

from __future__ import annotations

from tests.conftest import script_module


def _out(bound: float, worst: float, spread: float) -> dict:
    return {"bound": bound, "worst": worst, "margin": bound - worst, "spread": spread,
            "certified": bound - worst > spread}


def test_the_margin_column_is_the_output_nearest_to_failing_as_shares_of_its_bound():
    bq = script_module("bench_quant")
    # a: margin 0.5 of its bound, spread 0.1; b: margin 0.2, spread 0.6 (fails): b is shown
    d = {"margins": {"a": _out(0.01, 0.005, 0.001), "b": _out(1.0, 0.8, 0.6),
                     "c": {"bound": "inf", "worst": 0.0, "margin": "inf", "spread": 0.0}}}
    assert bq.margin(d) == "0.20 / 0.60 (fails)"
    d["margins"].pop("b")
    assert bq.margin(d) == "0.50 / 0.10"
    # a metric's score: margin and spread already in its severity (1 at the threshold)
    d["certificate"] = {"scores": {"y:iou": {"margin": 1.0, "spread": 50.0, "certified": False}}}
    assert bq.margin(d) == "1.00 / 50.00 (fails)"
    assert bq.margin({"margins": None, "certificate": None}) == "-"


def test_the_validation_column_says_what_was_held_out_and_whether_it_passed():
    bq = script_module("bench_quant")
    v = {"kind": "held_out", "samples": "1 held-out sample(s) (#3)", "passed": False}
    assert bq.validated({"validation": v}) == "1 held-out sample(s) (#3): FAILED"
    assert bq.validated({"validation": {**v, "passed": True}}).endswith(": passed")
    assert bq.validated({"validation": None}) == "-"
