"""How long ONNX Runtime's CPU provider takes to load a graph in FP32 and in FP16, by size
(docs/search_benchmark.md, "What bounds it from below"): the run must load every file it
writes, and the FP16 load grows with casts x nodes (`InsertCastTransformer` names each Cast it
inserts with `Graph::GenerateNodeName`, which compares the name with every node).

    python scripts/bench_ort_load.py 2500 5000 10000 20000

Each size: the synthetic transformer of scripts/bench_models.py as it is, and its all-FP16
file as the run writes it (`judge.mixed.write_mixed_onnx`, no node in FP32); each loaded once
in a fresh process, as the run proves a written file loads (`judge.loadable.runtime_problem`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx

from trtbisect.judge.mixed import write_mixed_onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import synthetic_transformer  # noqa: E402

LOAD = """
import sys, time
from trtbisect.judge.loadable import runtime_problem
t = time.perf_counter()
problem = runtime_problem(sys.argv[1])
assert problem is None, problem
print(time.perf_counter() - t)
"""


def load_seconds(path: Path) -> float:
    """One load as the run proves a written file loads (`judge/loadable.runtime_problem`),
    in a fresh process."""
    out = subprocess.run([sys.executable, "-c", LOAD, str(path)], check=True,
                         capture_output=True, text=True)
    return float(out.stdout)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizes", type=int, nargs="+", help="node counts")
    args = ap.parse_args(argv)
    print("| nodes | FP32 file | FP16 file |\n|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            model = synthetic_transformer(size).model
            fp32, fp16 = Path(tmp) / f"t{size}.onnx", Path(tmp) / f"h{size}.onnx"
            onnx.save(model, fp32)
            onnx.save(write_mixed_onnx(model, ()), fp16)  # the run's all-FP16 file
            print(f"| {len(model.graph.node):,} | {load_seconds(fp32):.1f} s | "
                  f"{load_seconds(fp16):.1f} s |", flush=True)


if __name__ == "__main__":
    main()
