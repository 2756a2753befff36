"""Every file `run` writes declares what it computes and holds together (#45 item 5, #46 item 1):
a parameter input keeps the type its op requires, the inputs one type variable binds agree, a
shapeless or wrongly rank-0 output is never declared `[]`, an output whose shape depends on the
data is compared (a moved shape is an infinite error, never a traceback), and a BF16 file no
ONNX tool loads is said to be one. Models: tests/models/written_models.py."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from tests.models import written_models as wm
from trtbisect.cli import main
from trtbisect.graph.schema import type_params
from trtbisect.judge.compare import Tolerance, compare_output, tensor_stats
from trtbisect.judge.flags import parse_criteria
from trtbisect.judge.loadable import require_loadable, require_written_valid
from trtbisect.judge.mixed import write_mixed_onnx
from trtbisect.judge.precision import BF16, FP16

VERDICT_EXITS = {0, 3, 4, 5, 6, 7, 8, 9}
MODELS = {"pad_constant": (wm.pad_constant, wm.X), "mvn": (wm.mvn, wm.X),
          "unique_inside": (wm.unique_inside, wm.UNIQUE_X),
          "rank0_declared": (wm.rank0_declared, wm.X),
          "shapeless_output": (wm.shapeless_output, wm.X)}


def _types_agree(model: onnx.ModelProto) -> list[str]:
    """Each node whose schema binds several inputs to one type variable: do they hold one
    element type? The mismatches, named."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    types = {v.name: v.type.tensor_type.elem_type for v in
             [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]}
    types.update({t.name: t.data_type for t in inferred.graph.initializer})
    opset = {o.domain: o.version for o in model.opset_import}[""]
    bad = []
    for n in inferred.graph.node:
        seen: dict[str, set[int]] = {}
        for k, p in enumerate(type_params(n, opset) or []):
            if n.input[k] and n.input[k] in types:
                seen.setdefault(p, set()).add(types[n.input[k]])
        bad += [f"{n.name}: {p} bound to {sorted(t)}" for p, t in seen.items() if len(t) > 1]
    return bad


@pytest.mark.parametrize("name", ["pad_constant", "mvn", "unique_inside"])
def test_an_all_fp16_file_keeps_each_ops_types(tmp_path, name):
    """All-FP16 (no node kept): the checker's full check, ONNX Runtime's load, and one element
    type per type variable of every node. Before: Pad's float32 `constant_value` beside its
    float16 data; MVN's float32 epsilon added to a float16 value."""
    model = MODELS[name][0]()
    mixed = write_mixed_onnx(model, [], precision=FP16)
    path = tmp_path / "m.onnx"
    onnx.save(mixed, path)
    require_written_valid(path)  # raises on a checker error or a refused load
    assert _types_agree(mixed) == []
    if name == "pad_constant":  # the parameter follows the data into float16
        pad = next(n for n in mixed.graph.node if n.op_type == "Pad")
        elem = {t.name: t.data_type for t in mixed.graph.initializer}
        assert elem[pad.input[2]] == onnx.TensorProto.FLOAT16
        assert elem[pad.input[1]] == onnx.TensorProto.INT64  # the int pads untouched


def _declared_matches(path, computed: dict[str, tuple]) -> list[str]:
    """Outputs whose declared shape contradicts the computed one (rank, or a static dim)."""
    bad = []
    for v in onnx.load(str(path), load_external_data=False).graph.output:
        tt = v.type.tensor_type
        if v.name not in computed or not tt.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        got = computed[v.name]
        if len(dims) != len(got) or any(d is not None and d != n for d, n in zip(dims, got)):
            bad.append(f"{path.name}: {v.name} declared {dims}, computes {list(got)}")
    return bad


@pytest.mark.parametrize("name", sorted(MODELS))
def test_run_writes_files_that_declare_what_they_compute_and_check_accepts(tmp_path, name):
    build, x = MODELS[name]
    model = build()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    np.savez(tmp_path / "x.npz", x=x)
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    computed = {o.name: np.shape(v) for o, v in zip(s.get_outputs(), s.run(None, {"x": x}))}
    r = CliRunner().invoke(main, ["-q", "run", str(path), "--inputs", str(tmp_path / "x.npz"),
                                  "--out", str(tmp_path / "o")])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert r.exit_code in VERDICT_EXITS, r.output
    written = sorted((tmp_path / "o").glob("*.onnx"))
    assert any(f.name == "m.mixed.onnx" for f in written)
    for f in written:
        require_written_valid(f)
        assert _declared_matches(f, computed) == []
        assert _types_agree(onnx.load(str(f))) == []
    c = CliRunner().invoke(main, ["-q", "check", str(tmp_path / "o" / "m.mixed.onnx"),
                                  "--reference", str(path), "--inputs",
                                  str(tmp_path / "x.npz")])
    # the file judged again says what the run said (MVN, which stays FP32: partial, exit 5)
    assert c.exit_code == r.exit_code == (5 if name == "mvn" else 0), (r.output, c.output)


def test_a_moved_data_dependent_shape_is_an_infinite_error_not_a_traceback(tmp_path):
    """FP16 merges two of Unique's values: all-FP16 computes 4 where FP32 computes 5. The
    comparison fails it (inf), the criteria too, and the search keeps exactly the two nodes
    that round them together."""
    ref, got = np.arange(5, dtype=np.float32), np.arange(4, dtype=np.float32)
    e = compare_output(ref, got, 0.01, 0.0)
    assert not e.passed and math.isinf(e.max_abs) and e.bound == pytest.approx(0.04)
    assert compare_output(ref, ref, 0.01, 0.0).passed
    j = parse_criteria(metrics=("cosine:0.99",)).judge({"y": ref}, {"y": got}, {},
                                                        Tolerance(0.01))
    assert not j.errors["y"].passed and math.isinf(j.errors["y"].severity)
    assert math.isinf(tensor_stats("u", "uniq", ref, got).max_abs_err)
    from trtbisect.pipeline import Options, run
    onnx.save(wm.unique_inside(), tmp_path / "u.onnx")
    np.savez(tmp_path / "x.npz", x=wm.UNIQUE_X)
    r = run(tmp_path / "u.onnx", Options.of(inputs=[str(tmp_path / "x.npz")]), tmp_path / "o")
    assert r.verdict == "fixed" and set(r.fp32_nodes) == {"scale", "uniq"}


def test_a_moved_shape_score_reads_back_as_its_criterion_wrote_it():
    """A per-output criterion on an output whose shape moved: the failing score names the
    criterion as every score does (without the output prefix), so precision.json read back
    gives it its metric's direction, even for an output named like another metric."""
    from trtbisect.judge import metrics
    from trtbisect.judge.criteria import Score
    ref, got = np.arange(5, dtype=np.float32), np.arange(4, dtype=np.float32)
    for out in ("y", "max"):
        j = parse_criteria(metrics=(f"{out}:cosine:0.99",)).judge({out: ref}, {out: got}, {},
                                                                    Tolerance(0.01))
        (s,) = j.errors[out].scores
        assert (s.criterion, s.output, s.passed, s.higher_is_better) == \
            ("cosine:0.99", out, False, True)
        back = Score.from_json(s.to_json(), metrics.entries())
        assert back.criterion == s.criterion and back.higher_is_better
        assert math.isinf(back.severity)


@pytest.mark.parametrize("opset", [12, 15])
def test_a_bf16_conv_file_loads_or_says_plainly_that_nothing_loads_it(tmp_path, opset):
    """A BF16 Conv at opset 12 (judged through its opset-13 copy) and 15: onnx lists bfloat16
    for Conv from opset 22 and ONNX Runtime's CPU provider has no bfloat16 Conv. `check`
    accepts the file `run` wrote; where ONNX Runtime refuses it, the words say that no ONNX
    tool loads it and what was judged, never that ONNX Runtime loads it."""
    onnx.save(wm.conv(opset), tmp_path / "c.onnx")
    np.savez(tmp_path / "x.npz", x=wm.CONV_X)
    args = ["--inputs", str(tmp_path / "x.npz"), "--precision", "bf16", "--rtol", "0.1"]
    r = CliRunner().invoke(main, ["run", str(tmp_path / "c.onnx"), *args, "--out",
                                  str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    mixed = tmp_path / "o" / "c.mixed.onnx"
    assert any(t.data_type == onnx.TensorProto.BFLOAT16
               for t in onnx.load(str(mixed)).graph.initializer)  # a BF16 file indeed
    try:
        ort.InferenceSession(str(mixed), providers=["CPUExecutionProvider"])
        loads = True
    except Exception:  # noqa: BLE001 - any refusal
        loads = False
    said = require_loadable(mixed)
    c = CliRunner().invoke(main, ["check", str(mixed), "--reference", str(tmp_path / "c.onnx"),
                                  *args])
    assert c.exit_code == 0, c.output
    for words in (" ".join(r.output.split()), " ".join(c.output.split()), said or ""):
        if not loads:
            assert "ONNX Runtime loads it" not in words
    if not loads:
        assert "no ONNX tool loads it as written" in said
        assert "no ONNX tool loads it as written" in " ".join(c.output.split())
    emulated = tmp_path / "o" / "c.mixed.emulated.onnx"  # what was judged: it loads
    ort.InferenceSession(str(emulated), providers=["CPUExecutionProvider"])
    assert BF16.name == "bf16"
