"""`run --precision int8|fp8` on an FP32 model: quantize it first with ModelOpt's ONNX PTQ
(`modelopt.onnx.quantization.quantize`) on the user's samples, then bisect the quantized file
against the FP32 model. ModelOpt is an optional extra, imported here only."""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import TrtBisectError, require
from ..outputs.quantized import CALIB, INSTALL, Reproduction

if TYPE_CHECKING:
    from ..context import SampleOptions

MODES = ("int8", "fp8")
GIVEN = "calib.trtbisect.npz"  # the same, beside the file trtbisect had ModelOpt write

# import name -> distribution: what nvidia-modelopt 0.47.0 requires and its ONNX PTQ imports
# (pyproject.toml's quant extra, ModelOpt itself aside)
REQUIRES = {"modelopt": "nvidia-modelopt", "torch": "torch", "ninja": "ninja",
            "omegaconf": "omegaconf", "pulp": "pulp", "pydantic": "pydantic", "yaml": "PyYAML",
            "regex": "regex", "safetensors": "safetensors", "scipy": "scipy", "tqdm": "tqdm",
            "pynvml": "nvidia-ml-py", "onnx_graphsurgeon": "onnx-graphsurgeon",
            "onnxslim": "onnxslim", "lief": "lief", "onnxscript": "onnxscript"}


def missing() -> list[str]:
    """The distributions of REQUIRES not installed here (found without importing them)."""
    import importlib.util

    out = []
    for module, dist in REQUIRES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(dist)
    return out


def status() -> tuple[bool, str]:
    """`trtbisect env`'s line for ModelOpt's ONNX PTQ: usable, or what is missing and how to
    install it, in one line."""
    from importlib import metadata

    gone = missing()
    if gone:
        return False, (f"missing {', '.join(gone)}; for run --precision int8|fp8: {INSTALL}")
    try:
        version = metadata.version("nvidia-modelopt")
    except metadata.PackageNotFoundError:  # importable from a path pip did not install
        version = "(version unknown)"
    return True, (f"nvidia-modelopt {version} and what its ONNX PTQ needs, for run "
                  "--precision int8|fp8")


def _require(mode: str):
    gone = missing()
    return require("modelopt.onnx.quantization",
                   f"--precision {mode} quantizes with NVIDIA ModelOpt"
                   + (f" (missing {', '.join(gone)})" if gone else "") + f": {INSTALL}")


def calibration(samples: Sequence[dict]) -> dict[str, np.ndarray]:
    """The samples stacked on their leading axis, as ModelOpt's calibration_data takes them."""
    names = list(samples[0])
    return {n: np.concatenate([np.asarray(s[n]) for s in samples], axis=0) for n in names}


def quantize(model_path: Path, mode: str, samples: Sequence[dict], out_path: Path) -> Path:
    """The FP32 model quantized by ModelOpt (`mode`: int8 | fp8), FP32 elsewhere. ModelOpt
    is handed a copy: its ONNX PTQ rewrites the file it is given (0.47.0, trt_utils.py
    load_onnx_model: `onnx.shape_inference.infer_shapes_path(onnx_path)` writes the inferred
    model back over it), and the user's input is never modified."""
    if mode not in MODES:
        raise TrtBisectError(f"--precision {mode}: ModelOpt quantizes to {' or '.join(MODES)}")
    mq = _require(mode)
    model_path = _copy_in(model_path, out_path.parent / "input")
    data = calibration(samples)
    np.savez(out_path.parent / GIVEN, **data)  # type: ignore[arg-type]  # commands.sh's ModelOpt line reads it (--out)
    try:  # ModelOpt logs to the stdout of the moment: stderr here (stdout carries --json)
        with contextlib.redirect_stdout(sys.stderr):
            mq.quantize(onnx_path=str(model_path), quantize_mode=mode,
                        calibration_data=data, output_path=str(out_path),
                        high_precision_dtype="fp32", calibration_eps=["cpu"],
                        log_level="WARNING")
    except Exception as exc:  # ModelOpt raises what it likes; one line and exit 2
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TrtBisectError(f"ModelOpt could not quantize {model_path}: {first}") from exc
    return out_path


def _copy_in(model_path: Path, folder: Path) -> Path:
    """The model file and its external data files, copied into `folder` (same layout)."""
    from ..graph import external_files

    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / model_path.name
    shutil.copyfile(model_path, copy)
    for f in external_files(model_path):
        rel = Path(f).relative_to(model_path.parent)
        if ".." in rel.parts:
            raise TrtBisectError(f"{model_path}'s external data {rel} lies outside its folder: "
                                 "move it beside the model for --precision int8|fp8")
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)
    return copy


def quantize_samples(model: str, given: SampleOptions, precision: str, scratch: Path, stage,
                     calibration: Sequence[str] = ()) -> Path:
    """`calibration`'s samples (else the run's, `given`: --inputs, or seeded random ones) as
    ModelOpt's calibration data, and the model quantized to `precision` written under
    `scratch`."""
    from ..data.sources import iter_items
    from ..graph import Graph

    _require(precision)
    graph = Graph.from_path(model)
    if calibration:
        items = iter_items(graph, list(calibration), None, given.shapes, given.seed)
    else:
        items = iter_items(graph, list(given.inputs), given.data_loader, given.shapes,
                           given.seed, given.samples)
    samples = [item.sample for item in items]
    stage(f"quantizing to {precision} with ModelOpt's ONNX PTQ on {len(samples)} samples")
    return quantize(Path(model), precision, samples,
                    scratch / f"{Path(model).stem}.{precision}.onnx")


def write_calibration(out_dir: Path, source: Path, samples: Sequence[dict]) -> Path | None:
    """calib.npz in --out, the file commands.sh's ModelOpt line reads: the data trtbisect gave
    ModelOpt (`source`'s folder holds it when trtbisect quantized the model), else the run's
    samples stacked (a Q/DQ file given as it is: its own calibration data is not known). None
    where the samples do not stack (their shapes differ)."""
    from ..base.files import atomic_write

    given = source.parent / GIVEN
    if given.is_file():
        data = dict(np.load(given))
    else:
        try:
            data = calibration(list(samples))
        except (ValueError, IndexError):
            return None
    target = out_dir / CALIB
    atomic_write(target, lambda tmp: _savez(tmp, data))
    return target


def _savez(path: str, data: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as fh:  # np.savez on a name would append ".npz" to it
        np.savez(fh, **data)  # type: ignore[arg-type]


def reproduce(result, judge, fp32: Path, source: Path) -> Reproduction | None:
    """ModelOpt's ONNX PTQ run with the rendered exclusions on the calibration data it was
    given (only where trtbisect quantized the model itself: `source`'s folder holds that
    data): the layers its file quantizes against the plan's, and that file judged by the run's
    judge (`trtbisect check` of it says the same). ModelOpt also leaves un-quantized some
    neighbours of an excluded node, so its file may differ from the plan. The file is written
    under `source`'s folder (run.py keeps it in --out). None where ModelOpt is not here."""
    from ..outputs.quantized import patterns
    from . import qdq

    given = source.parent / GIVEN
    if not result.plan or not given.is_file():
        return None
    try:
        mq = _require(result.renderings.get("quantize_mode", "int8"))
    except TrtBisectError:
        return None
    out = source.parent / f"{fp32.stem}.modelopt.onnx"
    model_path = _copy_in(fp32, source.parent / "again")
    try:
        with contextlib.redirect_stdout(sys.stderr):
            mq.quantize(onnx_path=str(model_path),
                        quantize_mode=result.renderings.get("quantize_mode", "int8"),
                        calibration_data=dict(np.load(given)), output_path=str(out),
                        high_precision_dtype="fp32", calibration_eps=["cpu"],
                        nodes_to_exclude=patterns(result.plan), log_level="WARNING")
    except Exception as exc:  # noqa: BLE001 - ModelOpt raises what it likes: said, not fatal
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return Reproduction(False, first)
    import onnx

    from ..graph import with_node_names
    got = {la.name for la in qdq.analyse(with_node_names(onnx.load(str(out))))}
    meant = {la.name for la in result.layers if la.name not in set(result.plan)}
    v = judge.judge_model(out)
    return Reproduction(True, "", str(out), got == meant, tuple(sorted(meant - got)),
                        tuple(sorted(got - meant)), v.passed,
                        {k: e.to_json() for k, e in v.errors.items()})


def keep_side_files(renderings: dict, judge, source: Path, out_dir: Path) -> dict[str, str]:
    """Inside --out's generation, beside commands.sh: calib.npz (`write_calibration`) and
    ModelOpt's file of the rendered exclusions (`reproduce`, the renderings'
    "modelopt_reproduction"), copied into --out; returns what it wrote, by precision.json's
    `files` keys (run.py records "modelopt_model" as the reproduction's path too)."""
    import onnx

    from ..base.files import save_model

    files: dict[str, str] = {}
    samples = judge.samples if judge is not None else ()
    calib = write_calibration(out_dir, source, samples)
    if calib is not None:
        files["calibration"] = str(calib)
    rep = Reproduction.of(renderings)
    if rep is not None and rep.ran and Path(rep.path).parent != out_dir:
        target = out_dir / Path(rep.path).name
        save_model(target, onnx.load(rep.path))
        files["modelopt_model"] = str(target)
    return files
