"""report.html / report.md: self-contained, complete, escaped; drawn by a real browser; and a
one-line hint when matplotlib is missing."""

from __future__ import annotations

import base64
import dataclasses
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from tests.conftest import save_zoo_model
from trtbisect.cli import main
from trtbisect.context import Options
from trtbisect.errors import TrtBisectError
from trtbisect.pipeline import run
from trtbisect.reports.report import render_html

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def reported(zoo, tmp_path_factory):
    """The layernorm fault run with --report and --stability, once for the module."""
    folder = tmp_path_factory.mktemp("report")
    model, inputs = save_zoo_model(zoo["layernorm_overflow"], folder)
    r = run(model, Options.of(semantics="strict", inputs=[str(inputs)], report=True, stability=3), folder / "out")
    return r, folder / "out"


def test_html_is_self_contained_and_complete(reported):
    r, out = reported
    page = (out / "report.html").read_text()
    assert r.files["report_html"] == str(out / "report.html")
    assert not re.search(r"""(src|href)=['"]?(https?:|//|file:)""", page)  # nothing fetched
    png = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert png and base64.b64decode(png.group(1)).startswith(b"\x89PNG")
    for must in ("fixed by keeping 4 of", "overflow", "layernorm_decomposed", "65504",
                 "applied by the plan", "opset &gt;= 17", "Search trace", "Error per output",
                 "trtexec --onnx=", "--stronglyTyped", "polygraphy run", "modelopt.onnx.autocast",
                 "Stability", "ln/Pow"):
        assert must in page, must
    assert page.count("<tr class='fail'>") + page.count("<tr class='pass'>") == \
        len(r.search.trials)


def test_markdown_report(reported):
    r, out = reported
    md = (out / "report.md").read_text()
    assert "![per-tensor plot](report_plot.png)" in md
    assert (out / "report_plot.png").read_bytes().startswith(b"\x89PNG")
    # names as code spans (no HTML, no links), then the cost column
    assert re.search(r"\| `ln/Pow` \| `Pow` \| \\?\+[0-9.]+% \| overflow \|", md)
    assert "### Group 1: `overflow`, pattern `layernorm_decomposed`" in md
    assert "```sh\ntrtexec" in md and "## Search trace" in md


def test_plot_marks_the_limit(reported):
    """Decode the plot: the red dashed FP16-limit line and red culprit markers are drawn."""
    from matplotlib import image

    img = image.imread(str(reported[1] / "report_plot.png"))
    rgb = img[..., :3]
    red = (rgb[..., 0] > 0.75) & (rgb[..., 1] < 0.3) & (rgb[..., 2] < 0.3)
    assert red.sum() > 500


def test_html_escapes_names(reported):
    r, _ = reported
    group = dataclasses.replace(r.culprit_groups[0], summary="<script>alert(1)</script>")
    r2 = type(r)(**{**r.__dict__, "culprit_groups": [group]})
    page = render_html(r2, None)
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_run_facts_are_one_list_rendered_twice(reported):
    """report.md and report.html's "Run" box render the same facts: a problem's words and a
    path are Markdown-escaped in one and HTML-escaped in the other, never dropped; the
    criterion, coverage and cost lines are the Markdown's only."""
    from trtbisect.reports.report import _facts_text, _md_facts

    r, _ = reported
    r2 = type(r)(**{**r.__dict__, "model_path": "m`*x*`.onnx",
                    "reference_problems": ["*bold* <b>x</b>"]})
    md, text = _md_facts(r2), _facts_text(r2)
    assert md[0].startswith("- model: ``m`*x*`.onnx`` (sha256 `")
    assert text[0].startswith("model: m`*x*`.onnx (sha256 ")
    assert md[-1] == r"- problem: \*bold\* \<b\>x\</b\>"
    assert text[-1] == "problem: *bold* <b>x</b>"
    assert "&lt;b&gt;x&lt;/b&gt;" in render_html(r2, None)
    only_md = [m for m in md if m.startswith(("- criterion:", "- judged on", "- estimated"))]
    assert only_md and len(md) == len(text) + len(only_md)
    shared = [m for m in md if m not in only_md]
    assert [m.removeprefix("- ").replace("`", "").replace("\\", "") for m in shared[1:-1]] \
        == text[1:-1]


@pytest.mark.parametrize("name", ["healthy", "fp32_broken", "two_outputs"])
def test_report_for_every_verdict(zoo, tmp_path, name):
    model, inputs = save_zoo_model(zoo[name], tmp_path)
    r = run(model, Options.of(semantics="strict", inputs=[str(inputs)], report=True), tmp_path / "out")
    page = (tmp_path / "out" / "report.html").read_text()
    assert r.verdict in page.replace("FP16 already meets", "fp16_ok").replace(
        "reference is already non-finite", "reference_invalid").replace("fixed by", "fixed")
    assert ("report_plot" in r.files) == (name != "fp32_broken")  # no stats, no plot


def test_missing_matplotlib_is_a_one_line_hint(zoo, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    model, inputs = save_zoo_model(zoo["layernorm_overflow"], tmp_path)
    with pytest.raises(TrtBisectError, match=r"pip install 'trtbisect\[report\]'"):
        run(model, Options.of(semantics="strict", inputs=[str(inputs)], report=True), tmp_path / "out")
    assert not (tmp_path / "out").exists()  # failed before any work
    res = CliRunner().invoke(main, ["run", str(model), "--inputs", str(inputs), "--report",
                                    "--out", str(tmp_path / "out")])
    assert res.exit_code == 2
    assert "trtbisect[report]" in res.output and "Traceback" not in res.output


def test_cli_report_flag(zoo, tmp_path):
    model, inputs = save_zoo_model(zoo["attention_logits"], tmp_path)
    res = CliRunner().invoke(main, ["-q", "run", str(model), "--inputs", str(inputs), "--report",
                                    "--stability", "2", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "out" / "report.html").exists() and "report:" in res.output
    assert "stability (2 runs" in " ".join(res.output.split())


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.browser
@pytest.mark.skipif(chromium() is None, reason="headless Chromium not installed "
                    "(apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(reported, tmp_path):
    """A real browser draws the page, and what it draws is not blank."""
    from PIL import Image

    shot = tmp_path / "out.png"
    subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-background-networking", "--disable-component-update",
                    "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
                    f"--screenshot={shot}", "--window-size=1200,1600",
                    (reported[1] / "report.html").resolve().as_uri()],
                   check=True, timeout=120, capture_output=True)
    pixels = np.asarray(Image.open(shot).convert("RGB"), dtype=np.float64)
    assert pixels.shape[:2] == (1600, 1200)
    assert pixels.std() > 20  # text, tables and the plot, not a blank page
    band = pixels[1000:1500]  # the plot sits below the diagnosis: not one flat colour
    assert len(np.unique(band.reshape(-1, 3), axis=0)) > 50


def test_plan_curve_is_drawn_from_the_pipelines_plan_errors(reported):
    from trtbisect.reports.report import plan_errors, plot_png

    r, _ = reported
    stats = list(r.stats.values())
    measured = plan_errors(r, stats)  # run --report measured the plan's own curve
    assert measured is not None and max(measured) < max(s.rel_err for s in stats)
    assert plan_errors(dataclasses.replace(r, layerwise_plan=None), stats) is None  # only all-FP16
    mixed = dataclasses.replace(r, layerwise_plan={stats[0].name: 0.5,
                                                   stats[1].name: {"rel_err": 0.25},
                                                   stats[2].name: stats[2]})
    got = plan_errors(mixed, stats)
    assert got[:3] == [0.5, 0.25, stats[2].rel_err] and all(np.isnan(v) for v in got[3:])
    assert plot_png(mixed).startswith(b"\x89PNG")


def test_every_tensor_has_a_hover_title_on_the_plot(reported):
    from trtbisect.reports.report import plot, render_html

    r, _ = reported
    png, columns = plot(r)
    page = render_html(r, png, columns)
    assert len(columns) == len(r.stats) and page.count("class='col'") == len(r.stats)
    for s in r.stats.values():
        assert f"title='{s.name} (by" in page
    lefts = [c[1] for c in columns]
    assert lefts == sorted(lefts) and 0 <= lefts[0] and lefts[-1] + columns[-1][3] <= 100.5


def test_culprit_table_names_the_tensorrt_layer_when_fused(reported):
    from trtbisect.reports.report import culprit_rows

    r, _ = reported  # strict semantics: no culprit is in a fused layer, so no column
    head, _ = culprit_rows(r)
    assert r.culprits and not any(c.layer for c in r.culprits)
    assert "TensorRT layer" not in head
    # one culprit in a layer, as trt semantics would say (a culprit is a frozen record)
    fused = dataclasses.replace(r, culprits=[
        dataclasses.replace(r.culprits[0], layer="Conv_0 + PWN(Add_1, Relu_2)"),
        *r.culprits[1:]])
    head, rows = culprit_rows(fused)
    col = head.index("TensorRT layer")
    assert "Conv_0 + PWN(Add_1, Relu_2)" in {row[col] for row in rows}


def test_a_group_without_evidence_or_fixes_shows_no_empty_sections():
    """A group with nothing to show as evidence or fixes (a BatchNorm that fails only under
    per-node rounding) has no empty "Evidence:" line or "Fixes" heading, in Markdown or HTML."""
    from types import SimpleNamespace

    from trtbisect.diagnosis.diagnose import CulpritGroup
    from trtbisect.diagnosis.wording import Fix
    from trtbisect.reports.report import _html_groups, _md_groups
    bare = CulpritGroup(["bn"], "per_node_rounding_only", None, {}, "bn fails only per node",
                        [], None)
    full = dataclasses.replace(bare, evidence={"max_abs": 7.0e4}, fixes=[Fix("fp32", "keep bn")])
    md = "\n".join(_md_groups(SimpleNamespace(culprit_groups=[bare])))
    html = "".join(_html_groups(SimpleNamespace(culprit_groups=[bare])))
    assert "bn fails only per node" in md and "Evidence" not in md and "Fixes" not in md
    assert "bn fails only per node" in html and "Fixes" not in html and "<dl" not in html
    md = "\n".join(_md_groups(SimpleNamespace(culprit_groups=[full])))
    html = "".join(_html_groups(SimpleNamespace(culprit_groups=[full])))
    assert "Evidence: max\\_abs = 7e4" in md and "- keep bn" in md
    assert "<dt>max_abs</dt>" in html and "keep bn</li>" in html
