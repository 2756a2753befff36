"""The prepared GPU run (scripts/gpu_check.py) dry-runs on CPU: its steps, its table's columns
and the two files it leaves, so it cannot rot before a GPU is lent."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def dry_run(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--device",
                           "cpu", "--out", str(out), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_the_dry_run_writes_the_table_and_the_raw_numbers(tmp_path):
    out = tmp_path / "gpu"
    p = dry_run(out, "--models", "demo,nosuch")
    assert p.returncode == 0, p.stderr
    assert sorted(f.name for f in out.iterdir()) == ["gpu_check.json", "gpu_check.md"]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["device"] == "cpu" and report["machine"]["ok"]
    assert {"torch", "tensorrt", "onnx2torch", "nvidia-smi", "onnxruntime"} <= set(
        report["machine"])
    (demo,) = [r for r in report["fidelity"] if r["model"] == "demo"]
    assert demo["output"] == "logits" and demo["emulator all-FP16"] > demo["bound"]
    assert demo["emulator plan"] < demo["bound"]  # the run's plan, judged as `check` does
    if demo["real via"] == "torch source":  # make_demo's DemoNet, checked against the file
        # the planted LayerNorm overflow is no artefact of the emulator: real FP16 kernels
        # (torch's CPU ones in a dry run) overflow there too
        assert demo["real all-FP16"] > demo["bound"]
    else:
        assert demo["real via"] == "n/a" and "real kernels:" in demo["notes"]
    if demo["real plan"] is not None:  # onnx2torch imports: the written file's own Casts
        assert demo["real plan"] < demo["bound"]
    assert demo["TensorRT all-FP16"] is None and demo["TensorRT plan"] is None
    assert "TensorRT: n/a on cpu" in demo["notes"]
    # a step that fails says why in its row and the rest go on
    assert report["steps"]["nosuch"]["ok"] is False
    assert "unknown model" in report["steps"]["nosuch"]["why"]
    (nosuch,) = [r for r in report["fidelity"] if r["model"] == "nosuch"]
    assert "unknown model" in nosuch["notes"]
    assert report["steps"]["demo cost"]["ok"]
    md = (out / "gpu_check.md").read_text()
    from scripts.gpu_check import COLUMNS
    assert "| " + " | ".join(COLUMNS) + " |" in md and "Dry run on CPU" in md
    assert md.count("\n| demo | logits |") == 1


def test_no_step_starts_past_the_budget(tmp_path):
    p = dry_run(tmp_path, "--models", "demo,deep", "--budget-s", "0")
    assert p.returncode == 0, p.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [r["model"] for r in report["fidelity"]] == ["demo", "deep"]
    assert all("budget ran out" in r["notes"] for r in report["fidelity"])


def test_a_step_past_its_limit_is_killed_and_said():
    from scripts.gpu_check import run_step
    got = run_step([sys.executable, "-c", "import time; time.sleep(30)"], 1)
    assert got == {"ok": False, "why": "timed out after 1 s"}
    got = run_step([sys.executable, "-c", "import sys; sys.exit('no GPU here')"], 30)
    assert got["ok"] is False and got["why"] == "no GPU here"


def test_a_killed_step_takes_its_children_with_it(tmp_path):
    """A step's `trtbisect run` or engine build must not eat the next step's time."""
    from scripts.gpu_check import run_step
    pid_file = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(60)'], stdout=subprocess.DEVNULL, "
            "stderr=subprocess.DEVNULL); open(sys.argv[1], 'w').write(str(c.pid)); "
            "time.sleep(60)")
    got = run_step([sys.executable, "-c", code, str(pid_file)], 5)
    assert got["why"] == "timed out after 5 s"
    status = Path(f"/proc/{pid_file.read_text()}/status")
    for _ in range(50):  # SIGKILL is delivered at once; its reaping may lag a moment
        if not status.exists() or "\nState:\tZ" in status.read_text():
            break
        time.sleep(0.1)
    assert not status.exists() or "\nState:\tZ" in status.read_text()


def test_the_tensorrt_step_reads_engines_all_fp16_and_with_the_plan(monkeypatch, tmp_path):
    """The TensorRT step on the fake 10.13 bindings (tests/fixtures/trt): the all-FP16 engine
    overflows in the demo's planted LayerNorm, the engine with that LayerNorm in FP32 does not."""
    from scripts import gpu_check
    from tests.fixtures.trt import fake_tensorrt as fake
    fake.install(monkeypatch)
    plan = [f"/blocks.1/ln2/{n}" for n in ("Pow", "ReduceMean_1", "Add", "Sqrt", "Div", "Mul",
                                            "Add_1")]
    (tmp_path / "demo_plan.json").write_text(json.dumps({
        "model": str(ROOT / "models" / "demo.onnx"),
        "inputs": str(ROOT / "models" / "demo_inputs.npz"), "fp32_nodes": plan}))
    got = gpu_check.tensorrt_errors("demo", tmp_path, "cuda")
    logits = got["outputs"]["logits"]
    assert logits["all-FP16"] > 100 and logits["plan"] < 1  # the bound is ~12
    assert got["notes"][0].startswith("TensorRT 10.13") and "engines built" in got["notes"][0]
    assert gpu_check.tensorrt_errors("demo", tmp_path, "cpu")["outputs"] == {}
