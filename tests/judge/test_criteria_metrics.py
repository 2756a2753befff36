"""--metric and --check: each metric's numbers on planted cases, Polygraphy's cosine and SNR
bit for bit, the OUTPUT: prefix syntax, the user's hook, and bad input as one line."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.conftest import save_zoo_model
from tests.test_cli import invoke
from trtbisect.context import Options
from trtbisect.errors import TrtBisectError
from trtbisect.judge.compare import Tolerance
from trtbisect.judge.flags import parse_criteria, parse_metric
from trtbisect.judge.metrics import cosine, iou, snr, topk_agreement
from trtbisect.pipeline import run


def _judge(metric: str, ref, got, **kw):
    crit = parse_criteria(metrics=[metric], **kw)
    j = crit.judge({"y": ref}, {"y": got}, {}, Tolerance())
    (s,) = j.errors["y"].scores
    return s, j


def test_topk_counts_rows_whose_top_k_set_matches():
    ref = np.array([[0.1, 0.9, 0.0, 0.2], [0.5, 0.4, 0.3, 0.0], [1, 2, 3, 4], [4, 3, 2, 1]],
                   np.float32)
    got = ref.copy()
    got[1] = [0.4, 0.5, 0.3, 0.0]  # top-1 flips, the top-2 set does not
    got[2] = [1, 2, 4, 3]  # top-1 flips too, the top-2 set does not
    assert topk_agreement(ref, got, 1, -1) == (0.5, 4)
    assert topk_agreement(ref, got, 2, -1) == (1.0, 4)
    s, j = _judge("topk:1", ref, got)
    assert s.value == 0.5 and not s.passed and not j.passed
    s, _ = _judge("topk:1:-1:0.5", ref, got)
    assert s.passed and s.bound == 0.5
    assert not _judge("topk:1:-1:0.6", ref, got)[0].passed
    s, _ = _judge("topk:1:0", ref, got)  # along axis 0: one row per column
    assert dict(s.detail)["rows"] == 4
    nan = ref.copy()
    nan[0, 2] = np.nan  # not in the top-1, but a broken value: the row does not match
    assert topk_agreement(ref, nan, 1, -1)[0] == 0.75  # rows 1 and 3 are intact


def test_topk_ties_are_broken_the_same_way_on_both_sides():
    ref = np.array([[1.0, 1.0, 0.0]], np.float32)
    assert topk_agreement(ref, ref.copy(), 1, -1)[0] == 1.0


def test_iou_of_thresholded_maps():
    ref = np.zeros((1, 1, 10, 10), np.float32)
    ref[..., 2:6, 2:6] = 0.9  # 16 pixels
    got = ref.copy()
    got[..., 5, 2:6] = 0.1  # 4 pixels drop below 0.3
    assert iou(ref, got, 0.3) == (12 / 16, 16, 12)
    s, _ = _judge("iou:0.3:0.7", ref, got)
    assert s.passed and math.isclose(s.value, 0.75)
    s, _ = _judge("iou:0.3:0.8", ref, got)
    assert not s.passed
    assert iou(np.zeros(4), np.zeros(4), 0.5)[0] == 1.0  # both empty
    got[0, 0, 0, 0] = np.inf  # non-finite where FP32 is finite: fails
    assert math.isnan(iou(ref, got, 0.3)[0]) and not _judge("iou:0.3:0", ref, got)[0].passed


def _arrays():
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((8, 32)).astype(np.float32)
    yield ref, ref.astype(np.float16).astype(np.float32)
    yield ref, ref + 0.1 * rng.standard_normal(ref.shape).astype(np.float32)
    yield ref, ref.copy()
    yield ref, np.zeros_like(ref)
    yield np.zeros(5, np.float32), np.zeros(5, np.float32)
    nan = ref.copy()
    nan[0, 0] = np.nan
    yield ref, nan
    inf = ref.copy()
    inf[1, 1] = -np.inf
    yield ref, inf
    yield ref, ref.astype(np.float16)


@pytest.mark.parametrize("metric", ["cosine", "snr"])
def test_cosine_and_snr_are_polygraphys_bit_for_bit(metric):
    pytest.importorskip("polygraphy")
    from polygraphy.comparator import CosineSimilarityCompareFunc, IterationResult, SnrCompareFunc
    for ref, got in _arrays():
        for threshold in ((0.9, 0.999, 1.0) if metric == "cosine" else (20.0, 60.0)):
            func = (CosineSimilarityCompareFunc(cosine_similarity_threshold=threshold)
                    if metric == "cosine" else SnrCompareFunc(snr_threshold=threshold))
            theirs = func(IterationResult({"y": got}, runner_name="fp16"),
                          IterationResult({"y": ref}, runner_name="fp32"))["y"]
            value = theirs.cosine_similarity if metric == "cosine" else theirs.snr
            ours = cosine(ref, got) if metric == "cosine" else snr(ref, got)
            assert (math.isnan(ours) and math.isnan(value)) or ours == value
            s, _ = _judge(f"{metric}:{threshold}", ref, got)
            assert s.passed is bool(theirs), (metric, threshold, ours)


def test_metric_syntax_reads_the_output_prefix_from_the_right():
    c = parse_metric("out:with:colons:topk:5:-1:0.9")
    assert (c.output, c.entry.name, c.args) == ("out:with:colons", "topk", (5, -1, 0.9))
    c = parse_metric("cosine:0.999")
    assert c.output is None and c.args == (0.999,)
    c = parse_metric("cosine:snr:20")  # an output named like a metric
    assert (c.output, c.entry.name) == ("cosine", "snr")
    c = parse_metric("7:iou:0.3:0.98")
    assert (c.output, c.args) == ("7", (0.3, 0.98))
    crit = parse_criteria(metrics=["cosine:0.99", "logits:topk:1"])
    assert [c.name for c in crit.for_output("logits")] == ["topk:1"]  # the prefix replaces
    assert [c.name for c in crit.for_output("other")] == ["cosine:0.99"]


@pytest.mark.parametrize("spec, words", [
    ("accuracy:0.9", "unknown metric"), ("cosine", "expected MIN"),
    ("cosine:2", "[-1, 1]"), ("topk:0", "at least 1"), ("topk:5:0.9", "integers"),
    ("topk:1:-1:1.5", "(0, 1]"), ("iou:0.3", "THRESHOLD:MIN"), ("snr:inf", "finite"),
    (":cosine:0.9", "empty output"), ("iou:0.3:0.9:1:2", "THRESHOLD:MIN"),
])
def test_bad_metrics_are_one_line_usage_errors(spec, words):
    with pytest.raises(TrtBisectError) as e:
        parse_metric(spec)
    assert words in str(e.value) and e.value.exit_code == 2 and "\n" not in str(e.value)


# ---------------------------------------------------------------- the CLI and the hook

@pytest.fixture
def two(zoo, tmp_path):
    return save_zoo_model(zoo["two_outputs"], tmp_path)


def _one_line(r, code=2) -> str:
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.output
    return lines[0]


def test_a_metric_that_does_not_fit_the_output_is_refused(two, tmp_path):
    model, inputs = two
    r = invoke("-q", "run", model, "--inputs", inputs, "--metric", "out_a:topk:5",
               "--out", tmp_path / "o")
    assert "fewer than K = 5" in _one_line(r)
    r = invoke("-q", "run", model, "--inputs", inputs, "--metric", "nope:cosine:0.9",
               "--out", tmp_path / "o")
    assert "names no output" in _one_line(r)
    r = invoke("-q", "run", model, "--inputs", inputs, "--check-error-stat", "quantile",
               "--error-quantile", "nope:0.5", "--out", tmp_path / "o")
    assert "--error-quantile nope:0.5 names no output" in _one_line(r)
    r = invoke("-q", "check", model, "--reference", model, "--inputs", inputs,
               "--check-error-stat", "maximum")
    assert "unknown statistic 'maximum'" in _one_line(r)


def _scalar_model(tmp_path):
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper as h
    g = h.make_graph([h.make_node("ReduceSum", ["x"], ["y"], keepdims=0, name="sum")], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 10
    onnx.save(m, tmp_path / "scalar.onnx")
    return tmp_path / "scalar.onnx"


def test_topk_on_a_scalar_is_refused(tmp_path):
    r = invoke("-q", "run", _scalar_model(tmp_path), "--metric", "topk:1", "--out", tmp_path / "o")
    assert "scalar" in _one_line(r)


HOOKS = {
    "good": "def check(fp32, fp16, sample):\n"
            "    d = abs(fp32['out_b'] - fp16['out_b']).max()\n"
            "    return bool(d < 1e9), float(d)\n",
    "bool": "import numpy as np\ndef check(fp32, fp16, sample):\n    return np.bool_(True)\n",
    "garbage": "def check(fp32, fp16, sample):\n    return 'yes'\n",
    "triple": "def check(fp32, fp16, sample):\n    return True, 1.0, 2\n",
    "raises": "def check(fp32, fp16, sample):\n    raise ValueError('no\\nway')\n",
    "exits": "import sys\ndef check(fp32, fp16, sample):\n    sys.exit(3)\n",
    "mutates": "def check(fp32, fp16, sample):\n    fp32['out_b'][...] = 0\n    return True\n",
    "syntax": "def check(:\n",
    "imports": "import no_such_module_here\n",
    "nofunc": "def other():\n    pass\n",
}


def _hook(tmp_path, name):
    path = tmp_path / f"hook_{name}.py"
    path.write_text(HOOKS[name])
    return f"{path}:check"


@pytest.mark.parametrize("name, words", [
    ("garbage", "returned str 'yes'"), ("triple", "returned tuple"),
    ("raises", "raised ValueError: no way"), ("exits", "raised SystemExit"),
    ("mutates", "raised ValueError: assignment destination is read-only"),
    ("syntax", "importing"), ("imports", "ModuleNotFoundError"), ("nofunc", "defines no 'check'"),
])
def test_a_broken_hook_is_one_line_and_exit_2(two, tmp_path, name, words):
    model, inputs = two
    r = invoke("-q", "run", model, "--inputs", inputs, "--check", _hook(tmp_path, name),
               "--out", tmp_path / "o")
    assert words in _one_line(r)
    r = invoke("check", model, "--reference", model, "--inputs", inputs,
               "--check", _hook(tmp_path, name))
    assert words in _one_line(r)


def test_a_missing_hook_file_is_refused(two, tmp_path):
    model, inputs = two
    r = invoke("check", model, "--reference", model, "--check", str(tmp_path / "none.py:check"))
    assert "no such file" in _one_line(r)


def test_a_good_hook_judges_and_its_score_is_reported(two, tmp_path):
    model, inputs = two
    r = invoke("-q", "run", model, "--inputs", inputs, "--check", _hook(tmp_path, "good"),
               "--out", tmp_path / "o", "--json")
    plan = json.loads(r.output)
    assert r.exit_code == 0, r.output
    (check,) = plan["judged"]["after"]["checks"]
    assert check["criterion"] == "check" and check["passed"] and isinstance(check["value"], float)
    # the hook alone judges the outputs (out_a is NaN in all-FP16: the hook ignores it)
    assert plan["verdict"] == "fp16_ok"
    assert plan["errors_before"]["out_a"]["scores"][0]["criterion"] == "judged by --check"


def test_the_verdict_names_what_was_met(two, tmp_path):
    """Judged by the user's criteria, the verdict says they were met (console and report),
    not "the tolerance" the run never used; with none given, it is the tolerance."""
    model, inputs = two
    r = invoke("run", model, "--inputs", inputs, "--check", _hook(tmp_path, "good"),
               "--out", tmp_path / "o", "--report")
    assert r.exit_code == 0, r.output
    assert "FP16 already meets the criteria" in r.output
    assert "FP16 already meets the criteria" in (tmp_path / "o" / "report.md").read_text()
    assert "tolerance" not in (tmp_path / "o" / "report.md").read_text().split("\n")[2]
    r = invoke("run", model, "--inputs", inputs, "--metric", "cosine:0.5", "--max-evals", "1",
               "--out", tmp_path / "o2")  # out_a is NaN in all-FP16, and no budget to fix it
    assert r.exit_code == 4 and "no plan meets the criteria" in r.output, r.output
    r = invoke("run", model, "--inputs", inputs, "--out", tmp_path / "o3")
    assert "meets the criteria" not in r.output
    # all-FP16 under per-node rounding is judged, and shown, by the run's criteria too
    r = invoke("run", model, "--inputs", inputs, "--metric", "cosine:0.5", "--report",
               "--out", tmp_path / "o4")
    assert r.exit_code == 0, r.output
    strict = json.loads((tmp_path / "o4" / "precision.json").read_text())["errors_before_strict"]
    assert strict["out_b"]["text"] == "cosine:0.5: 0 (need >= 0.5)"
    assert ("under per-node rounding (strict), `out_b`: FAIL, cosine:0.5: 0 (need \\>= 0.5), "
            "max|d|") in (tmp_path / "o4" / "report.md").read_text()


def test_a_hook_that_breaks_mid_search_never_leaves_a_verdict(two, tmp_path):
    """The hook judges all-FP16, then raises on the first plan the search tries: every rerun
    exits 2 on that same plan, and the journal never records a verdict for it (not even the
    'crashed' one a plan started 3 times without finishing gets)."""
    model, inputs = two
    counter = tmp_path / "calls.txt"
    hook = tmp_path / "flaky.py"
    hook.write_text(
        "import numpy as np, pathlib\n"
        f"P = pathlib.Path({str(counter)!r})\n"
        "def check(fp32, fp16, sample):\n"
        "    n = int(P.read_text()) if P.exists() else 0\n"
        "    P.write_text(str(n + 1))\n"
        "    if n >= 1:\n"
        "        raise RuntimeError('broken on purpose')\n"
        "    return bool(np.isfinite(fp16['out_a']).all())\n")
    for _ in range(4):
        counter.unlink(missing_ok=True)
        r = invoke("-q", "run", model, "--inputs", inputs, "--check", f"{hook}:check",
                   "--out", tmp_path / "o")
        assert "broken on purpose" in _one_line(r)
    lines = [json.loads(ln) for ln in (tmp_path / "o" / "journal.jsonl").read_text().splitlines()]
    abandoned = [ln["abandon"] for ln in lines if "abandon" in ln]
    done = {ln["done"] for ln in lines if "done" in ln}
    assert len(abandoned) == 4 and len(set(abandoned)) == 1
    assert not set(abandoned) & done and not any(ln.get("crashed") for ln in lines)


def test_metrics_change_what_passes(zoo, tmp_path):
    """A healthy model under a very tight max-error tolerance needs FP32 nodes; judged by
    cosine similarity it is FP16-fine."""
    model, inputs = save_zoo_model(zoo["healthy"], tmp_path)
    tight = run(model, Options.of(inputs=[str(inputs)], tolerance=Tolerance(rtol=1e-7)),
                tmp_path / "tight")
    # (1e-7 of the range is below FP32's own noise: the plan found has no margin, `fragile`)
    assert tight.verdict in ("fixed", "no_plan", "fragile")
    assert tight.fp32_nodes or tight.verdict == "no_plan"
    loose = run(model, Options.of(inputs=[str(inputs)], tolerance=Tolerance(rtol=1e-7),
                                  criteria=parse_criteria(metrics=["cosine:0.999"])),
                tmp_path / "cos")
    assert loose.verdict == "fp16_ok"


def test_compare_judges_all_fp16_under_the_given_criteria(two):
    model, inputs = two
    r = invoke("-q", "compare", model, "--inputs", inputs, "--json")
    assert "all_fp16" not in json.loads(r.output)  # no criterion flag: as before
    r = invoke("-q", "compare", model, "--inputs", inputs, "--metric", "out_b:cosine:0.5",
               "--json")
    judged = json.loads(r.output)["all_fp16"]
    assert r.exit_code == 0 and judged["samples"] == 1 and judged["passed_samples"] == 0
    r = invoke("-q", "compare", model, "--inputs", inputs, "--metric", "out_b:cosine:0.5")
    assert "all FP16 under out_b:cosine:0.5: FAIL" in r.output


def test_stability_and_diagnosis_speak_the_runs_criterion(zoo, tmp_path):
    """--stability measures the criterion's severity, and a precision-loss culprit's advice
    is to relax the criterion, not --rtol, when another criterion judged."""
    model, inputs = save_zoo_model(zoo["precision_loss"], tmp_path)
    crit = parse_criteria(stats=["max"])
    r = run(model, Options.of(inputs=[str(inputs)], stability=2, criteria=crit,
                              tolerance=Tolerance(1e-3, 1e-3)), tmp_path / "o")
    assert r.verdict == "fixed" and r.stability.plans
    fixes = [f.text for g in r.culprit_groups for f in g.fixes]
    assert any("relax the criterion (max)" in t for t in fixes), fixes
    assert not any("raise --rtol" in t for t in fixes)
