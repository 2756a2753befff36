"""scripts/bench_cost.py and scripts/minilm_l6.py: one quick case end to end, the doc section,
and the safetensors reader on a hand-made file."""

from __future__ import annotations

import json
import struct

import numpy as np

from tests.conftest import script_module


def test_read_safetensors():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([7, 8], np.int64)
    header = {"__metadata__": {"format": "pt"},
              "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
              "b": {"dtype": "I64", "shape": [2], "data_offsets": [24, 40]}}
    raw = json.dumps(header).encode()
    data = struct.pack("<Q", len(raw)) + raw + a.tobytes() + b.tobytes()
    out = script_module("minilm_l6").read_safetensors(data)
    assert set(out) == {"a", "b"}
    np.testing.assert_array_equal(out["a"], a)
    np.testing.assert_array_equal(out["b"], b)


def test_one_case_end_to_end_and_the_doc_section(tmp_path):
    bench = script_module("bench_cost")
    name, build = next(c for c in bench.cases(lambda n: n == "zoo/reducesum_overflow"))
    rec = bench.measure(name, build, tmp_path / "w")
    m = rec["methods"]
    assert m["cost"]["passes"] is True and m["count"]["passes"] is True
    assert m["cost"]["slowdown"] <= m["ddmin"]["slowdown"] + 1e-12
    assert m["cost"]["evaluations"] <= 1.5 * m["count"]["evaluations"]
    doc = tmp_path / "doc.md"
    doc.write_text("# page\n\nkept\n")
    bench.write_doc(bench.render([rec]), doc)
    bench.write_doc(bench.render([rec]), doc)  # replaced, not appended twice
    text = doc.read_text()
    assert text.count(bench.BEGIN) == 1 and "kept" in text
    assert "| zoo/reducesum_overflow |" in text and "at most ddmin's on 1 of 1 runs" in text
