"""Diagnosis on planted faults: each cause class and pattern is found, with its numbers, on a
model built to have exactly that fault; groups follow data flow; the annotated ONNX carries it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import save_zoo_model
from trtbisect.backends.ort import Reference
from trtbisect.cli import main
from trtbisect.context import Context, Options
from trtbisect.diagnosis.diagnose import CulpritGroup, diagnose, group_culprits
from trtbisect.graph import Graph
from trtbisect.judge.compare import FP16_MAX
from trtbisect.pipeline import run
from trtbisect.search.prior import constant_stats
from trtbisect.stages.layerwise import layerwise

N = helper.make_node


def tiny(nodes: list, inits: dict[str, np.ndarray], inputs: dict[str, list[int]],
         outputs: list[str], opset: int = 13) -> onnx.ModelProto:
    """A model from nodes, with the output shapes filled by inference (the checker wants them)."""
    graph = helper.make_graph(
        nodes, "t", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    inferred = onnx.shape_inference.infer_shapes(model)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    onnx.checker.check_model(model)
    return model


def exp_overflow() -> tuple[onnx.ModelProto, dict]:
    """A hand-written log-sum-exp of 12*x: exp(15) = 3e6 overflows FP16."""
    m = tiny([N("Mul", ["x", "k"], ["s"], name="scale/Mul"),
              N("Exp", ["s"], ["e"], name="lse/Exp"),
              N("ReduceSum", ["e", "ax"], ["r"], name="lse/ReduceSum", keepdims=1),
              N("Log", ["r"], ["y"], name="lse/Log")],
             {"k": np.float32(12.0), "ax": np.array([1], np.int64)}, {"x": [1, 8]}, ["y"])
    return m, {"x": np.random.default_rng(0).standard_normal([1, 8]).astype(np.float32)}


def variance_cancellation() -> tuple[onnx.ModelProto, dict]:
    """var = E[x^2] - E[x]^2 at mean 200: FP16 spacing 32 at 4e4 makes var negative, Sqrt NaN.
    No value is out of range and nothing flushes: the NaN is born in Sqrt."""
    m = tiny([N("Mul", ["x", "x"], ["sq"], name="var/Mul"),
              N("ReduceMean", ["sq"], ["m2"], name="var/ReduceMean", axes=[-1]),
              N("ReduceMean", ["x"], ["m"], name="var/ReduceMean_1", axes=[-1]),
              N("Mul", ["m", "m"], ["mm"], name="var/Mul_1"),
              N("Sub", ["m2", "mm"], ["v"], name="var/Sub"),
              N("Sqrt", ["v"], ["sd"], name="std/Sqrt"),
              N("Sub", ["x", "m"], ["c"], name="norm/Sub"),
              N("Div", ["c", "sd"], ["y"], name="norm/Div")], {}, {"x": [4, 64]}, ["y"])
    x = 200 + 0.5 * np.random.default_rng(0).standard_normal([4, 64])
    return m, {"x": x.astype(np.float32)}


def batchnorm_variance() -> tuple[onnx.ModelProto, dict]:
    """BatchNorm running variance 1e5 (std ~316): FP16 reads it as inf, the output as 0."""
    rng = np.random.default_rng(0)
    m = tiny([N("Conv", ["x", "w"], ["c"], name="conv/Conv", kernel_shape=[1, 1]),
              N("BatchNormalization", ["c", "g", "b", "mu", "var"], ["y"], name="bn/BatchNormalization")],
             {"w": (rng.standard_normal([4, 3, 1, 1]) * 300).astype(np.float32),
              "g": np.ones(4, np.float32), "b": np.zeros(4, np.float32),
              "mu": np.zeros(4, np.float32), "var": np.full(4, 1e5, np.float32)},
             {"x": [1, 3, 8, 8]}, ["y"], opset=15)
    return m, {"x": rng.standard_normal([1, 3, 8, 8]).astype(np.float32)}


def power_spectrum() -> tuple[onnx.ModelProto, dict]:
    """|DFT|^2 of a 512-sample tone of amplitude 10: the power 6e6 overflows before the log."""
    t = np.arange(512)
    x = 10 * np.sin(2 * np.pi * 16 * t / 512)[None, :, None] + \
        np.random.default_rng(0).standard_normal([1, 512, 1])
    m = tiny([N("DFT", ["x"], ["X"], name="stft/DFT", axis=1),
              N("Mul", ["X", "X"], ["P"], name="power/Mul"),
              N("ReduceSum", ["P", "ax"], ["p"], name="power/ReduceSum", keepdims=0),
              N("Add", ["p", "eps"], ["pe"], name="db/Add"),
              N("Log", ["pe"], ["y"], name="db/Log")],
             {"ax": np.array([-1], np.int64), "eps": np.float32(1e-3)}, {"x": [1, 512, 1]}, ["y"],
             opset=17)
    return m, {"x": x.astype(np.float32)}


EXTRA = {"exp_overflow": (exp_overflow, "overflow", "exp"),
         "variance_cancellation": (variance_cancellation, "non_finite_origin", "cancellation"),
         "batchnorm_variance": (batchnorm_variance, "constant_out_of_range", "batchnorm_statistics"),
         "power_spectrum": (power_spectrum, "overflow", "power_spectrum")}
ZOO_FAULTS = ["layernorm_overflow", "reducesum_overflow", "attention_logits", "eps_underflow",
              "constant_out_of_range", "precision_loss"]
ZOO_PATTERN = {"precision_loss": "cancellation"}  # the zoo names no pattern; we see one


def run_model(model: onnx.ModelProto, inputs: dict, folder: Path, **kw):
    folder.mkdir(parents=True, exist_ok=True)
    path, npz = folder / "m.onnx", folder / "m_inputs.npz"
    onnx.save(model, path)
    np.savez(npz, **inputs)
    return run(path, Options.of(semantics="strict", inputs=[str(npz)], **kw), folder / "out")


@pytest.fixture(scope="module")
def zoo_runs(zoo, tmp_path_factory):
    """Each faulty zoo model run once; the tests below read the same results."""
    out = {}
    for name in [*ZOO_FAULTS, "two_outputs", "healthy"]:
        model, inputs = save_zoo_model(zoo[name], tmp_path_factory.mktemp(name))
        out[name] = run(model, Options.of(semantics="strict", inputs=[str(inputs)]), model.parent / "out")
    return out


@pytest.mark.parametrize("name", ZOO_FAULTS)
def test_zoo_cause_and_pattern(zoo, zoo_runs, name):
    z, r = zoo[name], zoo_runs[name]
    groups = r.culprit_groups
    assert len(groups) == 1
    g = groups[0]
    assert set(g.nodes) == set(z.expected_fp32)
    assert g.cause == z.cause
    assert g.pattern == (z.pattern or ZOO_PATTERN.get(name))
    assert g.applied_fix == "keep_fp32" and g.fixes[0].kind == "keep_fp32"
    assert g.summary.endswith(".") and len(g.fixes) >= 2


def test_layernorm_evidence_numbers(zoo_runs):
    """The issue's sentence: what is squared, what it becomes, by how much, and the way out."""
    g = zoo_runs["layernorm_overflow"].culprit_groups[0]
    ev = g.evidence
    assert ev["node"] == "ln/Pow" and ev["op"] == "Pow"
    assert ev["fp32_absmax"] > FP16_MAX > ev["input_absmax"] > 1e3
    assert ev["factor"] == pytest.approx(ev["fp32_absmax"] / FP16_MAX, rel=1e-4)
    assert ev["back_in_range"] < FP16_MAX  # the Sqrt brings it back
    assert "65504" in g.summary and "opset >= 17" in g.summary
    assert [f.kind for f in g.fixes] == ["keep_fp32", "reexport_opset17"]


def test_culprit_why_is_improved(zoo_runs):
    whys = {c.node: c.why for c in zoo_runs["layernorm_overflow"].culprits}
    assert whys["ln/Pow"].startswith("Pow writes 5.5")
    assert "brings it back" in whys["ln/Sqrt"]


def test_attention_and_reduction_fixes(zoo_runs):
    att = zoo_runs["attention_logits"].culprit_groups[0]
    assert att.evidence["node"] == "attn/MatMul"
    assert att.evidence["back_in_range"] < FP16_MAX < att.evidence["peak"]
    assert "scale_before_matmul" in [f.kind for f in att.fixes]
    red = zoo_runs["reducesum_overflow"].culprit_groups[0]
    assert red.evidence["op"] == "ReduceSum"
    assert "mean_before_sum" in [f.kind for f in red.fixes]


def test_constant_evidence(zoo_runs):
    g = zoo_runs["constant_out_of_range"].culprit_groups[0]
    ev = g.evidence
    assert ev["value"] == pytest.approx(float(np.finfo(np.float32).min), rel=1e-5)
    assert ev["fp16_value"] == "-inf" and ev["output_nonfinite_fp16"] > 0
    assert "NaN" in g.summary
    assert "clamp_mask_fill" in [f.kind for f in g.fixes]


def test_underflow_evidence(zoo_runs):
    g = zoo_runs["eps_underflow"].culprit_groups[0]
    ev = g.evidence
    assert ev["fraction"] == 1.0 and ev["fp32_absmax"] < 6e-8
    assert ev["constant"] == "rms.eps" and ev["constant_value"] == pytest.approx(1e-10)
    assert ev["consequence_op"] == "Div"  # 0/0 downstream
    kinds = [f.kind for f in g.fixes]
    assert "raise_eps" in kinds and "prescale_norm" in kinds


def test_precision_loss_evidence(zoo_runs):
    ev = zoo_runs["precision_loss"].culprit_groups[0].evidence
    assert ev["fp16_spacing"] == 8.0  # FP16 spacing at 1e4
    assert ev["rel_err"] > 0.5 and ev["cancel_node"] == "offset/Sub"


def test_two_outputs_give_two_groups(zoo_runs):
    groups = zoo_runs["two_outputs"].culprit_groups
    assert [(g.cause, g.pattern) for g in groups] == [
        ("overflow", "large_reduction"), ("overflow", "rmsnorm_decomposed")]
    assert {n for g in groups for n in g.nodes} == set(zoo_runs["two_outputs"].fp32_nodes)


def test_healthy_has_no_groups(zoo_runs):
    assert zoo_runs["healthy"].culprit_groups == []


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_extra_causes(tmp_path, name):
    build, cause, pattern = EXTRA[name]
    model, inputs = build()
    r = run_model(model, inputs, tmp_path)
    assert r.verdict == "fixed"
    groups = r.culprit_groups
    assert [(g.cause, g.pattern) for g in groups] == [(cause, pattern)]


def test_non_finite_origin_names_the_sqrt(tmp_path):
    r = run_model(*variance_cancellation(), tmp_path)
    ev = r.culprit_groups[0].evidence
    assert ev["node"] == "std/Sqrt" and ev["nonfinite"] > 0
    assert ev["cancel_node"] == "var/Sub" and ev["cancel_from"] > 100 * ev["cancel_to"]


def test_groups_join_through_layout_ops_only():
    """a -> Reshape -> b is one group; c reads the same input as a but is not fed by it."""
    m = tiny([N("Relu", ["x"], ["a"], name="a"),
              N("Reshape", ["a", "shape"], ["r"], name="reshape"),
              N("Relu", ["r"], ["b"], name="b"),
              N("Sigmoid", ["x"], ["c"], name="c"),
              N("Reshape", ["c", "shape"], ["c2"], name="reshape2"),
              N("Add", ["b", "c2"], ["y"], name="d")],
             {"shape": np.array([2, 2], np.int64)}, {"x": [4]}, ["y"])
    g = Graph(m)
    assert group_culprits(g, ["a", "b", "c"]) == [["a", "b"], ["c"]]
    assert group_culprits(g, ["a", "d"]) == [["a"], ["d"]]  # b between them is not a culprit


def test_no_plan_diagnoses_the_suspects(zoo, tmp_path):
    """Out of budget: no plan, but the layer-wise suspects still get a cause; nothing applied."""
    model, inputs = save_zoo_model(zoo["layernorm_overflow"], tmp_path)
    r = run(model, Options.of(semantics="strict", inputs=[str(inputs)], max_evaluations=1), tmp_path / "out")
    assert r.verdict == "no_plan"
    groups = r.culprit_groups
    assert groups and groups[0].cause == "overflow" and groups[0].applied_fix is None


def test_precision_json_shape_and_annotated_model(zoo, tmp_path):
    z = zoo["layernorm_overflow"]
    model, inputs = save_zoo_model(z, tmp_path)
    before = hashlib.sha256(model.read_bytes()).hexdigest()
    r = run(model, Options.of(semantics="strict", inputs=[str(inputs)]), tmp_path / "out")
    assert hashlib.sha256(model.read_bytes()).hexdigest() == before  # input never modified
    plan = json.loads((tmp_path / "out" / "precision.json").read_text())
    g = plan["culprit_groups"][0]
    assert set(g) == {"nodes", "scope", "cause", "pattern", "evidence", "summary", "fixes",
                      "applied_fix"}
    assert all(isinstance(v, (int, float, str, bool, type(None))) for v in g["evidence"].values())
    assert CulpritGroup.from_json(g).to_json() == g  # round-trips
    annotated = onnx.load(r.files["annotated_model"])
    onnx.checker.check_model(annotated, full_check=True)
    nodes = {n.name: n for n in annotated.graph.node}
    assert "overflow" in nodes["ln/Pow"].doc_string and "65504" in nodes["ln/Pow"].doc_string
    props = {p.key: p.value for p in nodes["ln/Pow"].metadata_props}
    assert props["trtbisect.cause"] == "overflow"
    assert props["trtbisect.pattern"] == "layernorm_decomposed"
    assert not nodes["ln/Div"].doc_string
    meta = {p.key: p.value for p in annotated.metadata_props}
    assert meta["trtbisect.verdict"] == "fixed"


def test_diagnose_is_pure(zoo):
    """Same answer from the library call alone, and the model is untouched."""
    z = zoo["attention_logits"]
    g = Graph(z.model)
    snapshot = z.model.SerializeToString()
    samples = [dict(z.inputs)]
    ctx = Context(Path("m.onnx"), z.model, g, samples, [Reference(g).run(samples[0])],
                  "0" * 64)
    strict = Options.of(semantics="strict")
    stats = layerwise(ctx, strict.judge, strict.search)
    groups = diagnose(g, sorted(z.expected_fp32), stats, constant_stats(g))
    assert [(x.cause, x.pattern) for x in groups] == [("overflow", "attention_logits")]
    assert z.model.SerializeToString() == snapshot


def test_cli_prints_group_summaries(zoo, tmp_path):
    model, inputs = save_zoo_model(zoo["layernorm_overflow"], tmp_path)
    res = CliRunner().invoke(main, ["-q", "run", str(model), "--inputs", str(inputs),
                                    "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "1. overflow, layernorm_decomposed:" in text
    assert "opset >= 17" in text
    assert "annotated ONNX" in text


def test_a_group_is_a_frozen_record_that_round_trips_in_its_kind_s_key_order():
    """A culprit group read by attribute, frozen; precision.json's JSON of it makes it again.
    The per-node-rounding group writes its summary last, as precision.json always has."""
    import dataclasses

    from trtbisect.diagnosis.diagnose import PER_NODE_ROUNDING, note_semantics
    from trtbisect.diagnosis.wording import Fix, RewriteAdvice

    fix = Fix("prescale_norm", "divide x", RewriteAdvice("fuse_rmsnorm", "no_match", "no rule"))
    g = CulpritGroup(["a", "b"], "overflow", "rmsnorm_decomposed",
                     {"fp32_absmax": 70000.123456789, "fp16_value": float("inf"), "op": "Pow"},
                     "a overflows.", [Fix("keep_fp32", "keep"), fix], "keep_fp32", "net.norm",
                     why={"a": "output max 7e4 > 65504"})
    d = g.to_json()
    assert list(d) == ["nodes", "scope", "cause", "pattern", "evidence", "summary", "fixes",
                       "applied_fix"]
    assert d["evidence"] == {"fp32_absmax": 70000.1, "fp16_value": "inf", "op": "Pow"}
    back = CulpritGroup.from_json(json.loads(json.dumps(d)))
    assert back == g.as_written() and back.to_json() == d and back.fixes[1].rewrite == fix.rewrite
    assert back.why == {} and g.as_written().why == g.why  # `why` is the culprits' to write
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.summary = "x"  # type: ignore[misc]
    # note_semantics: new records, the old ones as they were; the new group's own key order
    noted, per_node = note_semantics([g], {"b": "folds in FP32", "bn": "fails only per node"},
                                     new_group=True)
    assert noted.summary == "a overflows. b folds in FP32." and g.summary == "a overflows."
    assert per_node.cause == PER_NODE_ROUNDING and per_node.nodes == ["b", "bn"]
    pd = per_node.to_json()
    assert list(pd) == ["nodes", "scope", "cause", "pattern", "evidence", "fixes",
                        "applied_fix", "summary"]
    assert list(CulpritGroup.from_json(pd).to_json().items()) == list(pd.items())


def test_a_node_fused_with_a_range_culprit_says_so_in_a_new_culprit():
    """note_fused: a culprit kept FP32 only because TensorRT fuses it into one layer with a
    range culprit says so instead of its own small error; the others, and the culprits given
    (frozen records), are as they were."""
    from trtbisect.diagnosis.diagnose import Culprit, note_fused

    given = [Culprit("a", "Pow", "output max 7e4 > 65504"), Culprit("b", "Add", "max|d| 0.01"),
             Culprit("c", "Mul", "max|d| 0.02")]
    units = {"u": ("a", "b"), "v": ("c",)}
    got = note_fused(given, units, {"a": "u", "b": "u", "c": "v"})
    assert [c.why for c in got] == [
        "output max 7e4 > 65504",
        "fused with a into one TensorRT layer, so it runs in that layer's precision",
        "max|d| 0.02"]
    assert given[1].why == "max|d| 0.01" and got[0] == given[0]
