"""One flag table (trtbisect/roads.py): every option of `run` says, for each road, whether it
is honoured or refused; every refusal is one line and exit 2, before any work."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from tests.models import quant_models as qm
from trtbisect.cli import main, run
from trtbisect.roads import FLAGS, ROADS, refusal

# a value each refusable option can be given with (a flag: no value)
VALUES = {"fp16_accumulate": [], "strict": [], "budget": ["5"], "workers": ["2"], "ray_address": [],
          "rewrite": [], "stability": ["3"], "calibration": ["x.npz"],
          "quant_reference": ["ref.onnx"]}


def test_every_run_option_is_in_the_table_for_every_road():
    names = {p.name for p in run.params}
    assert names == set(FLAGS), (names ^ set(FLAGS))
    for name, roads in FLAGS.items():
        assert set(roads) == set(ROADS), name
        for road, why in roads.items():
            assert why is None or (isinstance(why, str) and "\n" not in why), (name, road)


def test_refusal_names_the_first_flag_the_road_cannot_honour():
    assert refusal("fp16", ["tf32", "workers"]) is None
    assert refusal("quantized", ["inputs", "workers"]).startswith("--workers")
    assert refusal("quantized", []) is None


@pytest.fixture
def quant_model(tmp_path):
    p = qm.outlier()
    model, inputs = tmp_path / "q.onnx", tmp_path / "q.npz"
    onnx.save(p.model, model)
    np.savez(inputs, **p.inputs)
    return model, inputs


@pytest.mark.parametrize("name", sorted(n for n, r in FLAGS.items() if r["quantized"]))
def test_each_flag_the_quantized_road_refuses_is_refused_in_one_line(name, quant_model,
                                                                      tmp_path):
    model, inputs = quant_model
    opt = next(p for p in run.params if p.name == name).opts[0]
    res = CliRunner().invoke(main, ["run", str(model), "--inputs", str(inputs), opt,
                                    *VALUES[name], "--out", str(tmp_path / "o")])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and opt in lines[0] and FLAGS[name]["quantized"] in lines[0]
    assert not (tmp_path / "o" / "precision.json").exists()  # refused before any work
