"""The zoo models are valid, small, runnable on ORT CPU, and their expected answers name real nodes.

These checks guard the fixtures themselves, so a failing search test can be blamed on the search.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.models.make_models import ZooModel, deep_model, zoo

ZOO = zoo()
VERDICTS = {"fp16_ok", "fixed", "reference_invalid"}


def _run(m: ZooModel) -> list[np.ndarray]:
    session = ort.InferenceSession(m.model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, m.inputs)


def test_zoo_has_the_promised_models() -> None:
    assert {"layernorm_overflow", "reducesum_overflow", "attention_logits", "eps_underflow",
            "constant_out_of_range", "healthy", "fp32_broken", "two_outputs",
            "precision_loss"} <= ZOO.keys()


@pytest.mark.parametrize("name", sorted(ZOO))
def test_model_is_valid_and_small(name: str) -> None:
    m = ZOO[name].model
    onnx.checker.check_model(m, full_check=True)
    assert m.ir_version == 10
    names = [n.name for n in m.graph.node]
    assert all(names) and len(set(names)) == len(names)
    assert len(names) < 40
    assert all(np.prod(t.dims) < 65536 for t in m.graph.initializer)
    assert all(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
               for v in [*m.graph.input, *m.graph.output])


@pytest.mark.parametrize("name", sorted(ZOO))
def test_model_runs_in_fp32_with_expected_finiteness(name: str) -> None:
    m = ZOO[name]
    outputs = _run(m)
    assert len(outputs) == len(m.model.graph.output)
    finite = all(np.isfinite(o).all() for o in outputs)
    assert finite == (m.expected_verdict != "reference_invalid")


@pytest.mark.parametrize("name", sorted(ZOO))
def test_expected_answer_is_consistent(name: str) -> None:
    m = ZOO[name]
    assert m.name == name
    assert m.expected_verdict in VERDICTS
    assert m.expected_fp32 <= {n.name for n in m.model.graph.node}
    assert bool(m.expected_fp32) == (m.expected_verdict == "fixed")
    assert set(m.inputs) == {v.name for v in m.model.graph.input}
    assert all(a.dtype == np.float32 for a in m.inputs.values())


def test_zoo_is_deterministic() -> None:
    again = zoo()
    for name, m in ZOO.items():
        assert again[name].model.SerializeToString() == m.model.SerializeToString()
        for k, a in m.inputs.items():
            np.testing.assert_array_equal(again[name].inputs[k], a)


def test_deep_model_is_big_and_runs() -> None:
    m = deep_model()
    onnx.checker.check_model(m.model, full_check=True)
    names = {n.name for n in m.model.graph.node}
    assert len(m.model.graph.node) >= 600 and len(names) == len(m.model.graph.node)
    assert len(m.expected_fp32) == 8 and m.expected_fp32 <= names
    assert all(np.isfinite(o).all() for o in _run(m))


def test_deep_model_rejects_missing_blocks() -> None:
    with pytest.raises(ValueError):
        deep_model(blocks=4, overflow_blocks=(5,))
