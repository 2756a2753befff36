"""One behavioural contract, run against every backend: the ORT CPU emulator, TensorRT's code
paths on the fake `tensorrt` of 10.13 and of 11.4 (CPU), and real TensorRT where it is usable
(skipped elsewhere).

A backend serves precision plans: `candidates()` in topological order, `run(fp32_nodes, feeds)`
returning every graph output as float32, all-FP32 matching the FP32 reference, and FP16 that
really overflows where the model is planted to.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import onnx
import pytest

from tests.backends.test_trt_backend import fake
from trtbisect.backends import trt as trt_backend
from trtbisect.backends.ort import Emulator, Reference
from trtbisect.graph import Graph, node_names
from trtbisect.judge.compare import Tolerance, compare_outputs

Make = Callable[[onnx.ModelProto], object]


@pytest.fixture(params=["ort", "fake-trt", "fake-trt11", "trt"])
def make(request, monkeypatch, tmp_path) -> Iterator[tuple[Make, float]]:
    """(backend factory, rtol of all-FP32 against the ORT FP32 reference)."""
    made: list = []
    if request.param == "ort":
        def build(model):
            return Emulator(Graph(model))
        rtol = 1e-6
    elif request.param.startswith("fake-trt"):  # the API of 10.13 (weak typing) or 11.4
        fake.install(monkeypatch, version="11.4.0.106" if request.param == "fake-trt11"
                     else "10.13.0.35")

        def build(model):
            return trt_backend.TrtBackend(model, cache_dir=tmp_path)
        rtol = 1e-6
    else:
        ok, why = trt_backend.trt_available()
        if not ok:
            pytest.skip(f"TensorRT not usable here: {why}")

        def build(model):
            return trt_backend.TrtBackend(model, cache_dir=tmp_path)
        rtol = 1e-3  # GPU FP32 kernels (TF32 off) against ORT's CPU
    yield (lambda model: made.append(build(model)) or made[-1]), rtol
    for backend in made:
        backend.close()


def ancestors(model: onnx.ModelProto) -> dict[str, set[str]]:
    """Node name -> every node upstream of it."""
    names = node_names(model)
    producer = {t: names[i] for i, n in enumerate(model.graph.node) for t in n.output}
    up: dict[str, set[str]] = {}
    for i, n in enumerate(model.graph.node):  # zoo models are stored in topological order
        direct = {producer[t] for t in n.input if t in producer}
        up[names[i]] = direct.union(*(up[d] for d in direct))
    return up


@pytest.mark.parametrize("name", ["layernorm_overflow", "two_outputs"])
def test_candidates_are_in_topological_order(make, zoo, name):
    build, _ = make
    model = zoo[name].model
    cands = build(model).candidates()
    up = ancestors(model)
    assert cands and len(set(cands)) == len(cands) and set(cands) <= set(up)
    for i, c in enumerate(cands):
        assert not up[c] & set(cands[i + 1:]), f"{c} comes before one of its producers"


@pytest.mark.parametrize("name", ["layernorm_overflow", "two_outputs"])
def test_all_fp32_matches_the_fp32_reference_with_float32_outputs(make, zoo, name):
    build, rtol = make
    z = zoo[name]
    backend = build(z.model)
    ref = Reference(Graph(z.model)).run(z.inputs)
    got = backend.run(frozenset(backend.candidates()), z.inputs)
    assert set(got) == {o.name for o in z.model.graph.output}
    assert all(v.dtype == np.float32 for v in got.values())
    errors = compare_outputs(ref, got, Tolerance(rtol=rtol))
    assert all(e.passed for e in errors.values()), errors


@pytest.mark.parametrize("name", ["reducesum_overflow", "two_outputs"])
def test_fp16_overflows_where_fp32_is_finite(make, zoo, name):
    build, _ = make
    z = zoo[name]
    backend = build(z.model)
    ref = Reference(Graph(z.model)).run(z.inputs)
    got = backend.run(frozenset(), z.inputs)
    assert set(got) == set(ref) and all(v.dtype == np.float32 for v in got.values())
    assert all(np.isfinite(v).all() for v in ref.values())
    assert any((~np.isfinite(got[k])).any() for k in ref)
