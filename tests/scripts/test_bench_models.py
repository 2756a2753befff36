"""The benchmark generators (scripts/bench_models.py) write what they promise, at CI size."""

from __future__ import annotations

import sys
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_models import ALIGN, FAULT_SCALE, fault_blocks, synthetic_transformer, wide_matmul_stack  # noqa: E402

FP16_MAX = 65504.0


def _session(model: onnx.ModelProto | str) -> ort.InferenceSession:
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def _pow_maxima(model: onnx.ModelProto, feeds: dict) -> dict[str, float]:
    """FP32 absmax of every Pow output (the x^2 of each normalisation), by node name."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    pows = [n for n in m.graph.node if n.op_type == "Pow"]
    m.graph.output.extend(onnx.helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, None)
                          for n in pows)
    values = _session(m).run([n.output[0] for n in pows], feeds)
    return {n.name: float(np.abs(v).max()) for n, v in zip(pows, values)}


@pytest.fixture(scope="module")
def small_wide(tmp_path_factory):
    out = tmp_path_factory.mktemp("wide")
    tracemalloc.start()
    try:
        w = wide_matmul_stack(16e6, out, width=256)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return w, peak


def test_wide_stack_is_valid_onnx_with_its_weights_outside_the_proto(small_wide):
    w, _ = small_wide
    onnx.checker.check_model(str(w.path))  # by path: checks the external references too
    model = onnx.load(str(w.path), load_external_data=False)
    assert model.ir_version == 10
    size = w.data_path.stat().st_size
    external = [t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    assert {t.name for t in external} == {f"blocks.{i}.fc.{k}" for i in range(w.blocks)
                                         for k in ("weight", "bias")}
    total = 0
    for t in external:
        info = {e.key: e.value for e in t.external_data}
        offset, length = int(info["offset"]), int(info["length"])
        assert info["location"] == w.data_path.name and not t.raw_data
        assert offset % ALIGN == 0 and offset + length <= size
        assert length == 4 * int(np.prod(t.dims))
        total += length
    assert total == w.weight_bytes and abs(total - 16e6) < 256 * 256 * 4
    assert w.path.stat().st_size < w.weight_bytes / 20


def test_wide_stack_generator_holds_about_one_block(small_wide):
    w, peak = small_wide
    assert w.blocks >= 60
    assert peak < 6 * w.width * w.width * 4 < w.weight_bytes / 10


def test_wide_stack_computes_what_it_declares_and_overflows_only_where_planted(small_wide):
    """A numpy forward over the weights read back agrees with ORT on the file, and x^2 of
    the norms passes FP16's maximum exactly in the planted block."""
    w, _ = small_wide
    model = onnx.load(str(w.path))  # small: loading the data here is fine
    p = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    x, squares = w.inputs["x"].astype(np.float64), {}
    for i in range(w.blocks):
        h = x * p[f"blocks.{i}.norm.pre_scale"]
        squares[i] = float((h * h).max())
        h = h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-5)
        h = h * p[f"blocks.{i}/norm.weight"] + p[f"blocks.{i}/norm.bias"]
        x = np.maximum(h @ p[f"blocks.{i}.fc.weight"] + p[f"blocks.{i}.fc.bias"], 0)
    got = _session(str(w.path)).run(None, w.inputs)[0]
    np.testing.assert_allclose(got, x, rtol=1e-3, atol=1e-3)
    bad = {i for i, s in squares.items() if s > FP16_MAX}
    assert bad == {w.blocks // 2}
    assert w.expected_fp32 == {f"blocks.{w.blocks // 2}/norm/{n}"
                               for n in ("Pow", "ReduceMean_1", "Add", "Sqrt")}


def test_synthetic_transformer_size_faults_and_opset():
    m = synthetic_transformer(500, faults=2)
    onnx.checker.check_model(m.model, full_check=True)
    assert m.model.ir_version == 10 and m.model.opset_import[0].version == 14
    names = [n.name for n in m.model.graph.node]
    assert abs(len(names) - 500) <= 50 and len(set(names)) == len(names)
    assert {"Erf", "Softmax", "Transpose", "Reshape", "ReduceMean"} <= {
        n.op_type for n in m.model.graph.node}
    maxima = _pow_maxima(m.model, m.inputs)
    overflowing = {n for n, v in maxima.items() if v > FP16_MAX}
    blocks = fault_blocks(sum(n.endswith("/ln1/Pow") for n in names), 2)
    assert overflowing == {f"blocks.{i}/ln1/Pow" for i in blocks} and len(blocks) == 2
    assert overflowing <= m.expected_fp32 <= set(names) and len(m.expected_fp32) == 8
    assert max(v for n, v in maxima.items() if n not in overflowing) < FP16_MAX / FAULT_SCALE


def test_synthetic_transformer_without_faults_plants_nothing():
    m = synthetic_transformer(300, faults=0)
    assert m.expected_fp32 == frozenset()
    assert max(_pow_maxima(m.model, m.inputs).values()) < FP16_MAX
