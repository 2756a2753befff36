"""Layer-wise statistics: the counts an FP16 store would produce, from thresholds."""

from __future__ import annotations

import numpy as np

from trtbisect.judge.compare import compare_output, round_fp16, tensor_stats


def test_overflow_and_flush_counts_are_what_an_fp16_store_does():
    edge = np.array([65504, 65519.996, 65520, -65520, 7e4, 2.0**-25, np.nextafter(2.0**-25, 1),
                     -2.0**-25, 2.0**-24, 1e-30, 0.0, -0.0, 3e38, np.inf, np.nan], np.float32)
    rng = np.random.default_rng(0)
    ref = np.concatenate([edge, (rng.standard_normal(4000) * 10.0 ** rng.integers(-9, 6, 4000))
                          .astype(np.float32)])
    r16 = round_fp16(ref)
    s = tensor_stats("t", None, ref, r16)
    assert s.overflow == np.count_nonzero(np.isfinite(ref) & np.isinf(r16))
    assert s.flushed == np.count_nonzero((ref != 0) & (r16 == 0))
    assert s.overflow >= 4 and s.flushed >= 3  # the edge values count


def test_errors_match_compare_output_with_zero_tolerance():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((8, 64)).astype(np.float32)
    got = ref + rng.standard_normal(ref.shape).astype(np.float32) * 1e-3
    got[0, 0], ref[1, 1] = np.inf, np.nan
    s, e = tensor_stats("t", None, ref, got), compare_output(ref, got, 0.0, 0.0)
    assert (s.max_abs_err, s.rel_err) == (e.max_abs, e.rel) and s.max_abs_err == np.inf
    assert (s.fp32_nonfinite, s.fp16_nonfinite) == (1, 1)
    got[0, 0] = ref[0, 0]
    s, e = tensor_stats("t", None, ref, got), compare_output(ref, got, 0.0, 0.0)
    assert (s.max_abs_err, s.rel_err) == (e.max_abs, e.rel)
    assert np.isclose(s.mean_abs_err, e.mean_abs, rtol=1e-12)
    assert np.isclose(s.cosine, e.cosine, rtol=1e-12)


def _stats_by_definition(ref: np.ndarray, got: np.ndarray) -> tuple:
    """Each field of TensorStats straight from its definition, masks everywhere."""
    ref, got = ref.ravel().astype(np.float32), got.ravel().astype(np.float32)
    fr, fg = np.isfinite(ref), np.isfinite(got)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(got.astype(np.float64) - ref)
    diff[~np.isfinite(diff)] = np.inf
    diff = diff[fr]
    ref_max = float(np.abs(ref).max(initial=0.0, where=fr))
    max_abs = float(diff.max(initial=0.0))
    rel = max_abs / ref_max if ref_max > 0 else (0.0 if max_abs == 0 else np.inf)
    both = fr & fg
    a, b = ref[both].astype(np.float64), got[both].astype(np.float64)
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    cos = (1.0 if na == nb else 0.0) if na == 0.0 or nb == 0.0 else float(np.dot(a, b) / (na * nb))
    if np.any(fr & ~fg):  # the candidate non-finite where FP32 is finite: nothing to measure
        cos = np.nan
    mag = np.abs(ref)
    return (ref_max, float(np.abs(got).max(initial=0.0, where=fg)), max_abs, rel,
            float(diff.mean()) if diff.size else 0.0, cos, int(np.count_nonzero(~fr)),
            int(np.count_nonzero(~fg)), int(np.count_nonzero(fr & (mag >= 65520))),
            int(np.count_nonzero((mag > 0) & (mag <= 2.0**-25))), ref.size)


def test_cosine_of_an_output_gone_non_finite_is_nan_not_one():
    """All-inf (or partly inf) where FP32 is finite: no agreement to measure, never 1.0."""
    ref = np.linspace(1, 2, 16, dtype=np.float32)
    for got in (np.full_like(ref, np.inf), np.where(ref > 1.5, np.inf, ref)):
        e = compare_output(ref, got, 0.01, 0.0)
        assert np.isnan(e.cosine) and not e.passed and e.nonfinite > 0
        assert np.isnan(tensor_stats("t", None, ref, got).cosine)
    assert compare_output(ref, ref, 0.01, 0.0).cosine == 1.0


def test_tensor_stats_fast_paths_give_the_numbers_of_the_definition_bit_for_bit():
    """All finite, non-finite in either side, zeros, empty: the masks are skipped only where
    they change nothing."""
    rng = np.random.default_rng(3)
    cases = []
    for n in (0, 1, 7, 1000, 50_000):
        ref = (rng.standard_normal(n) * 10.0 ** rng.integers(-8, 6, n)).astype(np.float32)
        cases += [(ref, round_fp16(ref)), (ref, ref), (np.zeros(n, np.float32), ref)]
        if n:
            bad = ref.copy()
            bad[rng.integers(0, n, max(1, n // 100))] = np.inf
            nan = ref.copy()
            nan[0] = np.nan
            cases += [(ref, bad), (bad, ref), (nan, round_fp16(nan)), (bad, bad)]
    for ref, got in cases:
        s = tensor_stats("t", None, ref, got)
        fields = (s.fp32_absmax, s.fp16_absmax, s.max_abs_err, s.rel_err, s.mean_abs_err,
                  s.cosine, s.fp32_nonfinite, s.fp16_nonfinite, s.overflow, s.flushed, s.size)
        expected = _stats_by_definition(ref, got)
        assert np.array_equal(np.array(fields, np.float64), np.array(expected, np.float64),
                              equal_nan=True), (ref[:4], got[:4])
