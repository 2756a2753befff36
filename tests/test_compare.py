"""Layer-wise statistics: the counts an FP16 store would produce, from thresholds."""

from __future__ import annotations

import numpy as np

from trtbisect.compare import compare_output, round_fp16, tensor_stats


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
