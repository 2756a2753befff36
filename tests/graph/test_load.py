"""Reading a model file (graph/load.py): whatever cannot be read (missing, truncated, not ONNX,
newer than the runtime, external data missing, unsafe or too big for this machine) is one line
and exit 2, before any weight is read or hashed."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

from tests.conftest import save_zoo_model
from tests.judge.test_degenerate import one_error_line
from tests.test_cli import assert_one_line_error, invoke
from trtbisect.errors import TrtBisectError
from trtbisect.graph import load as graph_load


def test_missing_model(tmp_path):
    assert_one_line_error(invoke("run", tmp_path / "nope.onnx"), 2, "not found")


def test_truncated_model(zoo, tmp_path):
    model, _ = save_zoo_model(zoo["layernorm_overflow"], tmp_path)
    data = model.read_bytes()
    model.write_bytes(data[: len(data) // 2])
    assert_one_line_error(invoke("run", model, "--out", tmp_path / "o"), 2, "ONNX")


def test_not_onnx_at_all(tmp_path):
    p = tmp_path / "x.onnx"
    p.write_text("hello, I am not a model")
    assert_one_line_error(invoke("run", p), 2)


def test_model_newer_than_the_runtime(zoo, tmp_path):
    m = onnx.ModelProto()
    m.CopyFrom(zoo["healthy"].model)
    m.ir_version = 99
    path = tmp_path / "new.onnx"
    onnx.save(m, path)
    r = invoke("run", path, "--out", tmp_path / "o")
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "IR version" in r.output or "ir_version" in r.output


def test_missing_external_data(zoo, tmp_path):
    m = onnx.ModelProto()
    m.CopyFrom(zoo["layernorm_overflow"].model)
    path = tmp_path / "ext.onnx"
    onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    ok = invoke("-q", "run", path, "--out", tmp_path / "o1", "--json")
    assert ok.exit_code == 0, ok.output
    (tmp_path / "weights.bin").unlink()
    assert_one_line_error(invoke("run", path, "--out", tmp_path / "o2"), 2, "external data")


def test_external_data_too_big_is_named_before_it_is_read(tmp_path, monkeypatch):
    n = 2**20  # 4 MiB of float32, declared; the file is sparse
    w = TP(name="W_huge", data_type=TP.FLOAT, dims=[n // 1024, 1024],
           data_location=TP.EXTERNAL)
    for k, v in (("location", "w.bin"), ("offset", "0"), ("length", str(4 * n))):
        w.external_data.add(key=k, value=v)
    g = h.make_graph([h.make_node("Gather", ["W_huge", "i"], ["y"], name="g")], "g",
                     [h.make_tensor_value_info("i", TP.INT64, [1])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 1024])], [w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 10
    onnx.save(m, tmp_path / "big.onnx")
    with open(tmp_path / "w.bin", "wb") as fh:
        fh.truncate(4 * n)
    monkeypatch.setattr(graph_load, "physical_memory", lambda: 2**20)  # a 1 MiB machine

    def never(*a, **k):
        raise AssertionError("the data was hashed before its size was checked")
    monkeypatch.setattr(graph_load, "_file_hash", never)
    line = one_error_line(invoke("-q", "run", tmp_path / "big.onnx", "--out", tmp_path / "out"))
    assert "'W_huge'" in line and "0.00391 GiB" in line and "'w.bin'" in line
    monkeypatch.setattr(graph_load, "physical_memory", lambda: 10 * 2**20)
    graph_load.check_weight_sizes(tmp_path / "big.onnx", [w, w])  # 8 MiB of 10: taken
    with pytest.raises(TrtBisectError, match="total 0.0195 GiB"):
        graph_load.check_weight_sizes(tmp_path / "big.onnx", [w, w, w, w, w])


@pytest.mark.parametrize("where", ["../w.bin", "sub/../../w.bin", "/tmp/w.bin", ""])
def test_external_data_outside_the_models_folder_is_refused(tmp_path, where):
    """A location that climbs out of the model's folder (or names no file) is never followed:
    the weights must sit beside the model."""
    (tmp_path / "w.bin").write_bytes(b"\0" * 16)
    w = TP(name="W", data_type=TP.FLOAT, dims=[4], data_location=TP.EXTERNAL)
    for k, v in (("location", where), ("offset", "0"), ("length", "16")):
        w.external_data.add(key=k, value=v)
    g = h.make_graph([h.make_node("Add", ["x", "W"], ["y"], name="a")], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [4])], [w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 10
    (tmp_path / "m").mkdir()
    onnx.save(m, tmp_path / "m" / "ext.onnx")
    line = one_error_line(invoke("-q", "run", tmp_path / "m" / "ext.onnx", "--out", tmp_path / "o"))
    assert "unsafe external-data location" in line and "'W'" in line
    with pytest.raises(TrtBisectError, match="keep the data files beside the model"):
        graph_load.load_model(tmp_path / "m" / "ext.onnx")
