"""`trtbisect export` and `trtbisect run FILE.py:FACTORY`: scopes kept, inputs saved, the
ONNX checked against PyTorch, culprits named by module."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")

from trtbisect.cli import main  # noqa: E402
from trtbisect.errors import TrtBisectError  # noqa: E402
from trtbisect.graph.modules import module_of  # noqa: E402
from trtbisect.torch.export import (  # noqa: E402
    ExportOptions,
    export,
    load_torch_model,
    parse_input_specs,
    resolve_model_arg,
)

FILE = Path(__file__).parents[1] / "models" / "torch_models.py"


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory):
    return export(f"{FILE}:tiny", ["x:2x5x8"], tmp_path_factory.mktemp("export") / "tiny.onnx")


def test_export_keeps_scopes_saves_inputs_and_reports_the_error(tiny_export):
    r = tiny_export
    model = onnx.load(r.onnx_path)
    assert model.ir_version <= 10
    names = [n.name for n in model.graph.node]
    assert "/blocks/blocks.1/ln2/LayerNormalization" in names
    assert r.exporter == "torchscript" and r.opset == 17
    assert r.passed and "output" in r.errors and 0 <= r.max_abs_err < 1e-4
    with np.load(r.inputs_path) as npz:
        assert npz.files == ["x"] and npz["x"].shape == (2, 5, 8)
    assert r.warnings == []  # opset 17 keeps LayerNorm whole


def test_every_scoped_node_names_a_real_module(tiny_export):
    from tests.models.torch_models import tiny

    modules = dict(tiny().named_modules())
    model = onnx.load(tiny_export.onnx_path)
    found = {module_of(n.name, model) for n in model.graph.node} - {None}
    assert ("blocks.1.ln2", "LayerNorm") in found and ("head", "Linear") in found
    for path, cls in found:
        assert type(modules[path]).__name__ == cls


def test_opset_below_17_warns_about_decomposed_layernorm(tmp_path):
    r = export(f"{FILE}:tiny", ["x:2x5x8"], tmp_path / "t13.onnx", ExportOptions(opset=13))
    assert r.opset == 13 and r.passed
    assert any("stash_type" in w and "blocks.0.ln2" in w for w in r.warnings)
    pows = [n.name for n in onnx.load(r.onnx_path).graph.node if n.op_type == "Pow"]
    assert "/blocks/blocks.0/ln2/Pow" in pows


@pytest.mark.slow
def test_dynamo_exporter_maps_modules_through_node_metadata(tmp_path):
    r = export(f"{FILE}:tiny", ["x:2x5x8"], tmp_path / "d.onnx",
               ExportOptions(exporter="dynamo", opset=18))
    model = onnx.load(r.onnx_path)
    assert r.passed and model.ir_version <= 10
    norms = [n.name for n in model.graph.node if n.op_type == "LayerNormalization"]
    assert [module_of(n, model) for n in norms] == [("blocks.0.ln2", "LayerNorm"),
                                                    ("blocks.1.ln2", "LayerNorm")]


def test_factory_example_inputs_take_forward_names():
    tm = load_torch_model(f"{FILE}:overflow")
    assert tm.input_names == ["x"] and tm.samples[0]["x"].shape == (4, 16)


@pytest.mark.parametrize("arg, specs, message", [
    ("missing.py:f", (), "model file not found"),
    (f"{FILE}:nothing", (), "has no 'nothing'"),
    (f"{FILE}:tiny", (), "give --input x:1x3x224x224"),
    (f"{FILE}:tiny", ("x:2xa",), "dimensions must be integers"),
])
def test_factory_errors_say_what_to_do(arg, specs, message):
    with pytest.raises(TrtBisectError, match=message):
        load_torch_model(arg, specs)


def test_input_specs():
    specs = parse_input_specs(["x:1x3x8x8", "ids:1x4:int64"])
    assert [(s.name, s.shape, s.dtype) for s in specs] == [("x", (1, 3, 8, 8), "float32"),
                                                           ("ids", (1, 4), "int64")]
    with pytest.raises(TrtBisectError, match="unique"):
        parse_input_specs(["x:1", "x:2"])


def test_resolve_model_arg_passes_onnx_through(tmp_path):
    assert resolve_model_arg("m.onnx", (), tmp_path) == (Path("m.onnx"), None)
    with pytest.raises(TrtBisectError, match="--shape"):
        resolve_model_arg("m.onnx", ("x:1x2",), tmp_path)


def test_export_cli(tmp_path):
    out = tmp_path / "t.onnx"
    r = CliRunner().invoke(main, ["-q", "export", f"{FILE}:tiny", "--input", "x:2x5x8",
                                  "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["passed"] and data["max_abs_err"] < 1e-4 and data["scoped_nodes"] >= 8
    assert out.exists() and (tmp_path / "t_inputs.npz").exists()


def test_run_accepts_a_pytorch_factory_and_names_modules(tmp_path):
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["-q", "run", f"{FILE}:overflow", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["verdict"] == "fixed"
    assert (out / "torch_models.onnx").exists() and (out / "torch_models_inputs.npz").exists()
    assert data["culprits"] and {c["module"] for c in data["culprits"]} == {"norm (RMSNorm)"}
    assert json.loads((out / "precision.json").read_text())["culprits"][0]["module"] == \
        "norm (RMSNorm)"


def test_run_exports_into_out_as_its_own_file_never_over_the_users(tmp_path):
    """The export lands in --out as trtbisect's own file: listed, so a second run replaces it
    and no run calls it foreign; a file of the user's at that name is refused (exit 2, one
    line) and left as it was, as is a link there."""
    out = tmp_path / "run"
    args = ["run", f"{FILE}:overflow", "--out", str(out)]
    for _ in range(2):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output
        assert "verdict: fixed" in r.output and "no trtbisect run wrote" not in r.output
        listed = json.loads((out / ".trtbisect-manifest.json").read_text())["exported"]
        assert listed == ["torch_models.onnx", "torch_models_inputs.npz"]
    assert "torch_models.onnx" not in os.listdir(out / ".previous")  # read by the run: kept

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "torch_models.onnx").write_text("the user's own model\n")
    r = CliRunner().invoke(main, ["run", f"{FILE}:overflow", "--out", str(mine)])
    assert r.exit_code == 2 and "torch_models.onnx" in r.output and "Traceback" not in r.output
    assert (mine / "torch_models.onnx").read_text() == "the user's own model\n"
    assert sorted(os.listdir(mine)) == ["torch_models.onnx"]  # nothing else written there

    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "torch_models_inputs.npz").symlink_to(tmp_path / "elsewhere.npz")
    r = CliRunner().invoke(main, ["run", f"{FILE}:overflow", "--out", str(linked)])
    assert r.exit_code == 2 and not (tmp_path / "elsewhere.npz").exists()


def test_the_same_tracer_warning_is_one_note_with_its_count(tmp_path):
    """Three blocks that each make a tensor a Python bool: the tracer warns three times, the
    export notes it once, with the count (it printed one warning per call before)."""
    src = tmp_path / "checked.py"
    src.write_text(
        "import torch\n"
        "from torch import nn\n\n\n"
        "class Check(nn.Module):\n"
        "    def forward(self, x):\n"
        "        if bool(x.sum() > -1e9):  # a tensor made a Python bool: the tracer warns\n"
        "            return x + 1\n"
        "        return x\n\n\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.blocks = nn.Sequential(Check(), Check(), Check())\n\n"
        "    def forward(self, x):\n"
        "        return self.blocks(x)\n\n\n"
        "def make():\n"
        "    return Net().eval()\n")
    r = export(f"{src}:make", ["x:2x3"], tmp_path / "checked.onnx")
    notes = [n for n in r.warnings if n.startswith("tracer:")]
    assert len(notes) == 1 and notes[0].endswith("(x3)"), r.warnings


def test_an_export_that_fails_its_check_is_still_trtbisects_own(tmp_path):
    """The export is written, then disagrees with PyTorch (a random op): exit 2, and what it
    wrote is listed as trtbisect's, so the next attempt may replace it (it was refused)."""
    src = tmp_path / "noisy.py"
    src.write_text("import torch\nfrom torch import nn\n\n\n"
                   "class Noisy(nn.Module):\n"
                   "    def forward(self, x):\n"
                   "        return x + 10 * torch.rand_like(x)\n\n\n"
                   "def make():\n"
                   "    return Noisy().eval()\n")
    out = tmp_path / "run"
    for _ in range(2):
        r = CliRunner().invoke(main, ["run", f"{src}:make", "--input", "x:2x3", "--out", str(out)])
        assert r.exit_code == 2 and "disagrees with PyTorch" in r.output, r.output
    listed = json.loads((out / ".trtbisect-manifest.json").read_text())
    assert listed["exported"] == ["noisy.onnx", "noisy_inputs.npz"] and not listed["complete"]


@pytest.mark.parametrize("samples", [1, 3])
def test_run_of_a_factory_judges_its_example_input_or_samples_random_ones(samples, tmp_path):
    """`--samples N` is honoured for a PyTorch factory too (it was silently 1: the export's
    example input); 1, the default, keeps the example input."""
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["-q", "run", f"{FILE}:overflow", "--out", str(out), "--json",
                                  "--samples", str(samples)])
    data = json.loads(r.stdout)  # the verdict is the model's (3 random samples: unvalidated)
    assert data["samples"] == samples and r.exit_code in (0, 9), r.output
    given = np.load(out / "torch_models_inputs.npz")
    judged = np.load(out / "inputs" / "sample_000.npz")
    assert np.array_equal(judged["x"], given["x"]) == (samples == 1)


def test_run_rejects_input_for_an_onnx_model(tmp_path):
    r = CliRunner().invoke(main, ["run", str(tmp_path / "m.onnx"), "--input", "x:1x2"])
    assert r.exit_code == 2 and "--shape" in r.output


def test_a_forward_that_fails_on_the_given_shape_is_one_line(tmp_path):
    """`--input x:2x8` for a Linear(16, ...): the module's own error, in one line (exit 2)."""
    r = CliRunner().invoke(main, ["export", f"{FILE}:overflow", "--input", "x:2x8", "-o",
                                  str(tmp_path / "m.onnx")])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "fails on the given inputs" in lines[0] and "--input" in lines[0]
    assert "Traceback" not in r.output
