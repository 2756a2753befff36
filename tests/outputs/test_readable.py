"""What a person reads about a large plan (issue #37): the console fits one screen, grouped by
module or TensorRT layer with the costliest rows first; --top and --all choose; progress and
verdict count the same thing."""

from __future__ import annotations

import io
import json
import re

import pytest
from click.testing import CliRunner
from rich.console import Console

from tests.conftest import save_zoo_model
from tests.models.make_models import norm_stack
from trtbisect import cli
from trtbisect.cli import main
from trtbisect.outputs.plan_groups import DEFAULT_TOP, PlanGroup, plan_groups


@pytest.fixture(scope="module")
def stack_run(tmp_path_factory):
    """36 overflowing decomposed LayerNorms: a plan of ~290 nodes, run once; the trials the
    progress callback saw come with it."""
    return _stack(tmp_path_factory.mktemp("stack"), report=False)


def _stack(tmp, report: bool):
    from trtbisect.context import Options
    from trtbisect.pipeline import run

    model, inputs = save_zoo_model(norm_stack(36), tmp)
    opts = Options.of(inputs=[str(inputs)], report=report, workers=1)
    seen: list = []
    result = run(model, opts, tmp / "o", lambda trial, remaining: seen.append(trial))
    return result, tmp / "o", seen


def _console(monkeypatch, width: int = 80) -> Console:
    console = Console(file=io.StringIO(), width=width)
    monkeypatch.setattr(cli, "out", console)
    return console


def _shown(stack_run, monkeypatch, top: int | None = DEFAULT_TOP) -> str:
    """What `run` prints for the stack's result (`top`: --top N; None: --all)."""
    console = _console(monkeypatch)
    cli.emit_run(stack_run[0], False, top)
    return console.file.getvalue()


def test_a_large_plan_fits_one_screen(stack_run, monkeypatch):
    text = _shown(stack_run, monkeypatch)
    plan = json.loads((stack_run[1] / "precision.json").read_text())
    assert len(plan["fp32_nodes"]) >= 250  # a large plan indeed
    lines = text.splitlines()
    assert len(lines) <= 44, text  # one screen at 80 columns (long --out paths wrap)
    layers = len(plan["fp32_layers"])  # the verdict counts nodes and names the layers too
    assert lines[0] == (f"verdict: fixed by keeping {len(plan['fp32_nodes'])} of 360 nodes "
                        f"({layers} TensorRT layers) in FP32") and layers < 250
    rows = [ln for ln in lines if ln.startswith("│ norms.")]
    assert len(rows) == 10  # the default --top, one line each
    costs = [float(r.split("│")[4].strip().rstrip("%")) for r in rows]
    assert costs == sorted(costs, reverse=True)  # costliest first
    assert "... and 26 more rows" in text and "--all" in text
    # one diagnosis paragraph for the 36 groups of the same kind, and it is numbered as the
    # table's cause column says
    assert text.count("overflow, layernorm_decomposed") == 1 and "x36 groups" in text
    assert all(r.split("│")[5].strip() == "1. overflow" for r in rows)
    # the full list stays where it was
    assert (stack_run[1] / "layer_precisions.txt").exists()


def test_top_and_all_choose_how_much(stack_run, monkeypatch):
    top = _shown(stack_run, monkeypatch, 3)
    assert len([ln for ln in top.splitlines() if ln.startswith("│ norms.")]) == 3
    every = _shown(stack_run, monkeypatch, None)
    assert "more rows" not in every
    table = re.split(r"Nodes to keep in FP32 *\n", every, maxsplit=1)[1]  # --all's per node
    cells = "".join(ln.split("│")[1].strip() for ln in table.splitlines()
                    if ln.startswith("│") and ln.count("│") > 2)
    assert all(n in cells for n in stack_run[0].fp32_nodes)


def test_run_takes_top_and_all(zoo, tmp_path, monkeypatch):
    model, inputs = save_zoo_model(zoo["layernorm_overflow"], tmp_path)
    for flags, per_node in (((), False), (("--top", "1"), False), (("--all",), True)):
        text = _plain_run(monkeypatch, model, inputs, tmp_path / "o", *flags)
        assert "Nodes to keep in FP32, by TensorRT layer" in text  # no module names
        assert bool(re.search(r"Nodes to keep in FP32 *\n", text)) == per_node
    assert CliRunner().invoke(main, ["run", str(model), "--top", "0"]).exit_code == 2


def test_groups_sum_unit_costs_once_and_fall_back_to_layers():
    from types import SimpleNamespace

    from trtbisect.diagnosis.diagnose import Culprit
    from trtbisect.search.cost import PlanUnitCost

    class R:
        culprits = [Culprit("a/Add", "Add", "", None, "PWN(a/Add, a/Mul)"),
                    Culprit("a/Mul", "Mul", "", None, "PWN(a/Add, a/Mul)"),
                    Culprit("b/Pow", "Pow", "", None, None),
                    Culprit("c/Exp", "Exp", "", None, None)]
        cost = SimpleNamespace(units={  # search/cost.CostRecord's units, read by attribute
            "PWN(a/Add, a/Mul)": PlanUnitCost(1.0, 1.0, 0.01, []),
            "b/Pow": PlanUnitCost(1.0, 1.0, 0.03, []), "c/Exp": PlanUnitCost(1.0, 1.0, 0.0, [])})
        culprit_groups = [  # diagnose.CulpritGroup, read by attribute
            SimpleNamespace(nodes=["a/Add", "a/Mul"], cause="overflow", pattern=None),
            SimpleNamespace(nodes=["b/Pow"], cause="underflow", pattern=None),
            SimpleNamespace(nodes=["c/Exp"], cause="overflow", pattern=None)]

    groups = plan_groups(R())
    assert [g.label for g in groups] == ["b/Pow", "a/Add", "c/Exp"]
    assert [g.share for g in groups] == [0.03, 0.01, 0.0]  # the fused layer's price once
    assert groups[1].nodes == ["a/Add", "a/Mul"] and groups[1].nodes_text == "2 (1 layer)"
    assert [g.diagnoses for g in groups] == [[2], [1], [1]]  # kinds, as the paragraphs count


def test_ops_cell_keeps_the_commonest_and_counts_the_rest():
    g = PlanGroup("m", True, ops=["Mul", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul",
                                  "Add"])
    assert g.ops_text(None) == "Mul x2, Add x2, Pow, ReduceMean, Sqrt, Div"
    short = g.ops_text(24)
    assert len(short) <= 24 and short.endswith("more") and short.startswith("Mul x2")


def test_progress_counts_nodes_as_the_verdict_does(stack_run):
    """`Evaluation k | ... | N nodes FP32` counts nodes (a fused layer is several), like the
    verdict's `keeping N of M nodes`."""
    result, _, seen = stack_run
    assert any(set(t.fp32) == set(result.fp32_nodes) for t in seen if t.passed)
    assert not any(n.startswith("PWN(") for t in seen for n in t.fp32)  # nodes, not layers
    msgs = io.StringIO()
    progress = cli.Progress(0, Console(file=msgs, width=200))
    progress.trial(next(t for t in seen if set(t.fp32) == set(result.fp32_nodes)), 0)
    assert f"| {len(result.fp32_nodes)} nodes FP32 |" in msgs.getvalue()


@pytest.mark.slow  # ~18 s: the 290-node plan's report (plots, the plan's layer-wise pass)
def test_report_leads_with_the_answer_and_lists_each_node_once(tmp_path):
    pytest.importorskip("matplotlib")
    _, out, _ = _stack(tmp_path, report=True)
    page = (out / "report.html").read_text()
    plan = json.loads((out / "precision.json").read_text())
    order = [page.index(mark) for mark in ("class='verdict", "class='margin'",
                                           "Error against estimated cost", "The plan by module",
                                           "<h2>Diagnosis", "Error per output",
                                           "<summary>Every node of the plan")]
    assert order == sorted(order)
    assert re.search(r"y: the plan uses [0-9.]+% of the bound", page)
    # the plan's node list appears once, collapsed; what comes before it names a node only
    # as evidence (a few), never as a list (commands and the plot's hover titles aside)
    text = re.sub(r"<pre>.*?</pre>|title='[^']*'", "", page, flags=re.S)
    for node in plan["fp32_nodes"]:
        assert text.count(f"<td class=''>{node}</td>") == 1, node
    head = re.sub(r"<dl class='ev'>.*?</dl>", "", text[:text.index("<summary>Every node of")],
                  flags=re.S)  # each group's evidence names the node it measured
    assert sum(node in head for node in plan["fp32_nodes"]) <= 5
    assert "<details><summary>Every node of the plan (" in page
    assert "35 more overflow, layernorm_decomposed groups" in page
    md = (out / "report.md").read_text()  # evidence and fixes once for the 36 of one kind
    assert md.count("### Group ") == 36 and md.count("Evidence: ") == 1
    # numbers for people: no float printed with its full binary expansion
    shown = re.sub(r"<[^>]+>|data:image/png;base64,[^'\"]+", " ", text)
    assert not _long_numbers(shown)


@pytest.mark.parametrize("form", ["rsqrt", "weight_first"])
def test_rmsnorm_advice_is_what_rewrite_then_does(form, tmp_path, monkeypatch):
    """The diagnosis of an RMSNorm overflow names a fix, says `--rewrite` does it here, and
    `--rewrite` then fixes the model with no FP32 node (the forms PyTorch and Hugging Face
    export)."""
    import numpy as np
    import onnx

    from tests.rewrites.test_rewrites import _rms_model

    model = tmp_path / "rms.onnx"
    onnx.save(_rms_model(form), str(model))
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=np.random.default_rng(0).standard_normal((1, 4, 16)).astype(np.float32))
    text = _plain_run(monkeypatch, model, inputs, tmp_path / "a")
    plan = json.loads((tmp_path / "a" / "precision.json").read_text())
    (group,) = plan["culprit_groups"]
    assert group["pattern"] == "rmsnorm_decomposed"
    fix = next(f for f in group["fixes"] if f["kind"] == "prescale_norm")
    assert fix["rewrite"]["status"] == "matches", fix
    assert "`run --rewrite` can do this here: scale_before_square" in " ".join(text.split())
    _plain_run(monkeypatch, model, inputs, tmp_path / "b", "--rewrite")
    fixed = json.loads((tmp_path / "b" / "precision.json").read_text())
    assert fixed["verdict"] == "fixed" and fixed["fp32_nodes"] == []
    assert [a["rewrite"] for a in fixed["rewrites"]["applied"]] == [fix["rewrite"]["rule"]]


def _plain_run(monkeypatch, model, inputs, out, *extra: str) -> str:
    console = _console(monkeypatch)
    res = CliRunner().invoke(main, ["run", str(model), "--inputs", str(inputs), "--out",
                                    str(out), "-q", "--workers", "1", *extra])
    assert res.exit_code == 0, res.output
    return console.file.getvalue()


def test_advice_says_why_a_rewrite_does_not_apply():
    """Each rewritable fix gets the words of why (not) and a record; the group advised is a
    new record, the one given stays as it was (frozen records, #43 item 2)."""
    from trtbisect.diagnosis.advice import advise_group
    from trtbisect.diagnosis.diagnose import CulpritGroup
    from trtbisect.diagnosis.wording import Fix, RewriteAdvice
    from trtbisect.rewrites.driver import RewritesRecord
    from trtbisect.rewrites.rules import Refusal

    g = CulpritGroup(["n/Pow", "n/ReduceMean"], "overflow", "rmsnorm_decomposed", {},
                     "x; keep these 2 nodes in FP32, or divide x first.",
                     [Fix("keep_fp32", "keep"), Fix("prescale_norm", "divide x first")],
                     "keep_fp32")
    as_given = g.to_json()
    refused = Refusal("scale_before_square", ("n/Pow", "n/ReduceMean"), "eps / s^2 too big")
    got = advise_group(g, None, [], [refused])
    assert got.fixes[1].rewrite == RewriteAdvice(
        "scale_before_square", "refused", "`run --rewrite` cannot do it here: "
        "scale_before_square: eps / s^2 too big", "eps / s^2 too big")
    assert "cannot do it here: scale_before_square: eps / s^2 too big" in got.summary
    assert got.fixes[1].text in got.summary and got.fixes[1].text.startswith("divide x first (")
    assert g.to_json() == as_given and g.fixes[1].rewrite is None  # untouched
    assert list(got.to_json()["fixes"][1]["rewrite"]) == ["rule", "status", "reason", "words"]
    assert advise_group(got, None, [], []) == got  # a fix advised once is not advised again
    got = advise_group(g, None, [], [])  # no rule matches at all
    assert got.fixes[1].rewrite is not None and got.fixes[1].rewrite.status == "no_match"
    assert "change the source" in got.summary and "reason" not in got.fixes[1].rewrite.to_json()
    # the run's own --rewrite refused it: its reason, not a second look
    got = advise_group(g, RewritesRecord([], [refused], all_fp16_passes=False, judgements=1))
    assert "--rewrite tried scale_before_square here and refused it" in got.summary
    assert got.fixes[0] is g.fixes[0] and got.fixes[0].text == "keep"  # no rewrite's
    assert g.to_json() == as_given
    assert CulpritGroup.from_json(got.to_json()) == got  # the advice round-trips


def test_error_trend_words_follow_the_numbers():
    from trtbisect.diagnosis.wording import _trend

    assert "grows from 0.1% to 1%" in _trend({"input_rel_err": 0.001, "rel_err": 0.01}, "FP16")
    falls = _trend({"input_rel_err": 0.0141, "rel_err": 0.00997}, "FP16")
    assert "grows" not in falls and "falls to 0.997%" in falls and "1.41%" in falls
    assert "stays near 0.0518%" in _trend({"input_rel_err": 0.000522, "rel_err": 0.000518},
                                          "FP16")


def _sentences(x):
    """Every string of a run's record (its diagnosis, its why-cells, its summaries)."""
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _sentences(v)
    elif isinstance(x, list):
        for v in x:
            yield from _sentences(v)


NUM = r"(\d[\d.]*(?:e[+-]?\d+)?)"


def _said(text: str, pattern: str) -> list[tuple[float, ...]]:
    return [tuple(float(v) for v in m) if isinstance(m, tuple) else (float(m),)
            for m in re.findall(pattern.replace("N", NUM), text)]


@pytest.mark.parametrize("name, budget", [("layernorm_overflow", None), ("two_outputs", 2),
                                          ("precision_loss", None)])
def test_every_sentence_says_the_numbers_it_describes(tmp_path, name, budget):
    """Each number a sentence relates to another follows from it (#46 item 6): a square's
    result is its input squared ("squares values of 1.08e3: x^2 = 1.17e6"), an overflow
    factor is the value over FP16's max, an error "grows" only upward and "falls" only
    downward, "keep these N nodes" counts the group's nodes, and report.html's "Every node of
    the plan (N)" counts the plan's nodes (not the boundary Casts' row)."""
    from tests.models.make_models import zoo
    from trtbisect.context import Options
    from trtbisect.pipeline import run
    from trtbisect.reports.report import render_html

    path, inputs = save_zoo_model(zoo()[name], tmp_path)
    r = run(path, Options.of(inputs=[str(inputs)], budget=budget), tmp_path / "o")
    checked = 0
    for text in _sentences(r.to_json()):
        for a, b in _said(text, r"squares values of N: (?:\(x - mean\)\^2|x\^2) = N"):
            assert b == pytest.approx(a * a, rel=0.02), text
            checked += 1
        for b, factor in _said(text, r"= N overflows FP16 \(max 65504, N+x over\)"):
            assert factor == pytest.approx(b / 65504, rel=0.02), text
        for a, b in _said(text, r"grows from N% to N%"):
            assert b > a, text
            checked += 1
        for a, b in [*_said(text, r"already N% where the values enter, falls to N%"),
                     *_said(text, r"falls from N% to N%")]:
            assert b < a, text
    for g in r.culprit_groups or []:
        for (n,) in _said(g.summary, r"keep these N nodes"):
            assert n == len(g.nodes), g.summary
            checked += 1
    assert checked  # the model's diagnosis says such numbers
    page = render_html(r, None, [], None)  # report.html without its plots
    (n,) = _said(page, r"Every node of the plan \(N\)")
    assert n == (len(r.fp32_nodes),)


def test_loosening_the_criterion_quotes_what_all_fp16_needs():
    from types import SimpleNamespace

    from trtbisect.diagnosis.diagnose import relax_words
    from trtbisect.judge.compare import OutputError, Tolerance
    from trtbisect.judge.criteria import Criteria

    def result(rel: float, nonfinite: int = 0):
        e = OutputError(rel * 10, 0.1, rel, 0.0, 0.0, 1.0, nonfinite, False)
        return SimpleNamespace(criteria=Criteria(), errors_before={"y": e},
                               tolerance=Tolerance(0.01, 0.0))

    near = relax_words(result(0.03))
    assert "raise --rtol to 0.0303" in near and "all FP16 would pass" in near
    far = relax_words(result(0.99))
    assert "--rtol" in far and "raise --rtol" not in far and "--metric" in far
    assert relax_words(result(0.03, nonfinite=3)) == ""  # no tolerance covers NaN


def test_fp16_ok_says_no_plan_words(zoo, tmp_path, monkeypatch):
    model, inputs = save_zoo_model(zoo["healthy"], tmp_path)
    text = _plain_run(monkeypatch, model, inputs, tmp_path / "o")
    assert "already meets" in text
    assert "with the plan" not in text and "certified" not in text and "evaluations" not in text


# ---------------------------------------------------------------- papercuts (issue #37)

def test_precision_both_judges_an_opset_12_model_in_both_through_a_converted_copy(tmp_path):
    """Before #34, BF16 refused an opset-12 model (Cast takes bfloat16 from 13); #37 made
    `--precision both` refuse it up front. Now the BF16 half judges a converted copy."""
    import numpy as np
    import onnx
    from onnx import helper

    from tests.conftest import x_to_y

    model = tmp_path / "old.onnx"
    onnx.save(x_to_y([helper.make_node("Relu", ["x"], ["y"], name="r")], opset=12), str(model))
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=np.ones(4, np.float32))
    res = CliRunner().invoke(main, ["run", str(model), "--inputs", str(inputs), "--out",
                                    str(tmp_path / "o"), "--precision", "both"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "o" / "fp16" / "precision.json").exists()
    assert (tmp_path / "o" / "bf16" / "precision.json").exists()


@pytest.mark.parametrize("command", ["compare", "check"])
def test_only_run_offers_precision_both(command):
    helptext = CliRunner().invoke(main, [command, "--help"]).output
    assert "[fp16|bf16]" in helptext and "both" not in helptext.split("--precision", 1)[1][:200]
    assert "[fp16|bf16|both|int8|fp8]" in CliRunner().invoke(main, ["run", "--help"]).output


def test_check_infers_bf16_from_the_file(zoo, tmp_path):
    from trtbisect.context import Options
    from trtbisect.pipeline import run

    z = zoo["layernorm_overflow"]
    model, inputs = save_zoo_model(z, tmp_path)
    r = run(model, Options.of(inputs=[str(inputs)], precision="bf16"), tmp_path / "bf16")
    mixed = r.files["mixed_model"]
    res = CliRunner().invoke(main, ["check", mixed, "--reference", str(model), "--inputs",
                                    str(inputs)])
    assert res.exit_code in (0, 4) and "bfloat16 tensors" in res.output, res.output
    res = CliRunner().invoke(main, ["check", mixed, "--reference", str(model), "--inputs",
                                    str(inputs), "--precision", "fp16"])  # said: obeyed
    assert res.exit_code == 2 and "judge it with --precision bf16" in res.output


@pytest.mark.parametrize("dims, expected", [
    ([None, 3, None, None], "x:1x3x224x224"),  # an image, NCHW
    (["batch", "seq_len"], "x:1x128"),  # token ids
    (["N", 16, "T"], "x:1x16x128"),
    ([1, "height", "width", 3], "x:1x224x224x3"),  # NHWC
])
def test_dynamic_shape_error_suggests_a_shape_that_fits(tmp_path, dims, expected):
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    model = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10),
              str(model))
    res = CliRunner().invoke(main, ["run", str(model), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and f"--shape {expected}" in res.output, res.output


def test_readme_demo_output_is_what_the_demo_prints():
    """README.md's demo block against a fresh run of its command (scripts/readme_demo.py
    --write regenerates it): same verdict, same sections in order, no number the demo no
    longer prints."""
    from pathlib import Path

    from tests.conftest import script_module

    demo = script_module("readme_demo")
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    problems = demo.differences(demo.readme_block(readme), demo.demo_output())
    assert not problems, "README.md is stale; run python scripts/readme_demo.py --write: " \
        + "; ".join(problems)
    # the comparison itself can fail: a stale number, a missing section
    block = demo.readme_block(readme)
    assert demo.differences(block.replace("FAIL max|d| ", "FAIL max|d| 9"), block)
    assert demo.differences(block.replace("\nOutputs", "\nnothing"), block)


@pytest.mark.slow  # ~11 s: torch's import, its search and an export
def test_torch_and_run_name_the_batchnorm_the_export_folds(tmp_path):
    """`torch --mode half` keeps the stem Conv + BatchNorm in FP32, `run` on the same factory
    keeps nothing: both say why (the export folds the BatchNorm into the Conv)."""
    pytest.importorskip("torch")
    factory = "tests/models/torch_models.py:amp_conv_overflow"
    res = CliRunner().invoke(main, ["-q", "torch", factory, "--mode", "half", "--out",
                                    str(tmp_path / "t")])
    assert res.exit_code == 0, res.output
    plan = json.loads((tmp_path / "t" / "torch_plan.json").read_text())
    assert plan["fp32_modules"]  # PyTorch's own half precision needs the stem
    said = " ".join(res.output.split())
    assert "stem.0 (Conv2d) and stem.1 (BatchNorm2d)" in said and "fold" in said
    res = CliRunner().invoke(main, ["run", factory, "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    run_plan = json.loads((tmp_path / "r" / "precision.json").read_text())
    assert run_plan["fp32_nodes"] == []  # the folded Conv passes in FP16
    said = " ".join(res.output.split())
    assert "folded 1 BatchNorm(s)" in said and "stem.1 (BatchNorm2d) into stem.0 (Conv2d)" in said


def test_conv_norm_pairs_and_what_the_export_left():
    torch = pytest.importorskip("torch")
    from onnx import helper

    from trtbisect.diagnosis.folding import conv_norm_pairs, folded_at_export

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = torch.nn.Conv2d(3, 3, 1), torch.nn.BatchNorm2d(3)
            self.act = torch.nn.ReLU()
            self.conv2, self.bn2 = torch.nn.Conv2d(3, 3, 1), torch.nn.BatchNorm2d(3)

    m = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1), torch.nn.BatchNorm2d(3), Block())
    pairs = conv_norm_pairs(m)
    assert [(p.conv, p.norm) for p in pairs] == [("0", "1"), ("2.conv1", "2.bn1"),
                                                 ("2.conv2", "2.bn2")]
    nodes = [helper.make_node("BatchNormalization", [], [], name="/2/bn2/BatchNormalization"),
             helper.make_node("Conv", [], [], name="/0/Conv")]
    assert [p.norm for p in folded_at_export(pairs, nodes)] == ["1", "2.bn1"]
    assert pairs[1].holds("2") and pairs[1].holds("2.bn1") and not pairs[1].holds("2.act")


def test_small_report_order_and_numbers(zoo, tmp_path):
    """The fast twin of the large-plan report test: the answer first, numbers for people."""
    pytest.importorskip("matplotlib")
    from trtbisect.context import Options
    from trtbisect.pipeline import run

    model, inputs = save_zoo_model(zoo["layernorm_overflow"], tmp_path)
    run(model, Options.of(inputs=[str(inputs)], report=True), tmp_path / "o")
    page = (tmp_path / "o" / "report.html").read_text()
    marks = ("class='verdict", "class='margin'", "The plan by", "<h2>Diagnosis",
             "Error per output", "<summary>Every node of the plan", "<h2>Run</h2>")
    assert [page.index(m) for m in marks] == sorted(page.index(m) for m in marks)
    shown = re.sub(r"<pre>.*?</pre>|<[^>]+>|data:image/png;base64,[^'\"]+|title='[^']*'", " ",
                   page, flags=re.S)
    assert not _long_numbers(shown)
    md = (tmp_path / "o" / "report.md").read_text()
    assert "uses" in md and "of the bound" in md
    assert not _long_numbers(re.sub(r"```.*?```", "", md, flags=re.S))  # commands aside


def _long_numbers(text: str) -> list[str]:
    """Decimals printed with more than 6 significant digits (raw floats, not for people)."""
    return [n for n in re.findall(r"\d+\.\d+", text)
            if len(n.replace(".", "").lstrip("0")) > 6]
