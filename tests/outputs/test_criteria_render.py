"""Renderings carry the run's criterion: Polygraphy's words where it has them (checked by
running Polygraphy on the demo: its verdict is `trtbisect check`'s, for every statistic and
for cosine and SNR, on files that pass and files that fail), and a comment plus a runnable
`trtbisect check` line where it has not."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.test_cli import invoke
from trtbisect.context import Options
from trtbisect.judge.compare import Tolerance
from trtbisect.judge.flags import criteria_flags, parse_criteria
from trtbisect.outputs import render
from trtbisect.pipeline import check_mixed, run

ROOT = Path(__file__).parents[2]
DEMO, DATA = ROOT / "models" / "demo.onnx", ROOT / "models" / "demo_inputs.npz"

CRITERIA = [  # (flags, rtol, atol)
    (dict(stats=["max"]), 1e-2, 0.0), (dict(stats=["max"]), 1e-3, 0.3),
    (dict(stats=["mean"]), 1e-3, 0.0), (dict(stats=["median"]), 1e-4, 0.0),
    (dict(stats=["quantile"], quantiles=["0.99"]), 1e-2, 0.0),
    (dict(stats=["logits:quantile"], quantiles=["logits:0.5"]), 1e-3, 0.0),
    (dict(stats=["elemwise"]), 1e-2, 0.0), (dict(stats=["elemwise"]), 1e-3, 0.3),
    (dict(metrics=["cosine:0.9999"]), 0, 0), (dict(metrics=["cosine:0.99999"]), 0, 0),
    (dict(metrics=["snr:30"]), 0, 0), (dict(metrics=["logits:snr:70"]), 0, 0),
]


def _polygraphy(argv: list[str], cwd: Path, monkeypatch) -> bool:
    """Polygraphy's own CLI, in this process (its import is the slow part)."""
    import sys

    from polygraphy.tools import main
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["polygraphy", *argv])
    try:
        code = main()
    except SystemExit as exc:
        code = exc.code
    return code == 0


@pytest.fixture(scope="module")
def demo_files(tmp_path_factory):
    """The demo's plan, its emulated file, and two more candidates: all-FP16 (fails every
    criterion here) and the plan minus one node."""
    from trtbisect.backends.ort import emulation_of_mixed
    from trtbisect.graph import Graph
    from trtbisect.judge.mixed import Written, mixed_model
    out = tmp_path_factory.mktemp("demo")
    r = run(DEMO, Options.of(inputs=[str(DATA)]), out / "run")
    files = {"plan": out / "run" / "demo.mixed.onnx"}
    g = Graph.from_path(DEMO)
    for name, plan in (("all_fp16", []), ("partial", r.fp32_nodes[1:])):
        mixed_model(g, plan).save(out / f"{name}.mixed.onnx")
        files[name] = out / f"{name}.mixed.onnx"
    emulated = {}
    for name, path in files.items():
        emulated[name] = out / f"{name}.emulated.onnx"
        Written(*emulation_of_mixed(Graph.from_path(path), fused=True)).save(emulated[name])
    return out, r, files, emulated


def test_polygraphy_judges_as_trtbisect_check_on_the_demo(demo_files, monkeypatch):
    pytest.importorskip("polygraphy")
    out, r, files, emulated = demo_files
    rc = r.render_context
    work = out / "run"
    assert _polygraphy(["run", str(DEMO), "--onnxrt", "--data-loader-script", "data_loader.py",
                        "--save-outputs", str(out / "fp32.json")], work, monkeypatch)
    seen = set()
    for flags, rtol, atol in CRITERIA:
        crit = parse_criteria(**flags)
        tol = Tolerance(rtol, atol)
        ctx = render.RenderContext(criteria=crit, tolerance=tol, outputs=("logits",),
                                   output_bounds=rc.output_bounds)
        words = render.polygraphy_criterion(ctx)
        for name in files:
            ours = check_mixed(files[name], DEMO, Options.of(inputs=[str(DATA)], tolerance=tol,
                                                             criteria=crit)).passed
            theirs = _polygraphy(["run", str(emulated[name]), "--onnxrt", "--data-loader-script",
                                  "data_loader.py", "--load-outputs", str(out / "fp32.json"),
                                  *words], work, monkeypatch)
            assert ours == theirs, (flags, rtol, atol, name, words)
            seen.add(ours)
    assert seen == {True, False}  # the criteria pass some files and fail others


def test_a_run_under_polygraphys_statistics_renders_them(tmp_path, monkeypatch):
    pytest.importorskip("polygraphy")
    r = invoke("-q", "run", DEMO, "--inputs", DATA, "--out", tmp_path / "o",
               "--check-error-stat", "quantile", "--error-quantile", "0.99", "--atol", "1e-3")
    assert r.exit_code == 0, r.output
    script = (tmp_path / "o" / "commands.sh").read_text()
    lines = [ln for ln in script.splitlines() if ln.startswith("polygraphy run")]
    assert all("--check-error-stat logits:quantile --rtol logits:0.01 --atol logits:0.001 "
               "--error-quantile logits:0.99" in ln for ln in lines if "--load-outputs" in ln
               or "--trt" in ln)
    for line in lines[-2:]:  # save the FP32 outputs, check the mixed model: it passes
        assert _polygraphy(shlex.split(line)[1:], tmp_path / "o", monkeypatch), line


@pytest.mark.parametrize("flags, why", [
    (["--metric", "topk:1"], "top-K sets"), (["--metric", "iou:0.5:0.9"], "no IoU"),
    (["--check", "HOOK"], "--check runs Python"),
    (["--check-error-stat", "quantile", "--pass-rate", "0.5", "--samples", "2"],
     "any iteration fails"),
])
def test_what_polygraphy_cannot_express_is_said_and_checked_by_trtbisect(tmp_path, flags, why,
                                                                         monkeypatch):
    hook = tmp_path / "hook.py"
    hook.write_text("def check(fp32, fp16, sample):\n    return True, 1.0\n")
    flags = [str(hook) + ":check" if f == "HOOK" else f for f in flags]
    data = [] if "--samples" in flags else ["--inputs", DATA]
    r = invoke("-q", "run", DEMO, *data, *flags, "--out", tmp_path / "o", "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    refused = plan["renderings"]["refused"]
    assert any(why in w for w in refused["polygraphy_check"]), refused
    assert any(why in w for w in refused["polygraphy"])
    script = (tmp_path / "o" / "commands.sh").read_text()
    assert "Polygraphy cannot express this run's criterion" in script
    (check,) = [ln for ln in plan["renderings"]["polygraphy_check"].splitlines()
                if not ln.startswith("#")]
    argv = shlex.split(check)
    assert argv[:2] == ["trtbisect", "check"]
    for f in flags:
        if f != "--samples" and f != "2":
            assert f in argv  # the same criterion flags (the hook's path absolute)
    monkeypatch.chdir(tmp_path / "o")  # commands.sh runs from the plan's folder
    c = invoke(*argv[1:])
    assert c.exit_code == 0, c.output


def test_criteria_flags_round_trip():
    for flags in ({"stats": ["mean", "a:b:quantile"], "quantiles": ["0.9", "a:b:0.5"]},
                  {"metrics": ["cosine:0.999", "x:topk:5:-1:0.9", "iou:0.3:0.98"],
                   "pass_rate": 0.75}):
        crit = parse_criteria(**flags)
        argv = criteria_flags(crit)
        back = parse_criteria(
            stats=[argv[i + 1] for i, f in enumerate(argv) if f == "--check-error-stat"],
            quantiles=[argv[i + 1] for i, f in enumerate(argv) if f == "--error-quantile"],
            metrics=[argv[i + 1] for i, f in enumerate(argv) if f == "--metric"],
            pass_rate=float(argv[argv.index("--pass-rate") + 1]) if "--pass-rate" in argv
            else 1.0)
        assert back.fingerprint() == crit.fingerprint()
