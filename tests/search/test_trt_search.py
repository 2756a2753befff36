"""The TensorRT search's options (trt_search.py): what `run --backend trt` hands the search,
and the judge's settings its GPU workers rebuild the criteria from. The search itself runs on
the fake TensorRT in tests/backends/test_trt_backend.py, test_trt_pool.py and test_trt_criteria.py."""

from __future__ import annotations

from trtbisect.context import Options
from trtbisect.judge.compare import Tolerance
from trtbisect.judge.flags import criteria_flags, parse_criteria
from trtbisect.judge.settings import criteria_digest
from trtbisect.stages.trt import TrtSearchOptions


def test_the_runs_flags_reach_the_trt_search():
    crit = parse_criteria(metrics=["y:cosine:0.999"], pass_rate=0.5)
    opts = Options.of(tolerance=Tolerance(rtol=1e-3, atol=1e-5), criteria=crit,
                      shapes={"x": (1, 8)}, workers=3, threads=2)
    got = TrtSearchOptions.of(opts)
    assert (got.tolerance, got.criteria, got.shapes, got.workers) == (
        opts.judge.tolerance, crit, {"x": (1, 8)}, 3)
    # what `run` never set keeps the search's defaults
    assert (got.cache_dir, got.typing, got.max_builds, got.certify, got.worker_setup) == (
        None, "auto", None, False, None)
    judge = got.judge()
    assert judge.tolerance == opts.judge.tolerance
    assert judge.criteria_flags == tuple(criteria_flags(crit))
    assert judge.criteria_fingerprint == criteria_digest(crit)
    back = judge.criteria()  # what a GPU worker judges by
    assert back.describe() == crit.describe() and back.pass_rate == 0.5


def test_the_default_criteria_judge_by_the_tolerance_alone():
    for crit in (None, parse_criteria()):
        options = TrtSearchOptions(tolerance=Tolerance(rtol=2e-3), criteria=crit)
        assert options.judged_by is None  # report.criterion stays unset
        judge = options.judge()
        assert judge.criteria_flags == () and judge.criteria_fingerprint == ""
        assert judge.tolerance == Tolerance(rtol=2e-3)
    assert TrtSearchOptions.of(Options()).judged_by is None
