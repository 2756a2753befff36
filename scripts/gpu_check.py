#!/usr/bin/env python3
"""One prepared GPU run: how close the CPU emulator's FP16 errors are to real kernels.

No run of trtbisect had met a GPU when this was written. A session lent one (about 15
minutes, start-up included) runs this and brings back one small folder:

    bash scripts/gpu_check.sh OUT_DIR            # on the GPU machine (= make gpu)
    python scripts/gpu_check.py --device cpu --out /tmp/gpu_dry   # the plumbing on CPU (CI)

Steps, each in a subprocess with a hard time limit; a step that fails writes why in its row and
the rest go on:

1. **machine**: nvidia-smi (driver, GPU), torch and its CUDA build, onnx2torch, whether
   `tensorrt` imports or installs (`pip install` with a time limit: the machine may have no
   registry), and which version.
2. **fidelity**, per model and output: trtbisect's emulated all-FP16 error and its written
   plan's error (`trtbisect run`, the judge `check` runs), against the error of real CUDA FP16
   kernels: the FP32 model converted to PyTorch (onnx2torch) and run `.half()` on the device,
   and the written mixed ONNX converted the same way (its Casts to float16 make those ops run
   in real FP16 kernels); and a TensorRT FP16 engine of the plan (`trtbisect run --backend
   trt`) where TensorRT imports. Errors are max|d| against the FP32 reference on the same
   device, as trtbisect measures them.
3. **cost**: scripts/check_cost_model.py on the same models (per-unit FP32 premium, estimated
   against measured).

Writes OUT/gpu_check.md (the tables) and OUT/gpu_check.json (every raw number and each step's
log tail): two files, a few kilobytes.

Models: the demo (models/demo.onnx, a CNN + Transformer with a planted LayerNorm overflow), the
test zoo's transformer stack (tests/models/make_models.py `deep_model`, planted attention and
LayerNorm faults) and magika (a real model from PyPI, scripts/fetch_models.py); a GPU machine
without a registry has magika only if `.bench_cache/models/magika.onnx` was fetched here and
carried (docs/tensorrt.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ["model", "output", "emulator all-FP16", "real all-FP16", "emulator plan",
           "real plan", "TensorRT plan", "bound", "notes"]
STEP_LIMIT_S = {"machine": 90, "model": 240, "cost": 120}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.md and gpu_check.json")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cuda: the check; cpu: a dry run of the plumbing (numbers mean nothing)")
    ap.add_argument("--models", default="demo,deep,magika",
                    help="comma-separated: demo, deep (the zoo's transformer), magika")
    ap.add_argument("--budget-s", type=float, default=540,
                    help="stop starting steps after this many seconds in all")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a model's step, in its own process
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(fidelity(args.one, Path(args.work), args.device)))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    began = time.monotonic()
    report: dict = {"device": args.device, "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                  time.gmtime())}
    report["machine"] = step([sys.executable, __file__, "--out", str(out)], "machine",
                             lambda: machine(args.device))
    rows, steps = [], {}
    for name in [m for m in args.models.split(",") if m]:
        if time.monotonic() - began > args.budget_s:
            steps[name] = {"ok": False, "why": "the time budget ran out before this step"}
            continue
        steps[name] = run_step([sys.executable, __file__, "--out", str(out), "--one", name,
                                "--work", str(work), "--device", args.device],
                               STEP_LIMIT_S["model"])
        result = steps[name].get("result") or {}
        for o in result.get("outputs", []):
            rows.append({"model": name, **o, "notes": "; ".join(result.get("notes", []))})
        if not result.get("outputs"):
            rows.append({"model": name, "output": "-", "notes": steps[name].get("why", "")})
        if result.get("model") and time.monotonic() - began < args.budget_s:
            cost_md = work / f"{name}_cost.md"
            steps[f"{name} cost"] = run_step(
                [sys.executable, str(ROOT / "scripts" / "check_cost_model.py"), result["model"],
                 "--inputs", result["inputs"], "--device", args.device, "--reps",
                 "20" if args.device == "cuda" else "2", "--out", str(cost_md)],
                STEP_LIMIT_S["cost"], parse_json=False)
            if cost_md.exists():
                steps[f"{name} cost"]["summary"] = [
                    line for line in cost_md.read_text().splitlines() if line.startswith("- ")]
    report["fidelity"], report["steps"] = rows, steps
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "gpu_check.md").write_text(markdown(report))
    shutil.rmtree(work, ignore_errors=True)  # only the two files come back
    print((out / "gpu_check.md").read_text())
    return 0


def step(cmd, label: str, fn) -> dict:
    """A step run here (it only reads the machine), its failure said, not raised."""
    try:
        return {"ok": True, **fn()}
    except Exception as exc:  # noqa: BLE001 - a row says why, the rest go on
        return {"ok": False, "why": f"{label}: {type(exc).__name__}: {exc}"}


def run_step(cmd: list[str], limit: float, parse_json: bool = True) -> dict:
    """A step in its own process with a hard time limit: its JSON result, or why not."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"ok": False, "why": f"timed out after {limit:g} s"}
    tail = (p.stderr or "").strip().splitlines()[-5:]
    if p.returncode != 0:
        return {"ok": False, "why": (tail[-1] if tail else f"exit {p.returncode}")[:300],
                "log": tail}
    if not parse_json:
        return {"ok": True, "log": tail}
    try:
        return {"ok": True, "result": json.loads(p.stdout.strip().splitlines()[-1])}
    except (ValueError, IndexError):
        return {"ok": False, "why": "the step printed no result", "log": tail}


def machine(device: str) -> dict:
    """What the machine has: driver, GPU, torch and its CUDA, onnx2torch, TensorRT."""
    info: dict = {"python": platform.python_version(), "platform": platform.platform()}
    smi = shutil.which("nvidia-smi")
    if smi:
        q = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        info["nvidia-smi"] = q.stdout.strip() or q.stderr.strip()
    else:
        info["nvidia-smi"] = "not found"
    try:
        import torch
        info["torch"] = torch.__version__
        info["torch cuda"] = f"{torch.version.cuda} (available: {torch.cuda.is_available()})"
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
    except ImportError as exc:
        info["torch"] = f"not importable: {exc}"
    _torchvision_optional()
    info["onnx2torch"] = _version("onnx2torch")
    info["tensorrt"] = tensorrt_status(device)
    return info


def _version(module: str) -> str:
    try:
        m = __import__(module)
        return getattr(m, "__version__", "importable")
    except Exception as exc:  # noqa: BLE001
        return f"not importable: {type(exc).__name__}: {str(exc)[:120]}"


def tensorrt_status(device: str) -> str:
    """`tensorrt`'s version if it imports; else whether pip installs it (time-limited)."""
    have = _version("tensorrt")
    if not have.startswith("not importable") or device != "cuda":
        return have
    try:
        p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "tensorrt-cu12"],
                           capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "not importable; pip install tensorrt-cu12 timed out after 60 s (no registry?)"
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["?"])[-1]
        return f"not importable; pip install tensorrt-cu12 failed: {last[:160]}"
    return _version("tensorrt")


# ---------------------------------------------------------------- one model


def prepare_model(name: str, work: Path) -> tuple[Path, Path]:
    """The model and its sample (.npz), as files."""
    import numpy as np
    import onnx

    work.mkdir(parents=True, exist_ok=True)
    if name == "demo":
        return ROOT / "models" / "demo.onnx", ROOT / "models" / "demo_inputs.npz"
    if name == "deep":
        sys.path.insert(0, str(ROOT))
        from tests.models.make_models import deep_model
        z = deep_model()
        onnx.save(z.model, work / "deep.onnx")
        np.savez(work / "deep.npz", **z.inputs)
        return work / "deep.onnx", work / "deep.npz"
    if name == "magika":
        cache = Path(os.environ.get("TRTBISECT_BENCH_CACHE", ROOT / ".bench_cache"))
        path = cache / "models" / "magika.onnx"
        if not path.exists():
            raise FileNotFoundError(f"{path} is not here: run `python scripts/fetch_models.py "
                                    "magika` where a registry answers and carry .bench_cache")
        rng = np.random.default_rng(0)
        np.savez(work / "magika.npz", bytes=rng.integers(0, 256, (1, 2048)).astype(np.int32))
        return path, work / "magika.npz"
    raise ValueError(f"unknown model {name!r}")


def fidelity(name: str, work: Path, device: str) -> dict:
    """Per output: the emulator's all-FP16 and plan errors, real kernels' and TensorRT's."""
    import numpy as np

    model, inputs = prepare_model(name, work)
    out_dir = work / f"{name}_run"
    notes: list[str] = []
    p = subprocess.run([sys.executable, "-m", "trtbisect.cli", "run", str(model), "--inputs",
                        str(inputs), "--out", str(out_dir), "--json", "--no-resume"],
                       capture_output=True, text=True, cwd=ROOT)
    if p.returncode not in (0, 4, 5, 7, 9):
        raise RuntimeError(f"trtbisect run exit {p.returncode}: "
                           f"{(p.stderr.strip().splitlines() or ['?'])[-1]}")
    run = json.loads(p.stdout)
    notes.append(f"verdict {run['verdict']}, {len(run['fp32_nodes'])} FP32 nodes")
    with np.load(inputs) as d:
        sample = {k: d[k] for k in d.files}
    mixed = out_dir / f"{model.stem}.mixed.onnx"
    real_half, real_plan = {}, {}
    try:
        ref, real_half = real_kernels(model, sample, device, half=True)
        if mixed.exists() and run["fp32_nodes"]:
            _, real_plan = real_kernels(mixed, sample, device, half=False, reference=ref)
    except Exception as exc:  # noqa: BLE001 - the row says why
        notes.append(f"real kernels: {type(exc).__name__}: {str(exc)[:160]}")
    trt = tensorrt_plan(model, inputs, work, device, notes)
    outputs = []
    for o, before in run["errors_before"].items():
        after = run["errors_after"].get(o, {})
        outputs.append({"output": o, "emulator all-FP16": before.get("max_abs"),
                        "real all-FP16": real_half.get(o), "emulator plan": after.get("max_abs")
                        if run["fp32_nodes"] else None, "real plan": real_plan.get(o),
                        "TensorRT plan": trt.get(o), "bound": before.get("bound")})
    return {"outputs": outputs, "notes": notes, "model": str(model), "inputs": str(inputs)}


def real_kernels(model: Path, sample: dict, device: str, half: bool, reference=None):
    """The ONNX file as a PyTorch module (onnx2torch) on `device`: FP32 reference outputs and
    each output's max|d| of the module run in float16 (`half`) or as the file types it (a
    mixed file's Casts)."""
    import numpy as np
    import onnx
    import torch

    _torchvision_optional()
    from onnx2torch import convert

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    module = convert(onnx.load(str(model))).to(device).eval()
    names = [o.name for o in onnx.load(str(model), load_external_data=False).graph.output]
    feeds = [torch.from_numpy(np.asarray(v)).to(device) for v in sample.values()]

    def outputs(m, xs):
        with torch.no_grad():
            got = m(*xs)
        got = got if isinstance(got, (tuple, list)) else [got]
        return {n: g.float().cpu().numpy().astype(np.float64) for n, g in zip(names, got)}
    if reference is None:
        reference = outputs(module, feeds)
    if half:
        xs = [x.half() if x.is_floating_point() else x for x in feeds]
        if device == "cpu" and not _cpu_half_ok(torch):
            return reference, {}
        got = outputs(module.half(), xs)
    else:
        got = outputs(module, feeds)
    return reference, {n: float(np.max(np.abs(got[n] - reference[n]), initial=0.0))
                       for n in got if n in reference}


def _cpu_half_ok(torch) -> bool:
    try:
        torch.nn.functional.conv2d(torch.ones(1, 1, 3, 3).half(), torch.ones(1, 1, 1, 1).half())
        return True
    except RuntimeError:
        return False


def _torchvision_optional() -> None:
    """onnx2torch imports torchvision for two converters (NMS, RoIAlign); where it is absent
    (a CPU dry run) those two fail when used, the rest convert."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        import types
        tv = types.ModuleType("torchvision")
        tv.ops = types.ModuleType("torchvision.ops")  # type: ignore[attr-defined]

        def missing(*a, **k):
            raise ImportError("torchvision is not installed")
        tv.ops.roi_align = tv.ops.nms = missing  # type: ignore[attr-defined]
        sys.modules["torchvision"], sys.modules["torchvision.ops"] = tv, tv.ops


def tensorrt_plan(model: Path, inputs: Path, work: Path, device: str, notes: list) -> dict:
    """The plan verified on TensorRT FP16 engines (`run --backend trt`), where it imports."""
    if device != "cuda":
        notes.append("TensorRT: n/a on cpu")
        return {}
    if _version("tensorrt").startswith("not importable"):
        notes.append("TensorRT: not importable")
        return {}
    out = work / f"{model.stem}_trt"
    p = subprocess.run([sys.executable, "-m", "trtbisect.cli", "run", str(model), "--inputs",
                        str(inputs), "--out", str(out), "--backend", "trt", "--json",
                        "--no-resume"], capture_output=True, text=True, cwd=ROOT, timeout=180)
    try:
        trt = json.loads(p.stdout).get("tensorrt") or {}
    except ValueError:
        notes.append(f"TensorRT: exit {p.returncode}: "
                     f"{(p.stderr.strip().splitlines() or ['?'])[-1][:160]}")
        return {}
    errors = trt.get("errors_after") or trt.get("errors") or {}
    return {o: e.get("max_abs") for o, e in errors.items() if isinstance(e, dict)}


# ---------------------------------------------------------------- the table


def markdown(report: dict) -> str:
    m = report.get("machine", {})
    lines = [f"# GPU check ({report['device']}, {report['date']})", ""]
    if report["device"] != "cuda":
        lines += ["**Dry run on CPU: the plumbing only; the numbers mean nothing.**", ""]
    lines += ["## Machine", "", "| what | value |", "|---|---|"]
    lines += [f"| {k} | {_cell(v)} |" for k, v in m.items()]
    lines += ["", "## Fidelity: max|d| against FP32, per output", "",
              "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in report.get("fidelity", []):
        lines.append("| " + " | ".join(_cell(r.get(c)) for c in COLUMNS) + " |")
    lines += ["", "## Steps", "", "| step | ok | why / summary |", "|---|---|---|"]
    for k, s in report.get("steps", {}).items():
        lines.append(f"| {k} | {'yes' if s.get('ok') else 'no'} | "
                     f"{_cell(s.get('why') or '; '.join(s.get('summary', [])))} |")
    return "\n".join(lines) + "\n"


def _cell(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


if __name__ == "__main__":
    sys.exit(main())
