"""scripts/bench_rewrites.py: the FLOP counter on known shapes, and one quick case end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import script_module

ROOT = Path(__file__).resolve().parents[2]


def _flop_model() -> onnx.ModelProto:
    """MatMul on a dynamic batch, Gemm with transB, grouped padded Conv, ConvTranspose."""
    rng = np.random.default_rng(0)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("MatMul", ["a", "wm"], ["m"], name="mm"),  # [N,3,4] x [4,5]
        helper.make_node("Gemm", ["g", "wg"], ["go"], name="gemm", transB=1),  # [3,4] x [6,4]^T
        helper.make_node("Conv", ["x", "wc"], ["c"], name="conv", group=2, pads=[1, 1, 1, 1]),
        helper.make_node("ConvTranspose", ["t", "wt"], ["to"], name="deconv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
    ]
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "flops",
        [helper.make_tensor_value_info("a", f, ["N", 3, 4]),
         helper.make_tensor_value_info("g", f, [3, 4]),
         helper.make_tensor_value_info("x", f, [1, 4, 8, 8]),
         helper.make_tensor_value_info("t", f, [1, 2, 4, 4])],
        [helper.make_tensor_value_info(n, f, None) for n in ("m", "go", "r", "to")],
        [w("wm", 4, 5), w("wg", 6, 4), w("wc", 6, 2, 3, 3), w("wt", 2, 3, 3, 3)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_flop_table_counts_exact_flops_at_the_samples_shapes():
    s = script_module("bench_rewrites")
    feeds = {"a": np.zeros((2, 3, 4), np.float32), "g": np.zeros((3, 4), np.float32),
             "x": np.zeros((1, 4, 8, 8), np.float32), "t": np.zeros((1, 2, 4, 4), np.float32)}
    flops = s.flop_table(_flop_model(), feeds)
    assert flops == {
        "mm": 2 * (2 * 3) * 5 * 4,  # batch 2 from the feeds, not the declared "N"
        "gemm": 2 * 3 * 6 * 4,
        "conv": 2 * 6 * 8 * 8 * (4 // 2) * 3 * 3,  # 2 * Cout*Hout*Wout * Cin/groups*kh*kw
        "deconv": 2 * (2 * 4 * 4) * 3 * 3 * 3,  # every input pixel into Cout*kh*kw
    }
    assert s.flop_share(["conv", "relu"], flops, sum(flops.values())) == flops["conv"] / sum(
        flops.values())
    unknown = s.flop_table(_flop_model(), {})  # batch left symbolic: MatMul unknown, not guessed
    assert unknown["mm"] is None and unknown["gemm"] == flops["gemm"]


def test_quick_run_on_one_zoo_model_fills_the_table(tmp_path):
    s = script_module("bench_rewrites")
    doc = tmp_path / "rewrites.md"
    doc.write_text((ROOT / "docs" / "rewrites.md").read_text(encoding="utf-8"), encoding="utf-8")
    results = tmp_path / "results.json"
    assert s.main(["--quick", "--only", "zoo/attention_logits", "--timeout", "0",
                   "--results", str(results), "--doc", str(doc)]) == 0
    rec = json.loads(results.read_text())["cases"]["zoo/attention_logits"]
    plain, rewritten, dd = (rec["runs"][f"strict/{k}"] for k in ("plain", "rewrite", "ddmin"))
    assert plain["patterns"] == ["attention_logits"]
    assert plain["fp32_nodes"] == dd["fp32_nodes"] == 2 and set(plain["plan"]) == set(dd["plan"])
    assert rewritten["fp32_nodes"] == 0 and rewritten["rewrites"] == ["prescale_attention"]
    assert rewritten["flop_share"] == 0.0
    # the plan holds the QK^T MatMul: its share is that node's FLOPs over the model's
    from tests.models.make_models import zoo

    z = zoo()["attention_logits"]
    flops = s.flop_table(z.model, z.inputs)
    qk = [n for n in plain["plan"] if n in flops]
    assert len(qk) == 1 and plain["flop_share"] == flops[qk[0]] / sum(flops.values())
    text = doc.read_text(encoding="utf-8")
    assert text.count(s.BEGIN) == 1 and "## Integration" in text and "## The rewrites" in text
    assert "| zoo/attention_logits | strict | attention_logits | 2 (" in text
    assert "**zoo/attention_logits** (pre-scale attention): reaches zero FP32 nodes" in text
