#!/usr/bin/env python3
"""Peak memory of a run whose samples are one stacked .npz (data/npz.py), against the same
samples as a folder of one .npz each. Writes docs/stack_benchmark.md.

Each run is `trtbisect run` alone in a child process (its peak RSS from os.wait4), on a model
with a planted overflow (so the search judges plans on the samples more than once and the
plan is judged on every sample), the samples past the sample set's memory budget (256 MiB)
read again when needed. The same samples, written three ways: stored (np.savez), deflated
(np.savez_compressed), and as a folder. Ratios inside one run; nothing here is timed.

    python scripts/bench_stack.py                      # writes docs/stack_benchmark.md
    python scripts/bench_stack.py --samples 16 --side 128 --out /tmp/s.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]


def model(path: Path, side: int) -> None:
    """x * 300 * 300 / 1e5: the middle product overflows FP16 (x ~ 1 gives 9e4)."""
    shape = [1, 3, side, side]
    consts = [numpy_helper.from_array(np.array(v, np.float32), n)
              for n, v in (("a", 300.0), ("b", 300.0), ("c", 1e-5))]
    nodes = [helper.make_node("Mul", ["x", "a"], ["p"], name="scale"),
             helper.make_node("Mul", ["p", "b"], ["q"], name="overflow"),
             helper.make_node("Mul", ["q", "c"], ["r"], name="back"),
             helper.make_node("Relu", ["r"], ["y"], name="relu")]
    g = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], consts)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, path)


def write(t: Path, samples: int, side: int) -> None:
    model(t / "m.onnx", side)
    x = np.random.default_rng(0).uniform(0.5, 1.5, (samples, 1, 3, side, side)).astype(np.float32)
    np.savez(t / "stored.npz", x=x)
    np.savez_compressed(t / "deflated.npz", x=x)
    (t / "folder").mkdir()
    for k in range(samples):
        np.savez(t / "folder" / f"{k:05d}.npz", x=x[k])


def peak_rss(cmd: list[str]) -> tuple[int, int]:
    """(exit code, peak RSS in bytes) of `cmd` run alone in a child process. posix_spawn, not
    fork: a forked child's peak RSS would start at this process's own."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        pid = os.posix_spawn(cmd[0], cmd, dict(os.environ), file_actions=[
            (os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)])
    finally:
        os.close(devnull)
    _, status, usage = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024  # kilobytes on Linux


def measure(samples: int, side: int) -> list[tuple[str, int, int]]:
    """(how the samples are given, exit code, peak RSS) of the three runs."""
    trtbisect = [sys.executable, "-m", "trtbisect"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        # written by a child: this process stays small, and every child's peak starts at
        # this one's (the kernel carries it over a spawn and an exec)
        subprocess.run([sys.executable, __file__, "--write", tmp, "--samples", str(samples),
                        "--side", str(side)], check=True)
        for name, inputs in (("one .npz, stored (np.savez)", t / "stored.npz"),
                             ("one .npz, deflated (np.savez_compressed)", t / "deflated.npz"),
                             ("a folder of one .npz each", t / "folder")):
            rc, rss = peak_rss([*trtbisect, "run", str(t / "m.onnx"), "--inputs", str(inputs),
                                "--out", str(t / f"out-{inputs.stem}"), "-q"])
            if rc not in (0, 1):
                raise SystemExit(f"trtbisect run on {name} exited {rc}")
            rows.append((name, rc, rss))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, nargs="+", default=[128, 384])
    ap.add_argument("--side", type=int, default=512, help="each sample is 1x3xSIDExSIDE float32")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "stack_benchmark.md")
    ap.add_argument("--write", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write:
        write(args.write, args.samples[0], args.side)
        return
    mib, sample = 2 ** 20, 3 * args.side * args.side * 4
    base = peak_rss([sys.executable, "-c", "import onnxruntime, trtbisect.cli, trtbisect.pipeline"])[1]
    table = ["| samples | given as | exit | peak RSS | peak RSS / all samples |",
             "|---|---|---|---|---|"]
    for n in args.samples:
        total = n * sample
        table += [f"| {n} ({total / mib:.0f} MiB) | {name} | {rc} | {rss / mib:.0f} MiB | "
                  f"{rss / total:.2f} |" for name, rc, rss in measure(n, args.side)]
    lines = [
        "# Peak memory of a stacked .npz",
        "",
        f"Written by `python scripts/bench_stack.py` on {datetime.date.today()} "
        f"({platform.machine()}, {platform.python_version()}): samples of "
        f"1x3x{args.side}x{args.side} float32 ({sample / mib:.1f} MiB each), a model with one "
        "planted FP16 overflow, `trtbisect run` alone in its process each time. The sample set "
        "holds 256 MiB of samples and as much of FP32 references in memory; the rest is read "
        "again when needed (a stored stack at its offset, a deflated one from its spooled "
        "copy, a folder from its files).",
        "",
        f"Python importing trtbisect and onnxruntime alone peaks at {base / mib:.0f} MiB.",
        "",
        *table,
        "",
        "Before data/npz.py a stacked file was read whole (all of it in memory at once) and a "
        "sample past the budget was read back by reading the file whole again, through a cache "
        "keyed by the model, which cannot be a cache key: a stack larger than the budget failed "
        "with a TypeError when its first sample past the budget was read again.",
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
