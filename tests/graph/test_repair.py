"""The run's own copy of a model (graph/repair.py, #34): what ONNX Runtime runs but the checker
or the copies refuse is mended in the copy, said in one line and recorded in precision.json, the
user's file untouched; an input needing a shape asks for --shape, a fed default value is refused.
The whole classes' planted plans are in tests/graph/test_input_models.py."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from tests.graph.test_input_models import _save
from tests.models import input_models as im
from trtbisect.cli import main

REPAIRS = {"ir3_weights_as_inputs": "are IR version 4, not 3",
           "opset4_casts": "are opset 6, converted from 4",
           "defaulted_input_used": "take input(s) 'k2' as the constant(s)",
           "defaulted_input_unused": "take input(s) 'unused' as the constant(s)",
           "sparse_initializer": "hold sparse initializer(s) 'k2' dense",
           "shapeless_io": "give output(s) 'y' the shapes inference finds",
           "shapeless_output": "give output(s) 'y' the shapes inference finds",
           "empty_graph_name": "name the graph 'm'",
           "unsorted_nodes": "sort the nodes into execution order",
           "if_branch_sparse": "hold sparse initializer(s) 'k2' (in 'branch[then_branch]') dense",
           "loop_body_defaulted": "take subgraph input(s) 'k2' (in 'loop[body]') as the "
                                  "constant(s) their initializers hold",
           "nested_sparse_defaulted": "hold sparse initializer(s) 'k2' (in "
                                      "'branch[then_branch]/loop[body]') dense",
           "scan_body_sparse_defaulted": "take subgraph input(s) 'k3' (in 'scan[body]')"}


@pytest.mark.parametrize("name", sorted(REPAIRS))
def test_the_line_says_what_the_copy_changed(tmp_path, name):
    path, inputs, _ = _save(tmp_path, im.JUDGED[name]())
    r = CliRunner().invoke(main, ["run", str(path), "--inputs", str(inputs), "--out",
                                  str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    flat = " ".join(r.stderr.split())
    assert REPAIRS[name] in flat and "(the file itself is untouched)" in flat
    plan = json.loads((tmp_path / "o" / "precision.json").read_text())
    assert any(REPAIRS[name] in c for c in plan["model_copy"])


def test_an_unused_defaulted_input_is_never_required(tmp_path):
    """Random samples feed x alone: neither the reference nor any copy asks for 'unused'."""
    path, _, _ = _save(tmp_path, im.defaulted_input_unused())
    r = CliRunner().invoke(main, ["-q", "run", str(path), "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    mixed = onnx.load(str(tmp_path / "o" / "m.mixed.onnx"))
    assert [v.name for v in mixed.graph.input] == ["x"]


def test_a_shapeless_input_takes_shape_or_npz_else_one_line(tmp_path):
    path, inputs, _ = _save(tmp_path, im.shapeless_io())
    r = CliRunner().invoke(main, ["-q", "run", str(path), "--out", str(tmp_path / "o")])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "--shape x:" in lines[0]
    r = CliRunner().invoke(main, ["-q", "run", str(path), "--shape", "x:2x4", "--out",
                                  str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    dims = [d.dim_value for d in onnx.load(str(tmp_path / "o" / "m.mixed.onnx"))
            .graph.input[0].type.tensor_type.shape.dim]
    assert dims == [2, 4]


def test_a_fed_default_value_is_refused_saying_why(tmp_path):
    """TensorRT's parser makes a weight of an input with an initializer: feeding it another
    value would judge a model TensorRT never builds."""
    path, _, _ = _save(tmp_path, im.defaulted_input_used())
    np.savez(tmp_path / "fed.npz", x=im.X, k2=np.eye(4, dtype=np.float32))
    r = CliRunner().invoke(main, ["-q", "run", str(path), "--inputs", str(tmp_path / "fed.npz"),
                                  "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "k2: a default value (an initializer)" in r.stderr


def test_densify_takes_flat_indices_and_coordinates():
    from onnx import helper as h
    from onnx import numpy_helper as nh

    from trtbisect.graph.repair import densify
    values = nh.from_array(np.array([1.0, 2.0, 3.0], np.float32), "w")
    flat = h.make_sparse_tensor(values, nh.from_array(np.array([0, 5, 11], np.int64), "i"),
                                [3, 4])
    coords = h.make_sparse_tensor(values, nh.from_array(np.array([[0, 0], [1, 1], [2, 3]],
                                                                 np.int64), "i"), [3, 4])
    want = np.zeros((3, 4), np.float32)
    want[0, 0], want[1, 1], want[2, 3] = 1, 2, 3
    np.testing.assert_array_equal(densify(flat), want)
    np.testing.assert_array_equal(densify(coords), want)


def test_the_sort_keeps_the_files_order_wherever_it_is_one():
    from trtbisect.graph.repair import topological_order
    g = im.unsorted_nodes().graph  # down, up2, up1: reversed
    assert topological_order(g) == [2, 1, 0]
    assert topological_order(im.overflow().graph) == [0, 1, 2]
    # two independent chains keep their file order: the earliest ready node first
    from onnx import helper as h
    nodes = [h.make_node("Relu", ["b"], ["c"], name="late"), h.make_node("Relu", ["x"], ["a"]),
             h.make_node("Relu", ["x"], ["b"])]
    assert topological_order(h.make_graph(nodes, "g", [], [])) == [1, 2, 0]


def test_a_body_weight_without_data_is_refused_as_onnx_runtime_refuses_it(tmp_path):
    """A Loop body initializer with dims and no data: ONNX Runtime refuses the model itself, so
    there is no FP32 reference to judge against: one line, exit 2, never our copy's fault."""
    path, inputs, before = _save(tmp_path, im.loop_body_dataless())
    r = CliRunner().invoke(main, ["-q", "run", str(path), "--inputs", str(inputs), "--out",
                                  str(tmp_path / "o")])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1, r.output
    assert "k2" in lines[0] and "bug in trtbisect" not in lines[0]
    assert path.read_bytes() == before


def test_subgraph_repairs_leave_the_callers_proto_and_the_file_alone(tmp_path):
    """own_copy changes the proto load_model read, which only trtbisect holds: the file's bytes
    and a model the caller built stay as they were."""
    from trtbisect.graph import load_model
    model = im.nested_sparse_defaulted()
    path, _, before = _save(tmp_path, model)
    kept = model.SerializeToString()
    notes: list[str] = []
    copy = load_model(path, notes=notes)
    assert notes == ["hold sparse initializer(s) 'k2' (in 'branch[then_branch]/loop[body]') "
                     "dense", "take subgraph input(s) 'k3' (in 'branch[then_branch]/loop[body]')"
                     " as the constant(s) their initializers hold, as ONNX Runtime does"]
    assert path.read_bytes() == before
    assert model.SerializeToString() == kept
    then = next(a.g for a in copy.graph.node[-1].attribute if a.name == "then_branch")
    body = then.node[0].attribute[0].g
    assert not body.sparse_initializer and [v.name for v in body.input] == ["i", "cond_in",
                                                                             "v_in"]
    assert {t.name for t in body.initializer} == {"k2", "k3"}
    onnx.checker.check_model(copy, full_check=True)  # the copy passes what the file fails


def _external(tmp_path, model: onnx.ModelProto, location: str = "w.bin"):
    """The model saved with every weight, the bodies' too, in one external data file."""
    path = tmp_path / "m.onnx"
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location=location, size_threshold=0)
    np.savez(tmp_path / "in.npz", x=im.X)
    return path, tmp_path / "in.npz"


@pytest.mark.parametrize("model, line", [
    (im.overflow, None),
    (lambda: _body_weights_of(im.loop_body_defaulted()),
     "keep subgraph weight(s) 'k2' (in 'loop[body]'), stored in external data, in the main"),
    (im.if_branches_one_weight_name,
     "read subgraph weight(s) 'w' (in 'branch[else_branch]'), 'w' (in 'branch[then_branch]') "
     "from external data into the copy")])
def test_a_body_weight_in_external_data_is_a_weight(tmp_path, model, line):
    """ONNX Runtime reads a body's external weight beside the file; a session built from the
    copy in memory cannot, so before this the run blamed ONNX Runtime (exit 2). The planted
    plan, files that load, and the model and its data file untouched."""
    path, inputs = _external(tmp_path, model())
    data = tmp_path / "w.bin"
    before = path.read_bytes(), data.read_bytes()
    r = CliRunner().invoke(main, ["run", str(path), "--inputs", str(inputs), "--out",
                                  str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    flat = " ".join(r.stderr.split())
    assert (line in flat) if line else "trtbisect's copies" not in flat
    plan = json.loads((tmp_path / "o" / "precision.json").read_text())
    holder = {"loop_dflt": "loop[body]/", "if_w": "branch[then_branch]/"}.get(
        onnx.load(str(path), load_external_data=False).graph.name, "")
    assert set(plan["fp32_nodes"]) == {f"{holder}up2", f"{holder}down"}
    for f in (tmp_path / "o").glob("*.onnx"):
        onnx.checker.check_model(str(f), full_check=True)
        import onnxruntime as ort
        ort.InferenceSession(str(f), providers=["CPUExecutionProvider"])
    assert (path.read_bytes(), data.read_bytes()) == before
    from trtbisect.graph import external_files
    assert external_files(path) == [data]  # hashed with the model, never moved


def _body_weights_of(model: onnx.ModelProto) -> onnx.ModelProto:
    """loop_body_defaulted without the default: k2 a plain initializer of the body."""
    body = model.graph.node[0].attribute[0].g
    del body.input[3:]
    return model


def test_a_body_weight_outside_the_models_folder_is_refused(tmp_path):
    model = _body_weights_of(im.loop_body_defaulted())
    (tmp_path / "sub").mkdir()
    path, inputs = _external(tmp_path / "sub", model)
    loaded = onnx.load(str(path), load_external_data=False)
    body = loaded.graph.node[0].attribute[0].g
    body.initializer[0].external_data[0].value = "../w.bin"  # the body's weight only
    onnx.save(loaded, path)
    (tmp_path / "w.bin").write_bytes((tmp_path / "sub" / "w.bin").read_bytes())  # it is there
    r = CliRunner().invoke(main, ["-q", "run", str(path), "--inputs", str(inputs), "--out",
                                  str(tmp_path / "o")])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "unsafe external-data location" in lines[0]
