"""An op whose schema takes no float16 (Range, as YOLOv8's anchor grid uses it) is judged, not
a partial verdict's leftover: no FP16 file can type it float16, so the mixed model keeps it
FP32, TensorRT 11 builds it so, the judge computes it so, and every weak-typing line
(TensorRT 10) pins it with the plan. A contrib op stays partial (tests/graph/test_control_flow.py)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from trtbisect.context import Options
from trtbisect.graph import Graph
from trtbisect.pipeline import check_mixed, run
from trtbisect.stages import coverage

RANGES = ("grid_x", "grid_y")


def anchor_grid(overflow: bool) -> onnx.ModelProto:
    """x [1, 4]; two float Ranges over x's width (Shape -> Gather -> Cast); with `overflow`,
    `square` takes x (1e4 after `boost`) past 65504 and only `back` brings it under again,
    so `square`, `shrink` and `back` must stay FP32."""
    scale = 1e3 if overflow else 1.0
    init = [helper.make_tensor("idx", TensorProto.INT64, [], [1]),
            helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
            helper.make_tensor("half", TensorProto.FLOAT, [], [0.5]),
            helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
            helper.make_tensor("big", TensorProto.FLOAT, [], [scale]),
            helper.make_tensor("small", TensorProto.FLOAT, [], [1.0 / scale])]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "idx"], ["width_i"], name="width", axis=0),
        helper.make_node("Cast", ["width_i"], ["width"], name="width_f", to=TensorProto.FLOAT),
        helper.make_node("Range", ["zero", "width", "one"], ["gx"], name="grid_x"),
        helper.make_node("Range", ["half", "width", "one"], ["gy"], name="grid_y"),
        helper.make_node("Add", ["gx", "gy"], ["grid"], name="grid"),
        helper.make_node("Mul", ["x", "big"], ["boosted"], name="boost"),
        helper.make_node("Mul", ["boosted", "boosted"], ["squared"], name="square"),
        helper.make_node("Mul", ["squared", "small"], ["shrunk"], name="shrink"),
        helper.make_node("Mul", ["shrunk", "small"], ["back"], name="back"),
        helper.make_node("Add", ["back", "grid"], ["y"], name="out"),
    ]
    graph = helper.make_graph(nodes, "anchor_grid",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _save(model: onnx.ModelProto, folder) -> tuple[str, str]:
    path, inputs = folder / "grid.onnx", folder / "grid.npz"
    onnx.save(model, path)
    np.savez(inputs, x=np.array([[9.0, 10.0, 11.0, 12.0]], np.float32))
    return str(path), str(inputs)


def test_range_is_kept_fp32_by_its_schema_not_unjudged():
    g = Graph(anchor_grid(overflow=False))
    assert g.fp32_by_schema() == list(RANGES)
    assert not set(RANGES) & set(g.candidates())
    assert coverage.unjudged(g) == []
    (kept,) = coverage.kept_fp32(g)
    assert (kept.op, kept.domain, kept.nodes) == ("Range", "ai.onnx", RANGES)
    assert coverage.record(g).fp32_by_schema == (kept,)


@pytest.mark.parametrize("overflow", [False, True])
def test_a_graph_with_range_gets_a_full_verdict_and_tensorrt_10_pins_it(overflow, tmp_path):
    model, inputs = _save(anchor_grid(overflow), tmp_path)
    out = tmp_path / "out"
    r = run(model, Options.of(inputs=[inputs], semantics="strict"), out)
    assert r.verdict == ("fixed" if overflow else "fp16_ok") and r.exit_code == 0
    assert r.partial is None
    assert set(r.fp32_nodes) == ({"square", "shrink", "back"} if overflow else set())
    plan = json.loads((out / "precision.json").read_text())
    assert plan["coverage"]["unjudged"] == []
    (kept,) = plan["coverage"]["fp32_by_schema"]
    assert (kept["op"], kept["nodes"]) == ("Range", list(RANGES))
    # weak typing: the plan's nodes, then the Ranges; the plan itself does not grow
    pinned = [*sorted(r.fp32_nodes), *RANGES] if overflow else list(RANGES)
    listed = (out / "layer_precisions.txt").read_text().strip().split(",")
    assert sorted(listed) == sorted(f"{n}:fp32" for n in pinned)
    rend = plan["renderings"]
    assert "--precisionConstraints=obey" in rend["trtexec_trt10"]
    for n in RANGES:
        assert f"{n}:fp32" in rend["trtexec_trt10"] and n in rend["tensorrt_python"]
        assert f"{n}:float32" in rend["polygraphy"]
    assert "layerPrecisions" not in rend["trtexec_trt11"]  # the file carries the precisions
    mixed = onnx.load(out / "grid.mixed.onnx")
    ranges = [n for n in mixed.graph.node if n.op_type == "Range"]
    assert len(ranges) == 2
    types = {v.name: v.type.tensor_type.elem_type for v in mixed.graph.value_info}
    assert all(types.get(n.output[0], TensorProto.FLOAT) == TensorProto.FLOAT for n in ranges)
    checked = check_mixed(out / "grid.mixed.onnx", model,
                          Options.of(inputs=[inputs], semantics="strict"))
    assert checked.passed and checked.exit_code == 0 and checked.unjudged == []
    for out_name, e in checked.errors.items():  # one judge: bit for bit what run reported
        assert plan["errors_after"][out_name] == e.to_json()


def test_the_tensorrt_10_backend_pins_range_with_every_plan(monkeypatch, tmp_path):
    """Weak typing on the fake TensorRT 10: the Ranges' layers are forced to FP32 beside the
    plan's, so the engine computes what the judge did; strong typing forces nothing."""
    from tests.backends.test_trt_backend import fake
    from trtbisect.backends import trt as trt_backend

    fake.install(monkeypatch)
    backend = trt_backend.TrtBackend(anchor_grid(overflow=True), cache_dir=tmp_path)
    try:
        assert not backend.strong
        assert set(backend.forced_layers([])) == set(RANGES)
        assert set(backend.forced_layers(["square"])) == {"square", *RANGES}
    finally:
        backend.close()
