"""`trtbisect run --backend trt` and `trtbisect env`, wired through the CLI: a missing TensorRT
(made missing where it is installed) is a one-line exit 2; `env` reports what this machine has;
the wiring itself runs on the fake TensorRT."""

from __future__ import annotations

import json
import sys

from tests.backends.test_trt_backend import fake
from tests.conftest import save_zoo_model
from tests.test_cli import assert_one_line_error, invoke
from trtbisect.backends.trt import trt_available


def test_backend_trt_without_tensorrt_is_a_clean_usage_error(monkeypatch, zoo, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # absent, even where it is installed
    model, inputs = save_zoo_model(zoo["healthy"], tmp_path)
    r = invoke("run", model, "--inputs", inputs, "--backend", "trt", "--out", tmp_path / "o")
    assert_one_line_error(r, 2, "TensorRT")


def test_env_lists_backends():
    r = invoke("env", "--json")
    assert r.exit_code == 0
    rows = {row["component"]: row["usable"] for row in json.loads(r.output)}
    assert rows.get("--backend trt") is trt_available()[0]  # what this machine really has
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
    assert trt["builds"] == 3 and trt["cache_hits"] == 0  # FP32, FP16, final; a private cache
    plan = json.loads((tmp_path / "o" / "precision.json").read_text())
    assert plan["tensorrt"]["result"]["emulator_agreed"]
