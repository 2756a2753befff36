"""`trtbisect run` on every ONNX model the onnx package ships as backend test data (IR 3 to
current, opsets 1 to current: old PyTorch exports, onnx's own light model zoo) that ONNX
Runtime CPU runs in FP32 with a float output, under both semantics: one row per model and
semantics with the exit code and the first line of any error (docs/input_models.md).

    python scripts/sweep_onnx_models.py [--only SUBSTRING ...] [--out DIR]

Each run goes through the command line in this process, fed the model's own test_data_set_0
inputs (random ones where it has none); anything but exit 0/2/3/4/5/7, or a traceback, is a bug.
"""

from __future__ import annotations

import argparse
import glob
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from click.testing import CliRunner
from onnx import numpy_helper

from trtbisect.cli import main as cli_main

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
DOCUMENTED = {0, 2, 3, 4, 5, 7}


def models() -> list[Path]:
    return sorted(Path(p) for p in glob.glob(str(DATA / "*" / "*" / "model.onnx"))) + \
        sorted(Path(p) for p in glob.glob(str(DATA / "light" / "*.onnx")))


def feeds_of(model: Path) -> dict[str, np.ndarray] | None:
    """The model's first test inputs, when ORT runs it with a float output; else None."""
    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        s = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
        feeds = {}
        for i, v in enumerate(s.get_inputs()):
            p = model.parent / "test_data_set_0" / f"input_{i}.pb"
            if p.exists():
                feeds[v.name] = numpy_helper.to_array(onnx.load_tensor(str(p)))
            else:
                shape = [d if isinstance(d, int) else 1 for d in v.shape]
                feeds[v.name] = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        outs = s.run(None, feeds)
    except Exception:  # ORT cannot run it: not this sweep's business
        return None
    return feeds if any(np.asarray(o).dtype.kind == "f" for o in outs) else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    work = Path(args.out or tempfile.mkdtemp(prefix="sweep-"))
    work.mkdir(parents=True, exist_ok=True)
    bad = 0
    rows = 0
    for model in models():
        name = str(model.relative_to(DATA))
        if args.only and not any(o in name for o in args.only):
            continue
        feeds = feeds_of(model)
        if feeds is None:
            continue
        tag = name.replace("/", "_").replace(".onnx", "")
        inputs = work / f"{tag}.npz"
        np.savez(inputs, **feeds)
        for semantics in ("trt", "strict"):  # in this process: a fresh one costs seconds
            done = CliRunner().invoke(cli_main, [
                "-q", "run", str(model), "--inputs", str(inputs), "--out",
                str(work / f"{tag}-{semantics}"), "--semantics", semantics, "--max-evals", "60",
                "--workers", "1"])
            crashed = done.exception is not None and not isinstance(done.exception, SystemExit)
            err = " ".join(done.stderr.split()) if not crashed else "".join(
                traceback.format_exception(done.exception))[-300:].replace("\n", " | ")
            ok = done.exit_code in DOCUMENTED and not crashed
            bad += not ok
            rows += 1
            print(f"{'ok ' if ok else 'BUG'} {done.exit_code} {semantics:6} {name} "
                  f"{err[:160]}", flush=True)
    print(f"{rows} runs, {bad} ending otherwise than with a documented exit code")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
