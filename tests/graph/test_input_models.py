"""Any model ONNX Runtime runs, trtbisect judges (#34): old IR versions and opsets, defaulted
and sparse initializers (in If branches and Loop bodies too), initializer outputs, shapeless I/O, empty graph names, unsorted nodes,
scalar outputs get the planted fault's exact plan under both semantics, their written files
pass onnx.checker's full check and load in ONNX Runtime, and the user's file is untouched; a
model that draws random numbers stops with reference_unstable (exit 8), naming the op. What the
copy changes, and its line: tests/graph/test_repair.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from tests.models import input_models as im
from trtbisect.cli import main
from trtbisect.context import Options
from trtbisect.errors import EXIT_REFERENCE_UNSTABLE
from trtbisect.judge.loadable import require_written_valid
from trtbisect.pipeline import run

SEMANTICS = ("trt", "strict")


def _save(tmp: Path, model: onnx.ModelProto) -> tuple[Path, Path, bytes]:
    path = tmp / "m.onnx"
    onnx.save(model, path)
    inputs = tmp / "in.npz"
    np.savez(inputs, x=im.X)
    return path, inputs, path.read_bytes()


def _loads(path: str | Path) -> ort.InferenceSession:
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _ref(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, {"x": im.X})))


@pytest.mark.parametrize("semantics", SEMANTICS)
@pytest.mark.parametrize("name", sorted(im.JUDGED))
def test_every_class_gets_the_planted_plan_and_valid_files(tmp_path, caplog, name, semantics):
    model = im.JUDGED[name]()
    path, inputs, before = _save(tmp_path, model)
    with caplog.at_level("WARNING"):
        result = run(path, Options.of(inputs=[str(inputs)], semantics=semantics), tmp_path / "o")
    assert result.verdict == "fixed", (name, result.verdict, result.reference_problems)
    names = {"up1": "up1", "up2": "up2", "down": "down"}
    if name == "unsorted_unnamed":  # named by their place in the user's file
        names = {"down": "MatMul_0", "up2": "MatMul_1", "up1": "MatMul_2"}
    names = {n: im.HOLDERS.get(name, "") + own for n, own in names.items()}  # in a subgraph
    assert set(result.fp32_nodes) == {names[n] for n, kept in im.PLAN.items() if kept}
    assert path.read_bytes() == before  # the user's file is untouched
    files = result.files
    mixed = _loads(files["mixed_model"])
    got = dict(zip([o.name for o in mixed.get_outputs()], mixed.run(None, {"x": im.X})))
    for out, want in _ref(model).items():
        assert got[out].shape == want.shape, (out, got[out].shape, want.shape)
        np.testing.assert_allclose(got[out], want, rtol=1e-2, atol=1e-2)
    written = sorted((tmp_path / "o").glob("*.onnx"))
    assert len(written) >= 2  # the mixed model, its emulation, the annotated model ...
    for f in written:
        _loads(f)
        require_written_valid(f)  # judge/loadable's checks, held to the full check
    checked = CliRunner().invoke(main, ["-q", "check", files["mixed_model"], "--reference",
                                        str(path), "--inputs", str(inputs), "--semantics",
                                        semantics])
    assert checked.exit_code == 0, checked.output  # the file judged again against the file
    plan = json.loads((tmp_path / "o" / "precision.json").read_text())
    said = [r.getMessage() for r in caplog.records if "trtbisect's copies" in r.getMessage()]
    if plan.get("model_copy"):  # what the copy changed: one line, and the named copy
        assert len(said) == 1 and said[0].endswith("(the file itself is untouched)")
        assert "named_model" in files
    else:
        assert not said


@pytest.mark.parametrize("semantics", SEMANTICS)
def test_a_scalar_output_is_judged_rank_0(tmp_path, semantics):
    """Before: ValueError: shape mismatch (1,) vs reference () (the scalar weight became [1]
    in the copies)."""
    path, _, _ = _save(tmp_path, im.scalar_output())
    r = CliRunner().invoke(main, ["-q", "run", str(path), "--semantics", semantics, "--out",
                                  str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    mixed = onnx.load(str(tmp_path / "o" / "m.mixed.onnx"))
    half = {t.name: list(t.dims) for t in mixed.graph.initializer}
    assert half["half::fp16"] == []
    r = CliRunner().invoke(main, ["-q", "check", str(tmp_path / "o" / "m.mixed.onnx"),
                                  "--reference", str(path)])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("semantics", SEMANTICS)
@pytest.mark.parametrize("name", sorted(im.UNSTABLE))
def test_a_reference_that_moves_stops_with_its_own_verdict(tmp_path, name, semantics):
    path, _, before = _save(tmp_path, im.UNSTABLE[name]())
    out = tmp_path / "o"
    r = CliRunner().invoke(main, ["run", str(path), "--semantics", semantics, "--out", str(out)])
    assert r.exit_code == EXIT_REFERENCE_UNSTABLE == 8, r.output
    flat = " ".join(r.output.split())
    assert "two FP32 runs of the model differ" in flat
    op = next(n.op_type for n in im.UNSTABLE[name]().graph.node if n.name in ("draw", "drop"))
    assert f"({op}" in flat and "differs between two FP32 runs" in flat
    plan = json.loads((out / "precision.json").read_text())
    assert plan["verdict"] == "reference_unstable" and plan["fp32_nodes"] == []
    assert not list(out.glob("*.mixed.onnx")) and path.read_bytes() == before


def test_a_seed_is_named_with_what_the_fp16_copy_draws(tmp_path):
    path, _, _ = _save(tmp_path, im.random_uniform_like_seeded())
    r = CliRunner().invoke(main, ["run", str(path), "--out", str(tmp_path / "o")])
    flat = " ".join(r.output.split())
    assert r.exit_code == 8 and "seed 7" in flat
    assert "its FP16 copy, seeded alike, draws the same numbers (rounded)" in flat


def test_check_and_compare_refuse_a_reference_that_moves(tmp_path):
    path, _, _ = _save(tmp_path, im.dropout_training())
    for args in (["check", str(path), "--reference", str(path)], ["compare", str(path)]):
        r = CliRunner().invoke(main, ["-q", *args])
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.exit_code == 8 and len(lines) == 1 and "not reproducible" in lines[0]
        assert "'drop' (Dropout)" in lines[0]


@pytest.mark.parametrize("declared", ["static", "dynamic"])
def test_check_refuses_a_file_computing_other_output_shapes(tmp_path, declared):
    """A scalar where the reference computes 2x4: one line, never compare's ValueError."""
    other = im.scalar_output()
    if declared == "dynamic":
        shape = other.graph.output[0].type.tensor_type.shape
        shape.dim.add().dim_param = "n"
    onnx.save(other, tmp_path / "other.onnx")
    onnx.save(im.overflow(), tmp_path / "ref.onnx")
    r = CliRunner().invoke(main, ["-q", "check", str(tmp_path / "other.onnx"), "--reference",
                                  str(tmp_path / "ref.onnx")])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "a mixed-precision copy" in lines[0]
