"""One price per model and GPU class (#46 item 5): the quantized run's all-FP16 figure is the
FP16 run's for the same float model, and the console says what the quantized file keeps in
FP32 and prices it so."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from tests.models import quant_models as qm
from tests.test_cli import invoke
from trtbisect.quant import analyse, unquantize
from trtbisect.quant.cost import pricing_for


@pytest.mark.parametrize("make", [qm.channels, qm.softmax], ids=lambda m: m.__name__)
def test_the_all_fp16_price_is_the_fp16_runs(make, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    p = make()
    model, fp32, inputs = (tmp_path / "q.onnx", tmp_path / "f.onnx", tmp_path / "in.npz")
    onnx.save(p.model, model)
    onnx.save(unquantize(p.model, analyse(p.model)), fp32)
    np.savez(inputs, **p.inputs)
    common = ["--inputs", inputs, "--rtol", p.rtol, "--validation-share", "0", "--gpu", "l4"]
    fp16 = invoke("-q", "run", fp32, *common, "--out", tmp_path / "a", "--json")
    quant = invoke("-q", "run", model, *common, "--reference", fp32, "--out", tmp_path / "b")
    assert fp16.exit_code in (0, 7) and quant.exit_code in (0, 7), quant.output
    a = json.loads(fp16.stdout)["cost"]["all_fp16_s"]
    got = json.loads((tmp_path / "b" / "precision.json").read_text())["cost"]
    assert got["all_fp16_s"] == a  # the same figure, bit for bit
    # softmax: the per-node price the quantized road used to give all-FP16 is another figure
    own = pricing_for(p.model, analyse(p.model), {}, p.inputs, "l4", False).all_fp16()
    assert (own != a) == (p.name == "softmax")
    line = next(x for x in quant.output.splitlines() if x.startswith("estimated engine"))
    assert f"all FP16 {a * 1e6:.4g} us" in line
    side = got["float_side"]
    assert side["dtype"] == "fp32"
    assert bool(got["file_fp32_nodes"]) == (p.name == "channels")
    if got["file_fp32_nodes"]:  # channels: its un-quantized node runs in FP32 in the file
        said = next(x for x in quant.output.splitlines() if x.startswith("the file keeps"))
        assert f"the file keeps {got['file_fp32_nodes']} float nodes in FP32" in said
        x = side["all_quantized_fp16_elsewhere_s"]
        assert f"with FP16 there (ModelOpt's high_precision_dtype='fp16') all quantized would " \
               f"take {x * 1e6:.4g} us" in said
        assert x < got["all_quantized_s"]
