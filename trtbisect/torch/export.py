"""PyTorch -> ONNX: load a model from `file.py:factory`, export it, check it against PyTorch.

torch is imported inside the functions that need it, so `import trtbisect` stays light. The
factory contract (docs/pytorch.md): `factory()` returns an nn.Module, or `(module, inputs)`
where inputs is a tensor, a tuple of tensors (forward's positional arguments) or a dict keyed
by forward's parameter names. `--input NAME:DIMS[:DTYPE]` specs replace those inputs with
seeded random data of that shape.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import io
import logging
import sys
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ..errors import TrtBisectError, require
from ..graph.modules import modules_metadata
from ..judge.compare import OutputError, Tolerance, compare_outputs, worst

log = logging.getLogger(__name__)

TORCH_HINT = "pip install 'trtbisect[torch]'  (torch==2.13.0)"
MAX_IR_VERSION = 10  # what we write; onnxruntime 1.31 reads up to IR 13, onnx 1.23 writes 14
DEFAULT_OPSET = 17  # the first opset with LayerNormalization (statistics in FP32)
EXPORTERS = ("torchscript", "dynamo")
DTYPES = {"float32": np.float32, "float16": np.float16, "float64": np.float64,
          "int64": np.int64, "int32": np.int32, "bool": np.bool_}

Sample = dict[str, np.ndarray]


def import_torch():
    """torch, or a one-line error saying how to install it."""
    return require("torch", TORCH_HINT)


# ---------------------------------------------------------------- the model argument

def is_factory_arg(arg: str) -> bool:
    return ".py:" in arg


@dataclass(frozen=True)
class InputSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"


def parse_input_specs(specs: Iterable[str]) -> list[InputSpec]:
    """`x:1x3x224x224`, `ids:1x128:int64` (repeatable, in forward's argument order)."""
    out: list[InputSpec] = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not parts[0]:
            raise TrtBisectError(f"bad --input {spec!r}: expected NAME:DIMS[:DTYPE], "
                                 "e.g. x:1x3x224x224 or ids:1x128:int64")
        dtype = parts[2] if len(parts) == 3 else "float32"
        if dtype not in DTYPES:
            raise TrtBisectError(f"bad --input {spec!r}: dtype must be one of {', '.join(DTYPES)}")
        try:
            shape = tuple(int(d) for d in parts[1].split("x")) if parts[1] else ()
        except ValueError:
            raise TrtBisectError(f"bad --input {spec!r}: dimensions must be integers, "
                                 "e.g. 1x3x224x224") from None
        if any(d <= 0 for d in shape):
            raise TrtBisectError(f"bad --input {spec!r}: dimensions must be positive")
        out.append(InputSpec(parts[0], shape, dtype))
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise TrtBisectError(f"--input names must be unique, got {', '.join(names)}")
    return out


def random_samples(specs: Sequence[InputSpec], seed: int, count: int = 1) -> list[Sample]:
    """Seeded data like `trtbisect run`'s: N(0,1) floats, integers in {0, 1}."""
    samples = []
    for k in range(count):
        rng = np.random.default_rng(seed + k)
        sample: Sample = {}
        for s in specs:
            dtype = np.dtype(DTYPES[s.dtype])
            if dtype.kind == "f":
                sample[s.name] = rng.standard_normal(s.shape).astype(dtype)
            else:
                sample[s.name] = rng.integers(0, 2, size=s.shape).astype(dtype)
        samples.append(sample)
    return samples


@dataclass
class TorchModel:
    """A user's model with the samples to run it on; names are forward's argument order."""

    module: Any  # torch.nn.Module
    input_names: list[str]
    samples: list[Sample]
    source: str  # "file.py:factory"

    def args(self, sample: Sample, device: str = "cpu") -> tuple:
        torch = import_torch()
        return tuple(torch.from_numpy(np.ascontiguousarray(sample[n])).to(device)
                     for n in self.input_names)


def load_factory(arg: str) -> tuple[Any, Any]:
    """Import `file.py`, call `factory` (or take it as is when it already is a module).

    Returns (module in eval mode, example inputs or None).
    """
    torch = import_torch()
    path_text, _, attr = arg.rpartition(":")
    path = Path(path_text)
    if not path.is_file():
        raise TrtBisectError(f"model file not found: {path} (expected FILE.py:FACTORY)")
    if not attr.isidentifier():
        raise TrtBisectError(f"bad factory {attr!r} in {arg!r}: expected FILE.py:FACTORY, "
                             "FACTORY a function, class or module instance in that file")
    user = _import_file(path)
    if not hasattr(user, attr):
        found = sorted(n for n, v in vars(user).items() if callable(v) and not n.startswith("_")
                       and getattr(v, "__module__", None) == user.__name__)
        raise TrtBisectError(f"{path} has no {attr!r}; it defines: {', '.join(found) or 'nothing callable'}")
    obj = getattr(user, attr)
    if isinstance(obj, torch.nn.Module):
        result = obj
    elif callable(obj):
        try:
            result = obj()
        except Exception as exc:
            log.debug("factory %s failed", arg, exc_info=True)
            raise TrtBisectError(f"calling {attr}() from {path} failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
    else:
        raise TrtBisectError(f"{attr} in {path} is a {type(obj).__name__}, not a factory or module")
    example = None
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module):
        result, example = result
    if not isinstance(result, torch.nn.Module):
        raise TrtBisectError(f"{attr}() returned {type(result).__name__}; return an nn.Module "
                             "or (nn.Module, example_inputs)")
    return result.eval(), example


def _import_file(path: Path):
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
    name = f"trtbisect_user_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TrtBisectError(f"cannot import {path} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.resolve().parent))  # so it can import its neighbours
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        log.debug("importing %s failed", path, exc_info=True)
        raise TrtBisectError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        sys.path.remove(str(path.resolve().parent))
    return module


def load_torch_model(arg: str, input_specs: Sequence[str] = (), seed: int = 0,
                     samples: int = 1) -> TorchModel:
    """The model of `file.py:factory` with its samples: from --input specs when given, else
    the factory's example inputs."""
    torch = import_torch()
    module, example = load_factory(arg)
    specs = parse_input_specs(input_specs)
    params = _forward_params(module)
    if specs:
        return TorchModel(module, [s.name for s in specs], random_samples(specs, seed, samples), arg)
    if example is None:
        hint = ":".join([params[0] if params else "x", "1x3x224x224"])
        raise TrtBisectError(f"no inputs for {arg}: give --input {hint} (one per forward "
                             "argument), or return (model, example_inputs) from the factory")
    if isinstance(example, torch.Tensor):
        example = (example,)
    if isinstance(example, dict):
        unknown = [k for k in example if k not in params]
        if unknown:
            raise TrtBisectError(f"example input(s) {', '.join(unknown)} are not parameters of "
                                 f"forward({', '.join(params)})")
        names = [p for p in params if p in example]
        values = [example[n] for n in names]
    elif isinstance(example, (tuple, list)):
        values = list(example)
        names = [params[i] if i < len(params) else f"input_{i}" for i in range(len(values))]
    else:
        raise TrtBisectError(f"example inputs must be a tensor, tuple or dict, not {type(example).__name__}")
    if not all(isinstance(v, torch.Tensor) for v in values):
        raise TrtBisectError("every example input must be a torch.Tensor")
    sample = {n: v.detach().cpu().numpy() for n, v in zip(names, values)}
    return TorchModel(module, names, [sample], arg)


def _forward_params(module) -> list[str]:
    try:
        sig = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in sig.parameters.values() if p.kind in kinds]


# ---------------------------------------------------------------- outputs

def flatten_outputs(out) -> dict[str, Any]:
    """Model outputs as {name: tensor}: `output`, `output_0..n`, or a dict's own keys."""
    torch = import_torch()
    if isinstance(out, torch.Tensor):
        return {"output": out}
    if isinstance(out, dict):
        flat = {}
        for k, v in out.items():
            inner = flatten_outputs(v)
            flat.update({str(k) if n == "output" else f"{k}.{n}": t for n, t in inner.items()})
        return flat
    if isinstance(out, (tuple, list)):
        flat = {}
        for i, v in enumerate(out):
            inner = flatten_outputs(v)
            flat.update({f"output_{i}" if n == "output" else f"output_{i}.{n}": t
                         for n, t in inner.items()})
        return flat
    return {}


def to_numpy(tensors: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: (t.detach().float() if t.is_floating_point() else t.detach()).cpu().numpy()
            for k, t in tensors.items()}


# ---------------------------------------------------------------- export

@dataclass
class ExportOptions:
    exporter: str = "torchscript"  # keeps module scopes in node names: /blocks/blocks.3/ln2/Pow
    opset: int = DEFAULT_OPSET
    seed: int = 0
    samples: int = 1
    tolerance: Tolerance = field(default_factory=Tolerance)


@dataclass
class ExportResult:
    onnx_path: str
    inputs_path: str
    source: str
    exporter: str
    opset: int
    ir_version: int
    input_names: list[str]
    output_names: list[str]
    nodes: int
    scoped_nodes: int  # nodes that name their module (by scope or metadata)
    errors: dict[str, OutputError]  # ONNX Runtime FP32 vs PyTorch FP32, worst over samples
    passed: bool
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def max_abs_err(self) -> float:
        return max((e.max_abs for e in self.errors.values()), default=0.0)

    @property
    def max_rel_err(self) -> float:
        return max((e.rel for e in self.errors.values()), default=0.0)

    def to_json(self) -> dict:
        return {"onnx": self.onnx_path, "inputs": self.inputs_path, "source": self.source,
                "exporter": self.exporter, "opset": self.opset, "ir_version": self.ir_version,
                "input_names": self.input_names, "output_names": self.output_names,
                "nodes": self.nodes, "scoped_nodes": self.scoped_nodes,
                "max_abs_err": self.max_abs_err, "max_rel_err": self.max_rel_err,
                "errors": {k: v.to_json() for k, v in self.errors.items()},
                "passed": self.passed, "warnings": self.warnings,
                "seconds": round(self.seconds, 3)}


def export(arg: str, input_specs: Sequence[str], onnx_path: str | Path,
           opts: ExportOptions | None = None) -> ExportResult:
    """Export `file.py:factory` to ONNX, save its inputs beside it, and check it against
    PyTorch FP32 on those inputs. Writes `<onnx stem>_inputs.npz`."""
    opts = opts or ExportOptions()
    if opts.exporter not in EXPORTERS:
        raise TrtBisectError(f"unknown exporter {opts.exporter!r}: use {' or '.join(EXPORTERS)}")
    started = time.perf_counter()
    tm = load_torch_model(arg, input_specs, opts.seed, opts.samples)
    return export_model(tm, onnx_path, opts, started)


def export_model(tm: TorchModel, onnx_path: str | Path, opts: ExportOptions,
                 started: float | None = None) -> ExportResult:
    torch = import_torch()
    started = time.perf_counter() if started is None else started
    onnx_path = Path(onnx_path)
    onnx_path.parent.mkdir(parents=True, exist_ok=True)
    module = tm.module.float()
    args = tm.args(tm.samples[0])
    with torch.no_grad():
        try:
            reference = [to_numpy(flatten_outputs(module(*tm.args(s)))) for s in tm.samples]
        except Exception as exc:  # the user's forward on the --input shapes: bad input
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise TrtBisectError(f"{tm.source} fails on the given inputs ({type(exc).__name__}: "
                                 f"{first}); check --input's shapes and dtypes") from exc
    output_names = list(reference[0])
    if not output_names:
        raise TrtBisectError(f"{tm.source} returned no tensors; return a tensor, tuple or dict")
    notes: list[str] = []
    model = _run_exporter(module, args, tm.input_names, output_names, opts, notes)
    model = finish_model(model, module, tm.source)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opts.exporter == "dynamo" and opset != opts.opset:
        notes.append(f"the dynamo exporter wrote opset {opset}, not the requested {opts.opset} "
                     "(it targets opset 18 and newer)")
    notes += layernorm_warnings(module, opset)
    from ..diagnosis.folding import conv_norm_pairs, export_note, folded_at_export
    notes += export_note(folded_at_export(conv_norm_pairs(module), model.graph.node))
    graph_inputs = [v.name for v in model.graph.input
                    if v.name not in {t.name for t in model.graph.initializer}]
    dropped = [n for n in tm.input_names if n not in graph_inputs]
    if dropped:
        notes.append(f"the exporter dropped unused input(s) {', '.join(dropped)}")
    from ..base.files import save_model
    save_model(onnx_path, model)
    inputs_path = inputs_of(onnx_path)
    _save_samples(inputs_path, tm.samples, graph_inputs)
    errors = _check_against_torch(model, tm.samples, graph_inputs, reference, opts.tolerance)
    passed = all(e.passed for e in errors.values())
    scoped = sum(1 for n in model.graph.node if _is_scoped(n))
    return ExportResult(str(onnx_path), str(inputs_path), tm.source, opts.exporter, opset,
                        model.ir_version, graph_inputs, [o.name for o in model.graph.output],
                        len(model.graph.node), scoped, errors, passed, notes,
                        time.perf_counter() - started)


def _run_exporter(module, args: tuple, input_names: list[str], output_names: list[str],
                  opts: ExportOptions, notes: list[str]) -> onnx.ModelProto:
    """The chosen torch.onnx exporter, its chatter kept off stdout (data goes there)."""
    torch = import_torch()
    chatter = io.StringIO()
    quiet = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._export")]
    levels = [lg.level for lg in quiet]
    try:
        for lg in quiet:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(chatter):
            warnings.simplefilter("always")
            if opts.exporter == "torchscript":
                buf = io.BytesIO()
                torch.onnx.export(module, args, buf, dynamo=False, opset_version=opts.opset,
                                  input_names=input_names, output_names=output_names,
                                  do_constant_folding=True)
                model = onnx.load_from_string(buf.getvalue())
            else:
                program = torch.onnx.export(module, args, dynamo=True, opset_version=opts.opset,
                                            input_names=input_names, output_names=output_names,
                                            verbose=False)
                model = program.model_proto
    except TrtBisectError:
        raise
    except Exception as exc:
        log.debug("export failed", exc_info=True)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        other = "dynamo" if opts.exporter == "torchscript" else "torchscript"
        raise TrtBisectError(f"the {opts.exporter} exporter failed at opset {opts.opset}: {first}; "
                             f"try --exporter {other} or another --opset") from exc
    finally:
        for lg, level in zip(quiet, levels):
            lg.setLevel(level)
    log.debug("%s", chatter.getvalue())
    traced: dict[str, int] = {}  # one note per tracer message, with how often it came
    for w in caught:
        if "Tracer" in type(w.message).__name__:
            first = str(w.message).splitlines()[0] if str(w.message).strip() else ""
            traced[first] = traced.get(first, 0) + 1
        else:
            log.debug("exporter warning: %s", w.message)
    notes += [f"tracer: {m}" + (f" (x{k})" if k > 1 else "") for m, k in traced.items()]
    return model


def finish_model(model: onnx.ModelProto, module, source: str) -> onnx.ModelProto:
    """IR version onnxruntime can read, the module table for `module_of`, and a validity check."""
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    table = {path: f"{type(m).__module__}.{type(m).__qualname__}"
             for path, m in module.named_modules()}
    keep = [p for p in model.metadata_props if p.key not in ("trtbisect.torch_modules",
                                                             "trtbisect.source")]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    model.metadata_props.append(modules_metadata(table))
    model.metadata_props.append(onnx.StringStringEntryProto(key="trtbisect.source", value=source))
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0]
        raise TrtBisectError(f"the exported model is not valid ONNX: {first}") from exc
    return model


def layernorm_warnings(module, opset: int) -> list[str]:
    """Below opset 17 LayerNorm is decomposed, and its Pow is a classic FP16 overflow site."""
    torch = import_torch()
    if opset >= 17:
        return []
    norms = [p for p, m in module.named_modules() if isinstance(m, torch.nn.LayerNorm)]
    if not norms:
        return []
    shown = ", ".join(norms[:3]) + (f" and {len(norms) - 3} more" if len(norms) > 3 else "")
    return [f"opset {opset} has no LayerNormalization, so {len(norms)} LayerNorm module(s) "
            f"({shown}) were decomposed into ReduceMean/Sub/Pow/Sqrt/Div; in FP16 the "
            "Pow (x - mean)^2 overflows once |x - mean| > 255. Opset 17+ exports one "
            "LayerNormalization node whose mean and variance ONNX Runtime and TensorRT compute "
            "in FP32 (stash_type=1) even with FP16 input and output: export with --opset 17"]


def _is_scoped(node: onnx.NodeProto) -> bool:
    return node.name.startswith("/") and node.name.count("/") > 1 or any(
        p.key == "pkg.torch.onnx.name_scopes" for p in node.metadata_props)


def _save_samples(path: Path, samples: list[Sample], names: list[str]) -> None:
    """One sample as is; several stacked on a leading axis (what `run --inputs` reads)."""
    from ..base.files import atomic_write
    arrays = ({n: samples[0][n] for n in names} if len(samples) == 1
              else {n: np.stack([s[n] for s in samples]) for n in names})
    atomic_write(path, lambda tmp: _savez(tmp, arrays))


def _savez(tmp: str, arrays: dict[str, Any]) -> None:
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)


def _check_against_torch(model: onnx.ModelProto, samples: list[Sample], names: list[str],
                         reference: list[dict[str, np.ndarray]], tol: Tolerance
                         ) -> dict[str, OutputError]:
    from ..backends.ort import make_session, run_session
    session = make_session(model)
    outs = [o.name for o in model.graph.output]
    errors = []
    if set(outs) != set(reference[0]) and len(outs) != len(reference[0]):
        raise TrtBisectError(f"the exported model has {len(outs)} output(s), PyTorch returned "
                             f"{len(reference[0])}: {', '.join(outs)} vs {', '.join(reference[0])}")
    for sample, ref in zip(samples, reference):
        got = dict(zip(outs, run_session(session, {n: sample[n] for n in names}, outs)))
        ref_by_onnx = ({k: ref[k] for k in outs} if set(outs) == set(ref)
                       else dict(zip(outs, ref.values())))  # named by us, in PyTorch's order
        errors.append(compare_outputs(ref_by_onnx, {k: np.asarray(v, np.float32)
                                                    for k, v in got.items()}, tol))
    return worst(errors)


# ---------------------------------------------------------------- `run file.py:factory`

def resolve_model_arg(arg: str, input_specs: Sequence[str], out_dir: Path
                      ) -> tuple[Path, Path | None]:
    """The ONNX model `run` should use and the inputs saved with it.

    An ONNX path comes back as is (None for the inputs). `file.py:factory` is exported with
    the defaults (TorchScript, opset 17) to `out_dir/<file stem>.onnx`, checked against PyTorch,
    and its inputs saved as `out_dir/<file stem>_inputs.npz`, as trtbisect's own files of the
    folder (outputs/outdir.py `OutputDir.exporting`).
    """
    if not is_factory_arg(arg):
        if input_specs:
            raise TrtBisectError("--input is for PyTorch models (FILE.py:FACTORY); for an ONNX "
                                 "model give dynamic dimensions with --shape NAME:DIMS")
        return Path(arg), None
    from ..outputs.outdir import OutputDir

    onnx_path = Path(out_dir) / f"{Path(arg.rpartition(':')[0]).stem}.onnx"
    # under the folder's lock, never over a file that is not trtbisect's, then listed as its
    with OutputDir(out_dir).exporting([onnx_path.name, f"{onnx_path.name}.data",
                                       inputs_of(onnx_path).name]):
        result = export(arg, input_specs, onnx_path)
    log.info("exported %s to %s (%s, opset %d): max |ONNX - PyTorch| %.3g", arg,
             result.onnx_path, result.exporter, result.opset, result.max_abs_err)
    for note in result.warnings:
        log.warning("%s", note)
    if not result.passed:
        raise TrtBisectError(export_failure(result))
    return Path(result.onnx_path), Path(result.inputs_path)


def inputs_of(onnx_path: Path) -> Path:
    """Where an export saves the inputs it was checked on: `<stem>_inputs.npz` beside it."""
    return onnx_path.with_name(f"{onnx_path.stem}_inputs.npz")


def export_failure(result: ExportResult) -> str:
    name, e = max(result.errors.items(), key=lambda kv: kv[1].rel)
    return (f"the exported ONNX disagrees with PyTorch FP32 on output {name!r} (max |d| "
            f"{e.max_abs:.3g}, {e.nonfinite} non-finite, bound {e.bound:.3g}); FP16 analysis of "
            f"it would be meaningless. Check {result.onnx_path} with another --exporter/--opset")
