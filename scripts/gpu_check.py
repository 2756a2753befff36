#!/usr/bin/env python3
"""One prepared GPU run: how close the CPU emulator's FP16 errors are to real kernels.

No run of trtbisect had met a GPU when this was written. A session lent one (about 15
minutes, start-up included) runs this and brings back one small folder:

    bash scripts/gpu_check.sh OUT_DIR            # on the GPU machine (= make gpu)
    python scripts/gpu_check.py --device cpu --out /tmp/gpu_dry   # the plumbing on CPU (CI)

Steps, each in its own process group with a hard time limit; a step that fails writes why in
its row and the rest go on; no step starts after --budget-s:

1. **machine**: nvidia-smi (GPU, driver, the driver's CUDA), nvcc, torch and its CUDA build,
   onnx, onnxruntime and its providers, onnx2torch, and whether `tensorrt` imports or
   installs (`pip install tensorrt-cu12`/`-cu13` by torch's CUDA major, time-limited: the
   machine may have no registry), and which version.
2. **fidelity**, per model and output, each a max|d| against FP32 on the same sample:
   trtbisect's emulated all-FP16 error and its written plan's (`trtbisect run --json`, judged
   as `check` judges the file); real FP16 kernels in PyTorch on the device (from the model's
   PyTorch source where there is one, else the ONNX file converted by onnx2torch), all-FP16
   and the written mixed ONNX as its Casts type it; and TensorRT FP16 engines, all-FP16 and
   with the plan in FP32 (trtbisect/backends/trt.py), where `tensorrt` imports.
3. **cost**: scripts/check_cost_model.py on the same models (per-unit FP32 premium, estimated
   against measured, and the run's plans ranked both ways).

Writes OUT/gpu_check.md (the tables) and OUT/gpu_check.json (every raw number and each step's
outcome): two files, a few kilobytes, rewritten after every model.

Models (--models): demo (models/demo.onnx, a CNN + Transformer with a planted LayerNorm
overflow), cnn_transformer (the same network without the fault, built from
scripts/make_demo.py), magika (a real model from PyPI, scripts/fetch_models.py) and deep (the
test zoo's transformer stack, tests/models/make_models.py). A GPU machine without a registry
has magika only if `.bench_cache/models/magika.onnx` was fetched here (`make gpu-wheels`) and
carried, and onnx2torch only from the carried `.whl/` (docs/tensorrt.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # scripts., tests., trtbisect

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ["model", "output", "emulator all-FP16", "real all-FP16", "TensorRT all-FP16",
           "emulator plan", "real plan", "TensorRT plan", "bound", "real via", "notes"]
MODELS = ("demo", "cnn_transformer", "magika", "deep")  # in this order: the budget may stop
STEP_LIMIT_S = {"model": 150, "trt": 150, "cost": 60, "pip": 150}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.md and gpu_check.json")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cuda: the check; cpu: a dry run of the plumbing (numbers mean nothing)")
    ap.add_argument("--models", default=",".join(MODELS),
                    help="comma-separated, of: " + ", ".join(MODELS))
    ap.add_argument("--budget-s", type=float, default=540,
                    help="stop starting steps after this many seconds in all")
    ap.add_argument("--no-install", action="store_true",
                    help="do not try `pip install tensorrt-cuXX` when tensorrt does not import")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a model's step, in its own process
    ap.add_argument("--trt", action="store_true", help=argparse.SUPPRESS)  # its TensorRT step
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        fn = tensorrt_errors if args.trt else fidelity
        print(json.dumps(fn(args.one, Path(args.work), args.device)))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu_check_"))  # runs, engines: never in OUT
    began = time.monotonic()

    def left() -> float:
        return args.budget_s - (time.monotonic() - began)
    report: dict = {"device": args.device, "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                  time.gmtime())}
    report["machine"] = step("machine", lambda: machine(args.device, not args.no_install))
    print(json.dumps(report["machine"], indent=1), flush=True)
    rows, steps = [], {}
    for name in [m for m in args.models.split(",") if m]:
        if left() <= 0:
            steps[name] = {"ok": False, "why": "the time budget ran out before this step"}
            rows.append({"model": name, "output": "-", "notes": steps[name]["why"]})
            continue
        base = [sys.executable, __file__, "--out", str(out), "--one", name, "--work", str(work),
                "--device", args.device]
        steps[name] = run_step(base, min(STEP_LIMIT_S["model"], max(left(), 1)))
        result = steps[name].get("result") or {}
        trt: dict = {}
        if result.get("outputs") and args.device == "cuda" and left() > 0:
            steps[f"{name} TensorRT"] = run_step(base + ["--trt"],
                                                 min(STEP_LIMIT_S["trt"], max(left(), 1)))
            trt = steps[f"{name} TensorRT"].get("result") or {}
            if not steps[f"{name} TensorRT"]["ok"]:
                trt = {"notes": [f"TensorRT: {steps[f'{name} TensorRT']['why']}"]}
        elif result.get("outputs"):
            trt = {"notes": ["TensorRT: n/a on cpu"]}
        notes = "; ".join(result.get("notes", []) + trt.get("notes", []))
        for o in result.get("outputs", []):
            got = trt.get("outputs", {}).get(o["output"], {})
            rows.append({"model": name, **o, "TensorRT all-FP16": got.get("all-FP16"),
                         "TensorRT plan": got.get("plan"), "notes": notes})
        if not result.get("outputs"):
            rows.append({"model": name, "output": "-", "notes": steps[name].get("why", "")})
        if result.get("model") and left() > 0:
            steps[f"{name} cost"] = cost_step(name, result, work, args.device,
                                              min(STEP_LIMIT_S["cost"], max(left(), 1)))
        save(out, report, rows, steps, began)  # a run killed later still brings these back
    save(out, report, rows, steps, began)
    shutil.rmtree(work, ignore_errors=True)
    print((out / "gpu_check.md").read_text())
    return 0


def save(out: Path, report: dict, rows: list, steps: dict, began: float) -> None:
    report["fidelity"], report["steps"] = rows, steps
    report["seconds"] = round(time.monotonic() - began, 1)
    write_text(out / "gpu_check.json", json.dumps(report, indent=1, default=str))
    write_text(out / "gpu_check.md", markdown(report))


def write_text(path: Path, text: str) -> None:
    """Atomically: a killed run leaves the old file or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def step(label: str, fn) -> dict:
    """A step run here (it only reads the machine), its failure said, not raised."""
    try:
        return {"ok": True, **fn()}
    except Exception as exc:  # noqa: BLE001 - a row says why, the rest go on
        return {"ok": False, "why": f"{label}: {type(exc).__name__}: {exc}"}


def run_step(cmd: list[str], limit: float, parse_json: bool = True) -> dict:
    """A step in its own process with a hard time limit: its JSON result, or why not."""
    began = time.monotonic()
    # its own process group: a step killed at its limit takes its children (trtbisect run,
    # engine builds) with it, so none goes on eating the next step's time
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=ROOT, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return {"ok": False, "why": f"timed out after {limit:.0f} s"}
    tail = (stderr or "").strip().splitlines()[-5:]
    seconds = round(time.monotonic() - began, 1)
    if p.returncode != 0:
        return {"ok": False, "why": (tail[-1] if tail else f"exit {p.returncode}")[:300],
                "log": tail, "seconds": seconds}
    if not parse_json:
        return {"ok": True, "log": tail, "seconds": seconds}
    try:
        return {"ok": True, "result": json.loads(stdout.strip().splitlines()[-1]),
                "seconds": seconds}
    except (ValueError, IndexError):
        return {"ok": False, "why": "the step printed no result", "log": tail}


def cost_step(name: str, result: dict, work: Path, device: str, limit: float) -> dict:
    """scripts/check_cost_model.py on the model: estimated against measured FP32 premiums."""
    cost_md = work / f"{name}_cost.md"
    cmd = [sys.executable, str(ROOT / "scripts" / "check_cost_model.py"), result["model"],
           "--inputs", result["inputs"], "--device", device, "--reps",
           "20" if device == "cuda" else "2", "--out", str(cost_md)]
    if device == "cuda":
        cmd += ["--gpu", "h100"]  # the cost model's Hopper class (an H200 computes as one)
    if result.get("trace") and Path(result["trace"]).exists():
        cmd += ["--trace", result["trace"]]
    got = run_step(cmd, limit, parse_json=False)
    if cost_md.exists():
        got["summary"] = [line for line in cost_md.read_text().splitlines()
                          if line.startswith("- ")]
    return got


def machine(device: str, install: bool) -> dict:
    """What the machine has: driver, GPU, CUDA, torch and its CUDA, onnx2torch, TensorRT."""
    info: dict = {"python": platform.python_version(), "platform": platform.platform()}
    smi = shutil.which("nvidia-smi")
    if smi:
        q = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        info["nvidia-smi"] = q.stdout.strip() or q.stderr.strip()
        q = subprocess.run([smi], capture_output=True, text=True, timeout=30)
        cuda = [ln for ln in q.stdout.splitlines() if "CUDA Version" in ln]
        info["driver's CUDA"] = cuda[0].split("CUDA Version:")[-1].strip(" |") if cuda else "?"
    else:
        info["nvidia-smi"] = "not found"
    nvcc = shutil.which("nvcc")
    if nvcc:
        q = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30)
        info["nvcc"] = (q.stdout.strip().splitlines() or ["?"])[-1]
    try:
        import torch
        info["torch"] = torch.__version__
        info["torch cuda"] = f"{torch.version.cuda} (available: {torch.cuda.is_available()})"
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
    except ImportError as exc:
        info["torch"] = f"not importable: {exc}"
    _torchvision_optional()
    for module in ("onnx", "onnxruntime", "onnx2torch"):
        info[module] = _version(module)
    try:
        import onnxruntime
        info["onnxruntime providers"] = ", ".join(onnxruntime.get_available_providers())
    except ImportError:
        pass
    info["tensorrt"] = tensorrt_status(device, install, info.get("torch cuda", ""))
    return info


def _version(module: str) -> str:
    try:
        m = __import__(module)
    except Exception as exc:  # noqa: BLE001
        return f"not importable: {type(exc).__name__}: {str(exc)[:120]}"
    try:
        from importlib.metadata import version
        return getattr(m, "__version__", None) or version(module)
    except Exception:  # noqa: BLE001 - imports, no version said
        return "importable"


def tensorrt_status(device: str, install: bool, torch_cuda: str) -> str:
    """`tensorrt`'s version if it imports; else whether pip installs it (time-limited: the
    machine may have no registry). The wheel follows torch's CUDA major (tensorrt-cu12 or
    -cu13), unpinned: trtbisect reads 10.x and 11.x (trtbisect/backends/trt_surface/)."""
    have = _version("tensorrt")
    if not have.startswith("not importable") or device != "cuda" or not install:
        return have
    major = torch_cuda.split(".")[0] if torch_cuda[:1].isdigit() else "12"
    wheel = f"tensorrt-cu{major if major in ('12', '13') else '12'}"
    limit = STEP_LIMIT_S["pip"]
    try:
        p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--retries", "0",
                            "--timeout", "15", wheel], capture_output=True, text=True,
                           timeout=limit)
    except subprocess.TimeoutExpired:
        return f"not importable; pip install {wheel} timed out after {limit} s"
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["?"])[-1]
        return f"not importable; pip install {wheel} failed: {last[:160]}"
    got = subprocess.run([sys.executable, "-c", "import tensorrt; print(tensorrt.__version__)"],
                         capture_output=True, text=True, timeout=60)
    return (f"{got.stdout.strip()} (installed now: {wheel})" if got.returncode == 0 else
            f"pip installed {wheel} but it does not import: "
            f"{(got.stderr.strip().splitlines() or ['?'])[-1][:160]}")


# ---------------------------------------------------------------- one model


def prepare_model(name: str, work: Path) -> tuple[Path, Path]:
    """The model and its sample (.npz), as files."""
    import numpy as np
    import onnx

    work.mkdir(parents=True, exist_ok=True)
    if name == "demo":
        return ROOT / "models" / "demo.onnx", ROOT / "models" / "demo_inputs.npz"
    if name == "cnn_transformer":
        import torch

        from scripts.make_demo import export
        net, image = cnn_transformer()
        with torch.no_grad():
            onnx.save(export(net, torch.from_numpy(image)), work / "cnn_transformer.onnx")
        np.savez(work / "cnn_transformer.npz", image=image)
        return work / "cnn_transformer.onnx", work / "cnn_transformer.npz"
    if name == "deep":
        from tests.models.make_models import deep_model
        z = deep_model()
        onnx.save(z.model, work / "deep.onnx")
        np.savez(work / "deep.npz", **z.inputs)
        return work / "deep.onnx", work / "deep.npz"
    if name == "magika":
        cache = Path(os.environ.get("TRTBISECT_BENCH_CACHE", ROOT / ".bench_cache"))
        path = cache / "models" / "magika.onnx"
        if not path.exists():
            raise FileNotFoundError(f"{path} is not here (no registry on this machine?): run "
                                    "`make gpu-wheels` where one answers and carry .bench_cache")
        rng = np.random.default_rng(0)
        np.savez(work / "magika.npz", bytes=rng.integers(0, 256, (1, 2048)).astype(np.int32))
        return path, work / "magika.npz"
    raise ValueError(f"unknown model {name!r}")


def cnn_transformer():
    """The demo's CNN + Transformer without its planted fault (both LayerScales ~1), other
    weights (seed 1): the emulator's all-FP16 rounding against real kernels', no overflow."""
    import numpy as np
    import torch

    from scripts.make_demo import OVERFLOW_SCALE, DemoNet
    torch.manual_seed(1)
    net = DemoNet().eval()
    with torch.no_grad():
        for ls in (net.blocks[1].ls1, net.blocks[1].ls2):
            ls.gamma /= OVERFLOW_SCALE
    image = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
    return net, image


def torch_source(name: str):
    """The PyTorch module the model was exported from (None: an ONNX-only model)."""
    if name == "demo":
        import torch

        from scripts.make_demo import DemoNet
        torch.manual_seed(0)  # as scripts/make_demo.py builds it
        return DemoNet().eval()
    if name == "cnn_transformer":
        return cnn_transformer()[0]
    return None


def fidelity(name: str, work: Path, device: str) -> dict:
    """Per output: the emulator's all-FP16 and plan errors, and real kernels'."""
    import numpy as np

    model, inputs = prepare_model(name, work)
    out_dir = work / f"{name}_run"
    notes: list[str] = []
    p = subprocess.run([sys.executable, "-m", "trtbisect.cli", "run", str(model), "--inputs",
                        str(inputs), "--out", str(out_dir), "--json", "--no-resume"],
                       capture_output=True, text=True, cwd=ROOT)
    try:  # every verdict's exit code prints the same JSON; an error prints none
        run = json.loads(p.stdout)
        run["errors_before"], run["errors_after"], run["fp32_nodes"]  # noqa: B018
    except (ValueError, KeyError):
        raise RuntimeError(f"trtbisect run exit {p.returncode}: "
                           f"{(p.stderr.strip().splitlines() or ['?'])[-1]}") from None
    notes.append(f"verdict {run['verdict']}, {len(run['fp32_nodes'])} FP32 nodes")
    write_text(work / f"{name}_plan.json", json.dumps({"model": str(model), "inputs": str(inputs),
                                                       "fp32_nodes": run["fp32_nodes"]}))
    with np.load(inputs) as d:
        sample = {k: d[k] for k in d.files}
    mixed = out_dir / f"{model.stem}.mixed.onnx"
    real_half, real_plan, via = real_all_fp16(name, model, sample, device, notes)
    if mixed.exists() and run["fp32_nodes"]:
        try:
            ref = onnx2torch_outputs(model, sample, device)
            got = onnx2torch_outputs(mixed, sample, device)
            real_plan = max_abs(got, ref)
        except Exception as exc:  # noqa: BLE001 - the row says why
            notes.append(f"real plan: {type(exc).__name__}: {str(exc)[:160]}")
    outputs = []
    for o, before in run["errors_before"].items():
        after = run["errors_after"].get(o, {})
        outputs.append({"output": o, "emulator all-FP16": before.get("max_abs"),
                        "real all-FP16": real_half.get(o), "emulator plan": after.get("max_abs")
                        if run["fp32_nodes"] else None, "real plan": real_plan.get(o),
                        "bound": before.get("bound"), "real via": via})
    trace = out_dir / "trace.json"
    return {"outputs": outputs, "notes": notes, "model": str(model), "inputs": str(inputs),
            "trace": str(trace) if trace.exists() else None}


def real_all_fp16(name: str, model: Path, sample: dict, device: str,
                  notes: list) -> tuple[dict, dict, str]:
    """Each output's max|d| of the model run in float16 on real kernels against its FP32
    run on the same device: from its PyTorch source where there is one (checked to agree
    with the ONNX file in FP32), else converted from ONNX by onnx2torch."""
    import torch
    if device == "cpu" and not _cpu_half_ok(torch):
        notes.append("real kernels: this torch has no CPU float16 conv")
        return {}, {}, "n/a"
    try:
        net = torch_source(name)
        if net is not None:
            names = output_names(model)
            ref = module_outputs(net, sample, device, names, half=False)
            onnx_ref = emulator_fp32(model, sample)
            drift = max(max_abs(ref, onnx_ref).values(), default=0.0)
            scale = max(float(np.max(np.abs(v), initial=1.0)) for v in onnx_ref.values())
            if drift <= 1e-3 * scale:
                got = module_outputs(net, sample, device, names, half=True)
                return max_abs(got, ref), {}, "torch source"
            notes.append(f"torch source differs from the ONNX file in FP32 ({drift:.3g}): "
                         "onnx2torch instead")
    except Exception as exc:  # noqa: BLE001 - fall back to onnx2torch, say why
        notes.append(f"torch source: {type(exc).__name__}: {str(exc)[:120]}")
    try:
        ref = onnx2torch_outputs(model, sample, device)
        got = onnx2torch_outputs(model, sample, device, half=True)
        return max_abs(got, ref), {}, "onnx2torch"
    except Exception as exc:  # noqa: BLE001 - the row says why
        notes.append(f"real kernels: {type(exc).__name__}: {str(exc)[:160]}")
        return {}, {}, "n/a"


def max_abs(got: dict, ref: dict) -> dict:
    return {n: float(np.max(np.abs(np.asarray(got[n], np.float64) - ref[n]), initial=0.0))
            for n in got if n in ref}


def output_names(model: Path) -> list[str]:
    import onnx
    return [o.name for o in onnx.load(str(model), load_external_data=False).graph.output]


def emulator_fp32(model: Path, sample: dict) -> dict:
    """The ONNX file's FP32 outputs on ONNX Runtime's CPU provider (what trtbisect reads)."""
    import onnxruntime as ort
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    outs = sess.run(None, sample)
    return {o.name: np.asarray(v, np.float64) for o, v in zip(sess.get_outputs(), outs)}


def module_outputs(net, sample: dict, device: str, names: list[str], half: bool) -> dict:
    """A PyTorch module's outputs on `device`, as its parameters are typed or all float16
    (`half`); TF32 off."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False  # FP32 accumulation
    net = net.to(device).eval()
    feeds = [torch.from_numpy(np.asarray(v)).to(device) for v in sample.values()]
    if half:
        net = net.half()
        feeds = [x.half() if x.is_floating_point() else x for x in feeds]
        for sub in list(net.modules())[1:]:  # a Cast to float inside still computes in FP16
            sub.register_forward_pre_hook(_to_half)
    with torch.no_grad():
        got = net(*feeds)
    got = got if isinstance(got, (tuple, list)) else [got]
    return {n: g.float().cpu().numpy().astype(np.float64) for n, g in zip(names, got)}


def _to_half(module, args):
    import torch
    return tuple(a.half() if isinstance(a, torch.Tensor) and a.dtype == torch.float32 else a
                 for a in args)


def onnx2torch_outputs(model: Path, sample: dict, device: str, half: bool = False) -> dict:
    """The ONNX file as a PyTorch module (onnx2torch): FP32 as written (a mixed file's Casts
    keep their types), or `half` (every float parameter and input float16)."""
    import onnx
    _torchvision_optional()
    from onnx2torch import convert
    _onnx2torch_extras()
    net = convert(onnx.load(str(model)))
    return module_outputs(net, sample, device, output_names(model), half=half)


def _onnx2torch_extras() -> None:
    """Converters onnx2torch 1.5 lacks and a model here needs (magika's GlobalMaxPool)."""
    import torch
    from onnx2torch.node_converters.registry import add_converter
    from onnx2torch.utils.common import OperationConverterResult, onnx_mapping_from_node

    class GlobalMaxPool(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.amax(x, dim=tuple(range(2, x.dim())), keepdim=True)

    def convert(node, graph):
        return OperationConverterResult(torch_module=GlobalMaxPool(),
                                        onnx_mapping=onnx_mapping_from_node(node=node))
    try:
        add_converter(operation_type="GlobalMaxPool", version=1)(convert)
    except ValueError:  # registered already (a second call in this process)
        pass


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


def tensorrt_errors(name: str, work: Path, device: str) -> dict:
    """TensorRT FP16 engines (trtbisect/backends/trt.py) of the model: all-FP16 and the
    emulator's written plan, each output's max|d| against the FP32 engine on the same sample."""
    if device != "cuda":
        return {"outputs": {}, "notes": ["TensorRT: n/a on cpu"]}
    plan = json.loads((work / f"{name}_plan.json").read_text())
    from trtbisect.backends.trt import TrtBackend
    backend = TrtBackend(plan["model"], cache_dir=work / "trt_cache")
    with np.load(plan["inputs"]) as d:
        sample = {k: d[k] for k in d.files}
    try:
        ref = backend.reference(sample)
        all16 = max_abs(backend.run(frozenset(), sample), ref)
        planned = (max_abs(backend.run(frozenset(plan["fp32_nodes"]), sample), ref)
                   if plan["fp32_nodes"] else {})
    finally:
        backend.close()
    return {"outputs": {o: {"all-FP16": all16.get(o), "plan": planned.get(o)} for o in all16},
            "notes": [f"TensorRT {backend.trt_version}, {backend.builds} engines built"]}


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
    lines += ["", f"## Steps ({report.get('seconds')} s in all)", "",
              "| step | ok | seconds | why / summary |", "|---|---|---|---|"]
    for k, s in report.get("steps", {}).items():
        lines.append(f"| {k} | {'yes' if s.get('ok') else 'no'} | {_cell(s.get('seconds'))} | "
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
