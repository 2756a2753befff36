"""`trtbisect run --backend trt` and `trtbisect env`, wired through the CLI (TensorRT is absent
here: a missing TensorRT is a one-line exit 2; the wiring itself runs on the fake TensorRT)."""

from __future__ import annotations

import json

from tests.conftest import save_zoo_model
from tests.test_cli import assert_one_line_error, invoke
from tests.test_trt_backend import fake


def test_backend_trt_without_tensorrt_is_a_clean_usage_error(zoo, tmp_path):
    model, inputs = save_zoo_model(zoo["healthy"], tmp_path)
    r = invoke("run", model, "--inputs", inputs, "--backend", "trt", "--out", tmp_path / "o")
    assert_one_line_error(r, 2, "TensorRT")


def test_env_lists_backends():
    r = invoke("env", "--json")
    assert r.exit_code == 0
    rows = {row["component"]: row["usable"] for row in json.loads(r.output)}
    assert rows.get("--backend trt") is False  # no TensorRT on this machine
    assert any("onnxruntime" in k or "ort" in k for k in rows)


def test_backend_trt_runs_the_emulator_plan_on_engines(monkeypatch, zoo, tmp_path):
    fake.install(monkeypatch)
    z = zoo["layernorm_overflow"]
    model, inputs = save_zoo_model(z, tmp_path)
    r = invoke("-q", "run", model, "--semantics", "strict", "--inputs", inputs, "--backend", "trt",
               "--out", tmp_path / "o",
               "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert set(data["fp32_nodes"]) == z.expected_fp32
    trt = data["tensorrt"]
    # FP32, FP16 and the final engine: built, or served by the engine cache of an earlier test
    assert trt["builds"] + trt["cache_hits"] == 3
    plan = json.loads((tmp_path / "o" / "precision.json").read_text())
    assert plan["tensorrt"]["result"]["emulator_agreed"]
