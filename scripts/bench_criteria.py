"""Benchmark: the plan a deployment engineer's criterion gives, against the default
max-error plan (issue #27). Writes the table docs/criteria.md shows.

For each case, `trtbisect run` on a folder of samples (`--inputs FOLDER`) under each
criterion: verdict, FP32 nodes, their share of the model's MatMul/Gemm/Conv FLOPs (from the
shapes of one FP32 inference, scripts/bench.py `node_flops`), evaluations, inferences, wall
time, and on how many samples the written plan passes.

- ppocr_det: PP-OCRv4 det (rapidocr-onnxruntime 1.4.4) as shipped, its 342 `Constant` nodes
  weights under the default TensorRT semantics (issue #20); 8 synthetic
  320x320 images of printed words (PIL), normalized as PaddleOCR's DB preprocessing does.
- minilm_l3: paraphrase-MiniLM-L3-v2, 8 samples of 64 random token ids.
- magika: the magika 1.0.3 content-type classifier, 8 (and 200) samples of real files' bytes
  (this Python's own library files: source, bytecode, shared objects, data), first and last
  1024 bytes, padded with 256.

    python scripts/fetch_models.py ppocr_det minilm_l3 magika
    python scripts/bench_criteria.py [--only magika] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench import node_flops  # noqa: E402
from fetch_models import MODELS, fetch  # noqa: E402

from trtbisect import __version__  # noqa: E402
from trtbisect.context import Options  # noqa: E402
from trtbisect.judge.compare import Tolerance  # noqa: E402
from trtbisect.judge.flags import parse_criteria  # noqa: E402
from trtbisect.pipeline import run  # noqa: E402

MAX_EVALUATIONS = 600


WORDS = ("invoice total amount date receipt paid cash card tax number order item price qty "
         "customer address phone store thank you change subtotal discount").split()
MEAN, STD = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)


def text_image(seed: int, size: int = 320) -> dict[str, np.ndarray]:
    from PIL import Image, ImageDraw, ImageFont
    rng = np.random.default_rng(seed)
    img = Image.new("RGB", (size, size), tuple(int(v) for v in rng.integers(190, 256, 3)))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(4, 10))):
        font = ImageFont.load_default(size=int(rng.integers(12, 36)))
        words = " ".join(rng.choice(WORDS, int(rng.integers(1, 4))))
        draw.text((int(rng.integers(0, size - 120)), int(rng.integers(0, size - 30))), words,
                  fill=tuple(int(v) for v in rng.integers(0, 100, 3)), font=font)
    x = np.asarray(img, np.float32) / 255.0 + rng.normal(0, 0.02, (size, size, 3)).astype(np.float32)
    x = (x - MEAN) / STD
    return {"x": np.ascontiguousarray(x.transpose(2, 0, 1)[None]).astype(np.float32)}


def token_ids(seed: int) -> dict[str, np.ndarray]:
    return MODELS["minilm_l3"].make_inputs(seed)


def _library_files() -> list[Path]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in lib.rglob("*") if p.is_file() and p.stat().st_size > 64
                   and "test" not in p.parts)
    return files


def file_bytes(path: Path) -> dict[str, np.ndarray]:
    data = path.read_bytes()
    beg = np.full(1024, 256, np.int32)
    end = np.full(1024, 256, np.int32)
    head, tail = np.frombuffer(data[:1024], np.uint8), np.frombuffer(data[-1024:], np.uint8)
    beg[:len(head)] = head
    end[1024 - len(tail):] = tail
    return {"bytes": np.concatenate([beg, end])[None]}


def magika_samples(n: int) -> list[dict[str, np.ndarray]]:
    files = _library_files()
    rng = np.random.default_rng(0)
    return [file_bytes(files[k]) for k in sorted(rng.choice(len(files), n, replace=False))]


def write_folder(folder: Path, samples: list[dict[str, np.ndarray]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for k, s in enumerate(samples):
        np.savez(folder / f"s{k:04d}.npz", **s)
    return folder


CASES = {
    "ppocr_det": (lambda n: [text_image(k) for k in range(n)], 8,
                  [("max error (default)", {}), ("quantile 0.99", dict(
                      stats=["quantile"], quantiles=["0.99"])),
                   ("quantile 0.99, --atol 1e-3", dict(
                       stats=["quantile"], quantiles=["0.99"], atol=1e-3)),
                   ("iou:0.3:0.98", dict(metrics=["iou:0.3:0.98"]))]),
    "minilm_l3": (lambda n: [token_ids(k) for k in range(n)], 8,
                  [("max error (default)", {}), ("cosine:0.999", dict(metrics=["cosine:0.999"]))]),
    "magika": (magika_samples, 8,
               [("max error (default)", {}), ("topk:1", dict(metrics=["topk:1"]))]),
    "magika_200": (magika_samples, 200,
                   [("max error (default)", {}), ("topk:1", dict(metrics=["topk:1"])),
                    ("topk:1, every sample searched", dict(metrics=["topk:1"]))]),
}


def model_path(name: str, work: Path) -> Path:
    base = name.split("_200")[0]
    return fetch(base, quiet=True)


def bench(name: str, work: Path) -> list[dict]:
    make, n, criteria = CASES[name]
    model = model_path(name, work)
    samples = make(n)
    folder = write_folder(work / f"{name}_samples", samples)
    flops = node_flops(onnx.load(str(model)), samples[0])
    total = sum(flops.values())
    rows = []
    for label, flags in criteria:
        every = "every sample" in label
        flags = dict(flags)
        atol = flags.pop("atol", 0.0)
        opts = Options.of(inputs=[str(folder)], tolerance=Tolerance(atol=atol),
                          criteria=parse_criteria(**flags), max_evaluations=MAX_EVALUATIONS,
                          search_samples=0 if every else 8)
        started = time.perf_counter()
        r = run(model, opts, work / f"out_{name}_{len(rows)}")
        wall = time.perf_counter() - started
        after = r.judged.shown if r.judged else None
        rows.append({
            "case": name, "criterion": label, "samples": r.samples, "verdict": r.verdict,
            "fp32_nodes": len(r.fp32_nodes), "candidates": r.candidates,
            "fp32_flops": sum(flops.get(x, 0.0) for x in r.fp32_nodes) / total if total else 0.0,
            "evaluations": r.evaluations, "inferences": r.inferences, "wall_s": round(wall, 1),
            "passed_samples": sum(after.samples) if after else None,
            "search_samples": len((r.judged.search_samples if r.judged else None) or [])
            or r.samples,
            "stopped_early": bool(r.search and r.search.stopped_early),
        })
        print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    head = ("| case | criterion | samples (searched on) | verdict | FP32 nodes | FP32 FLOPs | "
            "evaluations | inferences | wall s | plan passes on |")
    out = [head, "|" + "---|" * 10]
    for r in rows:
        out.append(f"| {r['case']} | {r['criterion']} | {r['samples']} ({r['search_samples']}) | "
                   f"{r['verdict']}{' (budget hit)' if r['stopped_early'] else ''} | "
                   f"{r['fp32_nodes']} of {r['candidates']} | {100 * r['fp32_flops']:.1f}% | "
                   f"{r['evaluations']} | {r['inferences']} | {r['wall_s']} | "
                   f"{r['passed_samples']} of {r['samples']} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", choices=sorted(CASES))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or list(CASES):
            rows += bench(name, Path(tmp))
    print(f"\ntrtbisect {__version__}, python {platform.python_version()}, "
          f"{platform.machine()}, {time.strftime('%Y-%m-%d')}\n")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
