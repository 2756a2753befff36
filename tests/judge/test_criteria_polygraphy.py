"""--check-error-stat and --error-quantile mean what they mean in Polygraphy: on the same arrays,
Polygraphy's own comparator (SimpleCompareFunc, the function behind `polygraphy run`'s
--check-error-stat) gives the same statistics, bit for bit, and the same verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trtbisect.errors import TrtBisectError
from trtbisect.judge.compare import Tolerance
from trtbisect.judge.flags import parse_criteria
from trtbisect.judge.stats import STATISTICS

polygraphy = pytest.importorskip("polygraphy")


def _pairs():
    """(reference, candidate) pairs: FP16-like noise, outliers, zeros in the reference,
    non-finite candidates, float16 and integer outputs, a scalar and an empty output."""
    rng = np.random.default_rng(11)
    ref = rng.standard_normal((4, 64)).astype(np.float32)
    half = ref.astype(np.float16).astype(np.float32)
    spiky = half.copy()
    spiky[0, :3] += 0.5
    zeros = ref.copy()
    zeros[:, ::7] = 0
    zeros_got = zeros + np.float32(1e-4)
    nan = half.copy()
    nan[1, 5] = np.nan
    inf = half.copy()
    inf[2, 2] = np.inf
    probs = 1 / (1 + np.exp(-4 * ref))
    yield "fp16 noise", ref, half
    yield "outliers", ref, spiky
    yield "zeros in the reference", zeros, zeros_got
    yield "equal", ref, ref.copy()
    yield "nan", ref, nan
    yield "inf", ref, inf
    yield "probabilities", probs.astype(np.float32), (probs + 3e-3 * rng.standard_normal(
        probs.shape)).astype(np.float32)
    yield "float16 candidate", ref, ref.astype(np.float16)
    yield "int64", rng.integers(-5, 5, 40), rng.integers(-5, 5, 40)
    yield "scalar", np.array(2.0, np.float32), np.array(2.01, np.float32)
    yield "empty", np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32)


TOLERANCES = [(1e-2, 0.0), (1e-5, 1e-5), (0.0, 1e-3), (0.5, 0.05)]


def _polygraphy(ref, got, stat, rtol, atol, q):
    from polygraphy.comparator import IterationResult, SimpleCompareFunc
    func = SimpleCompareFunc(rtol=rtol, atol=atol, check_error_stat=stat, error_quantile=q)
    # output0: the candidate, output1: the FP32 reference (`polygraphy run --trt --onnxrt`,
    # `--load-outputs fp32.json`), so reldiff is relative to the reference
    out = func(IterationResult({"y": got}, runner_name="fp16"),
               IterationResult({"y": ref}, runner_name="fp32"))
    return out["y"]


def _same(a: float, b) -> bool:
    b = float(b)
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize("stat", STATISTICS)
def test_statistics_and_verdicts_are_polygraphys(stat):
    checked = 0
    for what, ref, got in _pairs():
        for rtol, atol in TOLERANCES:
            for q in ((0.5, 0.99, 1.0) if stat == "quantile" else (0.99,)):
                crit = parse_criteria([stat], [str(q)] if stat == "quantile" else [])
                j = crit.judge({"y": ref}, {"y": got}, {}, Tolerance(rtol, atol))
                (score,) = j.errors["y"].scores
                theirs = _polygraphy(ref, got, stat, rtol, atol, q)
                field = "max" if stat == "elemwise" else stat
                detail = dict(score.detail)
                where = (what, stat, rtol, atol, q)
                assert _same(score.value, getattr(theirs, f"{field}_absdiff")), where
                assert _same(detail["rel"], getattr(theirs, f"{field}_reldiff")), where
                assert score.passed is bool(theirs), where
                assert j.passed is bool(theirs), where
                checked += 1
    assert checked >= 40


def test_verdicts_differ_from_trtbisects_range_criterion_where_they_should():
    """Not a renaming: Polygraphy's max is relative to each element, trtbisect's to the
    range, and the quantile forgives outliers the max does not."""
    _, ref, spiky = list(_pairs())[1]
    tol = Tolerance(1e-2, 0.0)
    assert not parse_criteria().judge({"y": ref}, {"y": spiky}, {}, tol).passed
    assert parse_criteria(["quantile"], ["0.9"]).judge({"y": ref}, {"y": spiky}, {}, tol).passed
    assert not parse_criteria(["max"]).judge({"y": ref}, {"y": spiky}, {}, tol).passed


def test_per_output_statistics_and_quantiles_resolve_as_polygraphy_does():
    crit = parse_criteria(["mean", "b:quantile", "c:d:max"], ["0.5", "b:0.9"])
    assert [(c.name, c.args) for c in crit.for_output("a")] == [("mean", ("mean", 0.99))]
    assert [c.args for c in crit.for_output("b")] == [("quantile", 0.9)]
    assert [c.name for c in crit.for_output("c:d")] == ["max"]  # split at the last ':'
    only = parse_criteria(["b:quantile"])
    assert only.for_output("a") == () and only.for_output("b")[0].args == ("quantile", 0.99)


@pytest.mark.parametrize("args, words", [
    (dict(stats=["maximum"]), "unknown statistic 'maximum'"),
    (dict(stats=["y:"]), "unknown statistic ''"),
    (dict(stats=["quantile"], quantiles=["1.5"]), "in [0, 1]"),
    (dict(stats=["quantile"], quantiles=["y:abc"]), "in [0, 1]"),
    (dict(quantiles=["0.9"]), "no effect without --check-error-stat quantile"),
])
def test_bad_statistics_are_one_line_usage_errors(args, words):
    with pytest.raises(TrtBisectError) as e:
        parse_criteria(**args)
    assert words in str(e.value) and e.value.exit_code == 2 and "\n" not in str(e.value)
