"""The prepared GPU run (scripts/gpu_check.py) dry-runs on CPU: its steps, its table's columns
and the two files it leaves, so it cannot rot before a GPU is lent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_dry_run_writes_the_table_and_the_raw_numbers(tmp_path):
    out = tmp_path / "gpu"
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--device", "cpu",
                        "--models", "demo,nosuch", "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr
    assert sorted(f.name for f in out.iterdir()) == ["gpu_check.json", "gpu_check.md"]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["device"] == "cpu" and report["machine"]["ok"]
    assert {"torch", "tensorrt", "onnx2torch", "nvidia-smi"} <= set(report["machine"])
    (demo,) = [r for r in report["fidelity"] if r["model"] == "demo"]
    assert demo["output"] == "logits" and demo["emulator all-FP16"] > demo["bound"]
    assert demo["emulator plan"] < demo["bound"]  # the run's plan, judged as `check` does
    assert "TensorRT: n/a on cpu" in demo["notes"]
    # a step that fails says why in its row and the rest go on
    assert report["steps"]["nosuch"]["ok"] is False
    assert "unknown model" in report["steps"]["nosuch"]["why"]
    assert report["steps"]["demo cost"]["ok"]
    md = (out / "gpu_check.md").read_text()
    from scripts.gpu_check import COLUMNS
    assert "| " + " | ".join(COLUMNS) + " |" in md and "Dry run on CPU" in md
