"""The price in the run's outputs, --budget and its exit code, the trade-off plot."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from tests.models.make_models import zoo
from trtbisect.cli import main
from trtbisect.context import Options
from trtbisect.pipeline import check_mixed, run
from trtbisect.reports.report import pareto_front


@pytest.fixture(scope="module")
def ln(tmp_path_factory):
    import onnx

    z = zoo()["layernorm_overflow"]
    d = tmp_path_factory.mktemp("ln")
    onnx.save(z.model, d / "ln.onnx")
    np.savez(d / "ln.npz", **z.inputs)
    return d / "ln.onnx", d / "ln.npz"


def test_the_price_is_stated_in_precision_json_and_every_trial_is_priced_and_scored(ln, tmp_path):
    model, npz = ln
    r = run(model, Options.of(inputs=[str(npz)], gpu="h100"), tmp_path / "out")
    assert r.verdict == "fixed"
    c = json.loads((tmp_path / "out" / "precision.json").read_text())["cost"]
    assert c["gpu"] == "h100" and c["objective"] == "cost"
    assert c["all_fp16_s"] < c["plan_s"] and c["all_fp16_s"] < c["all_fp32_s"]
    assert c["slowdown"] == pytest.approx(c["plan_s"] / c["all_fp16_s"] - 1)
    assert set(c["units"]) == set(r.fp32_layers)
    assert 0 <= c["fp32_byte_share"] <= 1 and c["boundary_casts"] >= 1
    trace = json.loads((tmp_path / "out" / "trace.json").read_text())
    assert all("price_s" in t and "score" in t for t in trace["trials"])
    first = trace["trials"][0]
    assert first["phase"] == "all-fp16" and first["price_s"] == c["all_fp16_s"]
    assert first["score"] == pytest.approx(max(e.rel for e in r.errors_before.values()))
    passing = [t for t in trace["trials"] if t["passed"]]
    assert all(t["score"] <= 1 for t in passing)
    assert "certificate" in trace and trace["certificate"]["price_s"] == c["plan_s"]


def test_a_budget_nothing_fits_writes_the_best_plan_within_it_and_says_so(ln, tmp_path):
    model, npz = ln
    r = run(model, Options.of(inputs=[str(npz)], budget=0.0), tmp_path / "out")
    assert r.verdict == "over_budget" and r.exit_code == 6 and not r.one_minimal
    assert r.search.over_budget
    c = r.cost
    assert c.budget_pct == 0.0 and c.within_budget and c.slowdown <= 1e-12
    # the written file is judged (one judge) and its error is the one reported
    mixed = tmp_path / "out" / "ln.mixed.onnx"
    assert mixed.exists()
    checked = check_mixed(mixed, model, Options.of(inputs=[str(npz)]))
    assert not checked.passed
    assert {k: v.max_abs for k, v in checked.errors.items()} == \
        {k: v.max_abs for k, v in r.errors_after.items()}
    assert r.one_judge.search_equals_check
    assert json.loads((tmp_path / "out" / "precision.json").read_text())["verdict"] == \
        "over_budget"


def test_a_budget_the_plan_fits_changes_nothing(ln, tmp_path):
    model, npz = ln
    plain = run(model, Options.of(inputs=[str(npz)]), tmp_path / "plain")
    loose = run(model, Options.of(inputs=[str(npz)], budget=1000.0), tmp_path / "loose")
    assert loose.verdict == "fixed" and loose.fp32_nodes == plain.fp32_nodes
    assert loose.cost.within_budget is True


def test_the_cli_exits_6_over_budget_and_documents_it(ln, tmp_path):
    model, npz = ln
    res = CliRunner().invoke(main, ["run", str(model), "--inputs", str(npz), "--out",
                                    str(tmp_path / "o"), "--budget", "0", "-q"])
    assert res.exit_code == 6, res.output
    assert "no plan within the --budget passes" in res.output
    assert "over the 0% budget" not in res.output  # the written plan fits; it fails the tolerance
    help_text = CliRunner().invoke(main, ["run", "--help"]).output
    assert "--budget PCT" in help_text and "  6  " in help_text and "--gpu" in help_text
    res = CliRunner().invoke(main, ["run", str(model), "--inputs", str(npz), "--out",
                                    str(tmp_path / "j"), "--json", "-q"])
    assert res.exit_code == 0 and json.loads(res.output)["cost"]["gpu"] == "l4"
    res = CliRunner().invoke(main, ["run", str(model), "--gpu", "v100"])
    assert res.exit_code == 2


def test_count_objective_reports_the_price_too(ln, tmp_path):
    model, npz = ln
    r = run(model, Options.of(inputs=[str(npz)], objective="count"), tmp_path / "out")
    assert r.cost.objective == "count" and r.search.certificate is None


def test_pareto_front():
    pts = [(0.0, 0.5, False), (2.0, 0.1, False), (1.0, 0.5, False), (3.0, 0.001, True),
           (4.0, 0.001, True), (2.5, math.nan, False), (5.0, 0.0005, True)]
    assert pareto_front(pts) == [3, 6]  # passing plans only: a failing one promises nothing
    pts[1] = (2.0, 0.1, True)
    assert pareto_front(pts) == [1, 3, 6]
    assert pareto_front([]) == []


def test_the_report_plots_error_against_cost(ln, tmp_path):
    model, npz = ln
    r = run(model, Options.of(inputs=[str(npz)], report=True), tmp_path / "out")
    png = tmp_path / "out" / "report_tradeoff.png"
    assert r.files["report_tradeoff"] == str(png) and png.read_bytes()[:4] == b"\x89PNG"
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Error against estimated cost" in md and "report_tradeoff.png" in md
    assert "estimated engine time on NVIDIA L4" in md
    assert "| TensorRT layer | cost | cause |" in md or "| op | cost | cause |" in md
    html = (tmp_path / "out" / "report.html").read_text()
    assert html.count("data:image/png;base64") == 2


def test_a_resumed_cost_search_reaches_the_same_plan_and_prices(ln, tmp_path):
    """The journal replays every judgement: the same path, plan, certificate and scores."""
    model, npz = ln
    first = run(model, Options.of(inputs=[str(npz)]), tmp_path / "out")
    again = run(model, Options.of(inputs=[str(npz)]), tmp_path / "out")  # resumes from its journal
    assert again.fp32_nodes == first.fp32_nodes
    assert [t.to_json() for t in again.search.trials] == [t.to_json() for t in first.search.trials]
    assert again.search.certificate == first.search.certificate
