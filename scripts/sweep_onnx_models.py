"""`trtbisect run` on every ONNX model the onnx package ships as backend test data (IR 3 to
current, opsets 1 to current: old PyTorch exports, onnx's own light model zoo) that ONNX
Runtime CPU runs in FP32 with a float output, under both semantics: one row per model and
semantics with the exit code and the first line of any error (docs/input_models.md).
`--node`: onnx's node tests instead (one model per operator case, made from
`onnx.backend.test.case.node`, which the wheel ships as code, not as files), fed the case's inputs.

    python scripts/sweep_onnx_models.py [--node] [--semantics trt|strict ...]
                                        [--only SUBSTRING ...] [--out DIR]

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
DOCUMENTED = {0, 2, 3, 4, 5, 6, 7, 8, 9}  # every exit code but 1 (a bug)


def models() -> list[Path]:
    return sorted(Path(p) for p in glob.glob(str(DATA / "*" / "*" / "model.onnx"))) + \
        sorted(Path(p) for p in glob.glob(str(DATA / "light" / "*.onnx")))


def node_models(work: Path, only: list[str]) -> list[Path]:
    """Each node test case of the installed onnx as `<work>/node/<case>/model.onnx`, with its
    first data set saved as the test_data_set_0 inputs `feeds_of` reads."""
    import warnings

    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases(None)
    out = []
    for c in cases:
        if only and not any(o in c.name for o in only):
            continue
        d = work / "node" / c.name
        (d / "test_data_set_0").mkdir(parents=True, exist_ok=True)
        onnx.save(c.model, d / "model.onnx")
        ins = c.data_sets[0][0] if c.data_sets else []
        for i, a in enumerate(ins):
            if isinstance(a, np.ndarray):
                onnx.save_tensor(numpy_helper.from_array(a), str(d / "test_data_set_0" /
                                                                 f"input_{i}.pb"))
        out.append(d / "model.onnx")
    return out


VERDICTS = {0, 3, 4, 5, 6, 7, 8, 9}  # exit codes of a verdict (2: a refusal, 1: a bug)


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
    return feeds if any(_floats(o) for o in outs) else None


def _floats(out) -> bool:
    """A float tensor, or a sequence holding one (SplitToSequence, a Loop's scan outputs)."""
    if isinstance(out, (list, tuple)):
        return any(_floats(o) for o in out)
    return isinstance(out, np.ndarray) and out.dtype.kind == "f"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--out", default=None)
    ap.add_argument("--node", action="store_true", help="onnx's node tests")
    ap.add_argument("--semantics", nargs="*", default=["trt", "strict"])
    ap.add_argument("--skip", default=None,
                    help="a previous sweep's output: skip the models it has a row for")
    args = ap.parse_args()
    work = Path(args.out or tempfile.mkdtemp(prefix="sweep-"))
    work.mkdir(parents=True, exist_ok=True)
    bad = 0
    rows = 0
    verdicts = 0
    base = work / "node" if args.node else DATA
    seen = set()
    if args.skip:  # rows read "ok  0 trt    NAME ..."
        seen = {ln.split()[3] for ln in Path(args.skip).read_text().splitlines()
                if ln.startswith(("ok ", "BUG")) and len(ln.split()) > 3}
    for model in (node_models(work, args.only) if args.node else models()):
        name = str(model.relative_to(base))
        if (args.only and not any(o in name for o in args.only)) or name in seen:
            continue
        feeds = feeds_of(model)
        if feeds is None:
            continue
        tag = name.replace("/", "_").replace(".onnx", "")
        inputs = work / f"{tag}.npz"
        np.savez(inputs, **feeds)
        fed = ["--inputs", str(inputs)] if feeds else []  # a model without inputs: none
        for semantics in args.semantics:  # in this process: a fresh one costs seconds
            done = CliRunner().invoke(cli_main, [
                "-q", "run", str(model), *fed, "--out",
                str(work / f"{tag}-{semantics}"), "--semantics", semantics, "--max-evals", "60",
                "--workers", "1"])
            crashed = done.exception is not None and not isinstance(done.exception, SystemExit)
            err = " ".join(done.stderr.split()) if not crashed else "".join(
                traceback.format_exception(done.exception))[-300:].replace("\n", " | ")
            ok = done.exit_code in DOCUMENTED and not crashed
            bad += not ok
            rows += 1
            verdicts += ok and done.exit_code in VERDICTS
            print(f"{'ok ' if ok else 'BUG'} {done.exit_code} {semantics:6} {name} "
                  f"{err[:160]}", flush=True)
    print(f"{rows} runs, {verdicts} with a verdict, {bad} ending otherwise than with a "
          "documented exit code")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
