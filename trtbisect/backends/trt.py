"""TensorRT backend: engines built and run on the user's NVIDIA GPU (the search that drives
them is trtbisect/stages/trt.py).

TensorRT 10 (weak typing): one network per plan, built with BuilderFlag.FP16 and
OBEY_PRECISION_CONSTRAINTS; every network layer the ONNX parser made for a plan node gets
`layer.precision = float32` and FP32 outputs. TensorRT 11 removed weak typing: each plan is
rendered by `trtbisect.judge.mixed.write_mixed_onnx` and built strongly typed. The version is read at
run time. Engines are cached on disk under a key of model bytes, FP32 nodes and TensorRT version;
a shared timing cache makes rebuilds cheap. Device memory goes through cuda-python
(`cuda.bindings.runtime`). Importing this module needs none of TensorRT, CUDA or a GPU; what
does not need TensorRT lives in `trtbisect.judge.trt_layers`. Every TensorRT name used here exists in
the release its path targets (10.13 for weak typing, 10.13 and 11.4 for the rest: the API
surfaces in `trtbisect.backends.trt_surface`, checked by tests/backends/test_trt_surface.py).
"""

from __future__ import annotations

import ast
import ctypes
import importlib
import importlib.util
import logging
import os
import statistics
import sys
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from trtbisect.base import limits
from trtbisect.base.files import atomic_write, save_model
from trtbisect.errors import TrtBisectError, require
from trtbisect.graph import Graph, load_model, node_names, with_node_names
from trtbisect.judge import trt_layers as tl
from trtbisect.judge.compare import Tolerance, compare_outputs

if TYPE_CHECKING:  # annotations only: mypy checks them against the TensorRT 10.13 stubs
    import tensorrt as trt

log = logging.getLogger(__name__)

Feeds = Mapping[str, np.ndarray]
INSTALL_HINT = ("install TensorRT and cuda-python on a machine with an NVIDIA GPU: "
                "pip install 'trtbisect[trt]' cuda-python (see docs/tensorrt.md)")
CACHE_ENV = "TRTBISECT_CACHE_DIR"
_ENGINES_IN_MEMORY = 4


# ------------------------------------------------------------------- availability and CUDA

def default_cache_dir() -> Path:
    """Where engines and timing caches live: $TRTBISECT_CACHE_DIR, else the XDG cache folder."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "trtbisect" / "engines"


def _write_bytes(path: Path, data: bytes) -> None:
    """Temp file + os.replace: a crash or a concurrent run never leaves a truncated engine."""
    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fh.write(data)
    atomic_write(path, write)


def _ensure_tensorrt() -> str:
    """Import TensorRT or fail with exit 2; returns its version."""
    trt = require("tensorrt", INSTALL_HINT)
    if not hasattr(trt, "Builder"):  # tensorrt-stubs or a placeholder: an empty namespace package
        raise TrtBisectError(f"the installed 'tensorrt' has no Builder (type stubs or a "
                             f"placeholder package only); {INSTALL_HINT}")
    return str(getattr(trt, "__version__", "0"))


def installed_tensorrt() -> tuple[str, str] | None:
    """(version, file) of the TensorRT `import tensorrt` would load, or None (absent, or a
    stubs-only `tensorrt/`). Read without importing it: its libraries need NVIDIA's driver, and
    `trtbisect run --help` must stay cheap. The version is the `__version__` literal of NVIDIA's
    `tensorrt/__init__.py`, or of `tensorrt_bindings/__init__.py` where PyPI's `tensorrt-cu1x`
    shim re-exports it; a tensorrt already imported answers with its own `__version__`."""
    loaded = sys.modules.get("tensorrt")
    if loaded is not None and hasattr(loaded, "Builder"):
        return str(getattr(loaded, "__version__", "0")), str(getattr(loaded, "__file__", ""))
    for name in ("tensorrt", "tensorrt_bindings"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            if name == "tensorrt":
                return None  # not installed, blocked, or a namespace package of .pyi stubs
            continue
        version = _version_literal(Path(spec.origin))
        if version:
            return version, spec.origin
    return None


def _version_literal(path: Path) -> str | None:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)):
            return str(node.value.value)
    return None


def default_trt_version() -> int:
    """`--trt-version`'s default: the installed TensorRT's major version (8.x and 9.x, which
    also type weakly, count as 10; 12 and later as 11, the newest trtbisect knows), else 11,
    the current release."""
    found = installed_tensorrt()
    try:
        major = int(found[0].split(".")[0]) if found else 11
    except ValueError:
        major = 11
    return min(max(major, 10), 11)


def trt_path(version: str) -> str:
    """Which path `--backend trt` takes with this TensorRT, and what its calls were checked
    against (trtbisect/backends/trt_surface)."""
    from trtbisect.backends import trt_surface

    major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0
    if major < 10:
        return f"TensorRT {version} is older than 10: --backend trt needs 10 or 11"
    checked = trt_surface.CHECKED[min(major, 11)]
    newer = f"; {version} is newer than {checked}, the release its calls were checked against" \
        if major > 11 else ""
    if major >= 11:
        how = "strong typing: each plan is built from its mixed ONNX (TensorRT 11 has no weak typing)"
    else:
        how = ("weak typing: BuilderFlag.FP16, OBEY_PRECISION_CONSTRAINTS and FP32 "
               "layer.precision / set_output_type on the plan's layers")
    return f"{how}; calls checked against the {checked} bindings' API, never run here{newer}"


def _cudart() -> Any:
    try:
        return importlib.import_module("cuda.bindings.runtime")
    except ImportError:
        return require("cuda.cudart", INSTALL_HINT)  # cuda-python before 12.6


def _cuda(result: Any) -> Any:
    """Unpack a cuda-python `(error, value...)` tuple, raising on error."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(getattr(err, "value", err) or 0) != 0:
        raise TrtBisectError(f"CUDA call failed: {err}; check the driver and that a GPU is visible")
    return values[0] if len(values) == 1 else (values or None)


def _device_summary() -> tuple[bool, str]:
    try:
        rt = _cudart()
        count = _cuda(rt.cudaGetDeviceCount())
        if not count:
            return False, "cuda-python is installed but sees no CUDA device"
        name = _cuda(rt.cudaGetDeviceProperties(0)).name
        return True, f"{count} device(s); 0: {name.decode() if isinstance(name, bytes) else name}"
    except TrtBisectError as exc:
        return False, str(exc)


def trt_available() -> tuple[bool, str]:
    """Can `--backend trt` run here? (usable, why); cheap, never raises."""
    try:
        version = _ensure_tensorrt()
    except TrtBisectError as exc:
        return False, str(exc)
    ok, why = _device_summary()
    return ok, f"TensorRT {version}; {why}"


def backend_status() -> list[tuple[str, bool, str]]:
    """(component, usable, why) rows for `trtbisect env`; never raises."""
    rows: list[tuple[str, bool, str]] = []
    try:
        ort = importlib.import_module("onnxruntime")
        rows.append(("ort (CPU FP16 emulator)", True, f"onnxruntime {ort.__version__}"))
    except ImportError as exc:
        rows.append(("ort (CPU FP16 emulator)", False, str(exc)))
    found = installed_tensorrt()  # what is on the path, read without importing it
    try:
        trt_ok, trt_why = True, f"TensorRT {_ensure_tensorrt()}"
    except TrtBisectError as exc:
        trt_ok, trt_why = False, str(exc)
    if found:
        trt_why = f"TensorRT {found[0]}" + (f" ({found[1]})" if found[1] else "") + (
            "" if trt_ok else f"; importing it failed: {trt_why}")
    default = default_trt_version()
    rows += [("tensorrt", trt_ok, trt_why),
             ("--backend trt path", found is not None,
              trt_path(found[0]) if found else "none: no TensorRT"),
             ("--trt-version default", True,
              f"{default}: the installed TensorRT's major version" if found else
              f"{default}: no TensorRT found, so the current release; the TensorRT 10 "
              "renderings are written too, labelled")]
    cuda_ok, cuda_why = _device_summary()
    rows.append(("cuda (cuda-python)", cuda_ok, cuda_why))
    try:
        torch = importlib.import_module("torch")
        on_gpu = bool(torch.cuda.is_available())
        rows += [("torch", True, f"torch {torch.__version__}"),
                 ("torch CUDA", on_gpu, torch.cuda.get_device_name(0) if on_gpu
                  else "torch sees no CUDA device (CPU build or no GPU)")]
    except ImportError as exc:
        rows.append(("torch", False, f"{exc}; pip install 'trtbisect[torch]'"))
    usable = trt_ok and cuda_ok
    rows.append(("--backend trt", usable, "usable" if usable
                 else "needs TensorRT, cuda-python and a CUDA device (rows above)"))
    return rows


# ------------------------------------------------------------------------------- engines

def _dims(dims: trt.Dims | Sequence[int]) -> tuple[int, ...]:
    return tuple(int(dims[i]) for i in range(len(dims)))


class _Engine:
    """A deserialized engine with one execution context and one CUDA stream."""

    def __init__(self, blob: bytes, runtime: trt.Runtime) -> None:
        self.blob = blob
        self.engine: trt.ICudaEngine = runtime.deserialize_cuda_engine(blob)
        if self.engine is None:
            raise TrtBisectError("TensorRT could not deserialize a cached engine; clear the cache dir")
        self.context: trt.IExecutionContext = self.engine.create_execution_context()
        self.names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.stream = _cuda(_cudart().cudaStreamCreate())
        self.stuck = False  # an execution left running past --eval-timeout (`infer`)

    def layer_info(self, shapes: Mapping[str, Sequence[int]]) -> str:
        """Inspector JSON; input shapes are set so dynamic models show types and formats."""
        import tensorrt as trt
        for name in self.names:
            if self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT and name in shapes:
                self.context.set_input_shape(name, tuple(shapes[name]))
        inspector = self.engine.create_engine_inspector()
        inspector.execution_context = self.context
        return inspector.get_engine_information(trt.LayerInformationFormat.JSON)

    def _bind(self, feeds: Feeds) -> tuple[list[int], dict[str, np.ndarray]]:
        """Device buffers for every I/O tensor (inputs copied in); outputs come last."""
        import tensorrt as trt
        rt, ptrs, outs = _cudart(), [], {}
        modes = {n: self.engine.get_tensor_mode(n) for n in self.names}
        try:
            for name in sorted(self.names, key=lambda n: modes[n] != trt.TensorIOMode.INPUT):
                dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(name)))
                if modes[name] == trt.TensorIOMode.INPUT:
                    if name not in feeds:
                        raise TrtBisectError(f"the engine needs input {name!r}; none was given")
                    host = np.ascontiguousarray(feeds[name], dtype=dtype)
                    self.context.set_input_shape(name, host.shape)
                else:
                    shape = _dims(self.context.get_tensor_shape(name))
                    if any(d < 0 for d in shape):
                        raise TrtBisectError(f"output {name} has a data-dependent shape; "
                                             "the TensorRT backend cannot run this model")
                    host = outs[name] = np.empty(shape, dtype)
                ptrs.append(int(_cuda(rt.cudaMalloc(max(host.nbytes, 1)))))
                self.context.set_tensor_address(name, ptrs[-1])
                if modes[name] == trt.TensorIOMode.INPUT:
                    _cuda(rt.cudaMemcpy(ptrs[-1], host.ctypes.data, host.nbytes,
                                        rt.cudaMemcpyKind.cudaMemcpyHostToDevice))
        except BaseException:
            self._free(ptrs)
            raise
        return ptrs, outs

    def _free(self, ptrs: Iterable[int]) -> None:
        for p in ptrs:
            _cuda(_cudart().cudaFree(p))

    def infer(self, feeds: Feeds, listener: Any = None, timed: int = 0, warmup: int = 0,
              seconds: float | None = None) -> tuple[dict[str, np.ndarray], list[float]]:
        """Outputs (floats as float32) and, when `timed`, that many latencies in ms; each
        execution may take `seconds` (--eval-timeout, `_execute`)."""
        rt = _cudart()
        ptrs, outs = self._bind(feeds)
        times: list[float] = []
        try:
            if listener is not None:
                self._debug(listener)
            clock = _Clock(rt, self.stream)
            try:
                for i in range(warmup + max(timed, 1)):
                    ms = self._execute(clock, seconds)
                    if i >= warmup:
                        times.append(ms)
            finally:
                if not self.stuck:
                    clock.close()
            for host, ptr in zip(outs.values(), ptrs[len(ptrs) - len(outs):]):
                _cuda(rt.cudaMemcpy(host.ctypes.data, ptr, host.nbytes,
                                    rt.cudaMemcpyKind.cudaMemcpyDeviceToHost))
        finally:
            if not self.stuck:  # else the execution left running may still use them
                if listener is not None:
                    self._debug(None)
                self._free(ptrs)
        floats = {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in outs.items()}
        return floats, times

    def _execute(self, clock: _Clock, seconds: float | None) -> float:
        """One execution, to its end, in ms; on a helper thread (base/limits.py
        `interruptible`), so that Ctrl-C and SIGTERM are seen at once and `seconds` bounds it
        (EvalTimeout). Nothing stops an engine's execution once enqueued (TensorRT and CUDA
        have no call for it): one past the bound, or interrupted, is left behind, and this
        engine with it (`stuck`: never run or closed again, its buffers held)."""
        finished = False

        def work() -> float:
            nonlocal finished
            try:
                clock.start()
                if not self.context.execute_async_v3(int(self.stream)):
                    raise TrtBisectError("TensorRT execution failed (see the TensorRT log above)")
                return clock.stop()
            finally:
                finished = True
        try:
            return limits.interruptible(work, seconds, lambda: None, grace=0.0)
        finally:
            self.stuck = not finished

    def _debug(self, listener: Any) -> None:
        """Attach a debug listener, or detach it: the context is cached and serves later plain
        runs, which must not keep calling a listener of a finished layer-wise run."""
        on = listener is not None
        self.context.set_all_tensors_debug_state(on)
        if hasattr(self.context, "unfused_tensors_debug_state"):  # recent 10.x only
            self.context.unfused_tensors_debug_state = on
        try:
            self.context.set_debug_listener(listener)
        except TypeError:  # a binding that refuses None: debug states are off, nothing is emitted
            pass

    def close(self) -> None:
        _cuda(_cudart().cudaStreamDestroy(self.stream))
        del self.context, self.engine  # the context goes before its engine


class _Clock:
    """Time one enqueue: CUDA events on the stream (GPU time) when the runtime has them, else
    the host clock around enqueue + synchronize (`kind` says which was used)."""

    def __init__(self, rt: Any, stream: Any) -> None:
        self.rt, self.stream = rt, stream
        self.kind = "cuda-events" if hasattr(rt, "cudaEventElapsedTime") else "host"
        self.events = ([_cuda(rt.cudaEventCreate()) for _ in range(2)]
                       if self.kind == "cuda-events" else [])
        self._t0 = 0.0

    def start(self) -> None:
        if self.events:
            _cuda(self.rt.cudaEventRecord(self.events[0], self.stream))
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        """Synchronizes the stream; returns milliseconds."""
        if not self.events:
            _cuda(self.rt.cudaStreamSynchronize(self.stream))
            return (time.perf_counter() - self._t0) * 1e3
        _cuda(self.rt.cudaEventRecord(self.events[1], self.stream))
        _cuda(self.rt.cudaEventSynchronize(self.events[1]))
        return float(_cuda(self.rt.cudaEventElapsedTime(*self.events)))

    def close(self) -> None:
        for event in self.events:
            _cuda(self.rt.cudaEventDestroy(event))
        self.events = []


def latency_clock() -> str:
    """What `latency_ms` measures with the installed cuda-python: cuda-events or host."""
    return "cuda-events" if hasattr(_cudart(), "cudaEventElapsedTime") else "host"


def _listener(sink: dict[str, np.ndarray]) -> Any:
    """An IDebugListener copying every emitted debug tensor into `sink` (floats as float32)."""
    import tensorrt as trt

    class Listener(trt.IDebugListener):
        # The 10.13 stubs say -> None; TensorRT documents "True on success, False otherwise"
        # (docs.nvidia.com/deeplearning/tensorrt/api/python_api/infer/Core/DebugListener.html).
        def process_debug_tensor(  # type: ignore[override]
                self, addr: Any, location: Any, type: trt.DataType, shape: trt.Dims, name: str,
                stream: int) -> bool:
            rt = _cudart()
            host = np.empty(_dims(shape), np.dtype(trt.nptype(type)))
            ptr = addr if isinstance(addr, int) else _capsule_pointer(addr)
            _cuda(rt.cudaStreamSynchronize(stream))
            if location == trt.TensorLocation.HOST:
                ctypes.memmove(host.ctypes.data, ptr, host.nbytes)
            else:
                _cuda(rt.cudaMemcpy(host.ctypes.data, ptr, host.nbytes,
                                    rt.cudaMemcpyKind.cudaMemcpyDeviceToHost))
            sink[name] = host.astype(np.float32) if host.dtype.kind == "f" else host
            return True  # TensorRT reads a false (or None) return as a failed callback

    return Listener()


def _capsule_pointer(capsule: object) -> int:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return int(get(capsule, None) or 0)


@dataclass(frozen=True)
class _Spec:
    """One engine: a plan (or the FP32 reference) plus tensors exposed for layer-wise runs."""

    fp32: frozenset[str]
    reference: bool = False
    marks: tuple[str, ...] = ()
    mark_mode: str = ""


class TrtBackend:
    """The Backend contract on TensorRT engines, plus build accounting and engine inspection."""

    name = "trt"

    def __init__(self, model: onnx.ModelProto | str | Path, *,
                 shapes: Mapping[str, Sequence[int]] | None = None,
                 tolerance: Tolerance | None = None, cache_dir: str | Path | None = None,
                 typing: str = "auto", layerwise: str = "auto", tf32: bool = False,
                 eval_timeout: float | None = None) -> None:
        """`eval_timeout`: seconds one engine execution may run (None: the process's
        --eval-timeout, base/limits.py); past it, EvalTimeout (`_Engine.infer`)."""
        self.trt_version = _ensure_tensorrt()
        ok, self.device = _device_summary()
        if not ok:
            raise TrtBisectError(f"--backend trt needs a CUDA device: {self.device}")
        self.major = int(self.trt_version.split(".")[0])
        if typing not in ("auto", "weak", "strong") or (typing == "weak" and self.major >= 11):
            raise TrtBisectError(f"typing={typing!r}: TensorRT {self.trt_version} supports "
                                 f"{'strong' if self.major >= 11 else 'weak or strong'} typing")
        self.strong = typing == "strong" or (typing == "auto" and self.major >= 11)
        src = load_model(model) if isinstance(model, (str, Path)) else model
        self.model = with_node_names(src)  # parser layer names and metadata then use our names
        self._bytes = self.model.SerializeToString(deterministic=True)
        self._order = node_names(self.model)
        self._known = frozenset(self._order)
        graph = Graph(self.model)
        self._candidates = graph.candidates()
        # no FP16 file holds these in float16 (Range): the judge computes them in FP32, so weak
        # typing keeps them there with every plan, as the TensorRT 10 renderings do
        self._pinned = frozenset(graph.fp32_by_schema())
        self.shapes: dict[str, tuple[int, ...]] = {k: tuple(v) for k, v in (shapes or {}).items()}
        self.tolerance = tolerance or Tolerance()
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.layerwise, self.tf32, self.eval_timeout = layerwise, tf32, eval_timeout
        self.builds = self.cache_hits = 0
        self.warnings: list[str] = []
        self._engines: OrderedDict[_Spec, _Engine] = OrderedDict()
        import tensorrt as trt
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)

    # -- the Backend protocol
    def candidates(self) -> list[str]:
        return list(self._candidates)

    def run(self, fp32_nodes: frozenset[str], feeds: Feeds) -> dict[str, np.ndarray]:
        """Outputs of the plan's engine. Every candidate FP32 is still an FP16 build with
        constraints (what TensorRT can honour); `reference` is the plain FP32 engine."""
        return self._infer(self._spec(fp32_nodes), feeds)[0]

    def reference(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """Outputs of the FP32 engine (no FP16 anywhere, TF32 off): what plans are judged by."""
        return self._infer(_Spec(frozenset(), True), feeds)[0]

    def run_tensors(self, fp16: bool, feeds: Feeds, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Intermediate tensors of the all-FP16 or the FP32 engine, exposed the least invasive
        way this TensorRT has: unfused debug tensors (fusion unchanged), mark_debug, or extra
        outputs. Only tensors the engine materialises come back; fused-away names are missing."""
        mode = self._mark_mode()
        spec = _Spec(frozenset(), not fp16, () if mode == "unfused" else tuple(names), mode)
        sink: dict[str, np.ndarray] = {}
        outs = self._infer(spec, feeds, None if mode == "outputs" else _listener(sink))[0]
        if fp16:
            self._warn_if_marking_masked(feeds, outs)
        got = {**sink, **outs}
        return {n: got[n] for n in names if n in got}

    def close(self) -> None:
        while self._engines:
            self._engines.popitem()[1].close()

    # -- TensorRT extras
    def engine_layers(self, fp32_nodes: Iterable[str] = (),
                      feeds: Feeds | None = None) -> list[tl.EngineLayer]:
        """Layers of a plan's engine, each with the ONNX nodes it contains."""
        engine = self._engine(self._spec(fp32_nodes), feeds)
        return tl.map_layers(engine.layer_info(self.shapes), self._order)

    def latency_ms(self, fp32_nodes: Iterable[str] | None, feeds: Feeds, iterations: int = 50,
                   warmup: int = 10) -> float:
        """Median latency of one inference (no host copies), in milliseconds, of a plan's engine
        or, for `None`, of the FP32 reference engine. GPU time from CUDA events; host time
        around enqueue + synchronize where cuda-python lacks events (`latency_clock()`)."""
        spec = _Spec(frozenset(), True) if fp32_nodes is None else self._spec(fp32_nodes)
        return statistics.median(self._infer(spec, feeds, timed=iterations, warmup=warmup)[1])

    def save_engine(self, path: str | Path, fp32_nodes: Iterable[str] = (),
                    feeds: Feeds | None = None) -> Path:
        _write_bytes(Path(path), self._engine(self._spec(fp32_nodes), feeds).blob)
        return Path(path)

    def write_onnx(self, path: str | Path, fp32_nodes: Iterable[str] = ()) -> Path:
        """The ONNX that trtexec reads: ours with node names filled in, or the mixed model."""
        save_model(Path(path), self._plan_model(frozenset(fp32_nodes)))
        return Path(path)

    def forced_layers(self, fp32_nodes: Iterable[str]) -> dict[str, list[str]]:
        """Network layer -> output types the weak-typing path forces for a plan (no build)."""
        return {} if self.strong else self._network(self._spec(fp32_nodes))[3]

    # -- internals
    def _spec(self, fp32_nodes: Iterable[str]) -> _Spec:
        return _Spec(frozenset(fp32_nodes) & self._known)

    def _mark_mode(self) -> str:
        import tensorrt as trt
        if self.layerwise != "auto":
            return self.layerwise
        net = trt.INetworkDefinition
        return ("unfused" if hasattr(net, "mark_unfused_tensors_as_debug_tensors") else
                "debug" if hasattr(net, "mark_debug") else "outputs")

    def _warn_if_marking_masked(self, feeds: Feeds, marked: dict[str, np.ndarray]) -> None:
        ref, plain = self.reference(feeds), self.run(frozenset(), feeds)
        plain_ok = all(e.passed for e in compare_outputs(ref, plain, self.tolerance).values())
        marked_ok = all(e.passed for e in compare_outputs(ref, marked, self.tolerance).values())
        if marked_ok and not plain_ok:
            msg = ("exposing intermediate tensors changed the FP16 engine: its outputs pass with "
                   "the tensors marked and fail without; layer-wise numbers may miss the fault")
            log.warning(msg)
            self.warnings.append(msg)

    def _plan_model(self, fp32: frozenset[str], reference: bool = False) -> onnx.ModelProto:
        if not self.strong or reference:
            return self.model
        from trtbisect.judge.mixed import write_mixed_onnx
        return write_mixed_onnx(self.model, set(fp32))

    def _infer(self, spec: _Spec, feeds: Feeds, listener: Any = None, **timing: int
               ) -> tuple[dict[str, np.ndarray], list[float]]:
        """The spec's engine run on `feeds` under --eval-timeout; an engine whose execution
        was left running is set aside (never run again, never closed under it)."""
        engine = self._engine(spec, feeds)
        seconds = self.eval_timeout if self.eval_timeout is not None else limits.eval_timeout()
        try:
            return engine.infer(feeds, listener, seconds=seconds, **timing)
        finally:
            if engine.stuck and self._engines.get(spec) is engine:
                del self._engines[spec]

    def _engine(self, spec: _Spec, feeds: Feeds | None) -> _Engine:
        if spec in self._engines:
            self._engines.move_to_end(spec)
            return self._engines[spec]
        if feeds is not None and not self.shapes:
            self.shapes = {k: tuple(v.shape) for k, v in feeds.items()}
        key = tl.plan_key(self._bytes, spec.fp32, self.trt_version, reference=spec.reference,
                          marks=spec.marks, mode=spec.mark_mode, strong=self.strong,
                          shapes=sorted(self.shapes.items()), tf32=self.tf32,
                          device=self.device.split("; ", 1)[-1])  # the GPU, not how many are
                          # visible: a worker seeing one of them shares the parent's engines
        path = self.cache_dir / f"{key}.engine"
        if path.exists():
            self.cache_hits += 1
            blob = path.read_bytes()
        else:
            blob = self._build(spec)
            _write_bytes(path, blob)
        engine = self._engines[spec] = _Engine(blob, self._runtime)
        while len(self._engines) > _ENGINES_IN_MEMORY:
            self._engines.popitem(last=False)[1].close()
        return engine

    def _network(self, spec: _Spec) -> tuple[trt.Builder, trt.INetworkDefinition, trt.OnnxParser,
                                              dict[str, list[str]]]:
        """Parse the plan's model; with weak typing force the plan's layers to FP32 (and those
        no FP16 file holds in float16, `_pinned`).

        Returns builder, network, parser (which must outlive the network) and the forced
        layers with their output types.
        """
        import tensorrt as trt
        builder = trt.Builder(self._logger)
        flags = 0  # TensorRT 11 networks are always strongly typed
        if self.strong and self.major < 11:
            flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, self._logger)
        if not parser.parse(self._plan_model(spec.fp32, spec.reference).SerializeToString()):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise TrtBisectError(f"TensorRT's ONNX parser rejected the model: {errors}")
        forced: dict[str, list[str]] = {}
        pins = spec.fp32 | self._pinned
        for i in range(network.num_layers if pins and not self.strong else 0):
            layer = network.get_layer(i)
            outputs = [layer.get_output(j) for j in range(layer.num_outputs)]
            metadata = getattr(layer, "metadata", "")  # ILayer.metadata: TensorRT 10 onwards
            if (layer.type == trt.LayerType.CONSTANT or not outputs
                    or any(not t.is_execution_tensor or t.dtype not in (trt.float32, trt.float16)
                           for t in outputs)
                    or tl.layer_owner(metadata, layer.name, self._known) not in pins):
                continue
            layer.precision = trt.float32
            for j in range(layer.num_outputs):
                layer.set_output_type(j, trt.float32)
            forced[layer.name] = ["fp32"] * layer.num_outputs
        self._mark(network, spec)
        return builder, network, parser, forced

    def _mark(self, network: trt.INetworkDefinition, spec: _Spec) -> None:
        if spec.mark_mode == "unfused":
            network.mark_unfused_tensors_as_debug_tensors()
            return
        tensors = {}
        for i in range(network.num_layers):
            layer = network.get_layer(i)
            tensors.update({t.name: t for t in map(layer.get_output, range(layer.num_outputs))})
        mark = network.mark_debug if spec.mark_mode == "debug" else network.mark_output
        for name in spec.marks:
            if name in tensors and not tensors[name].is_network_output:
                mark(tensors[name])

    def _build(self, spec: _Spec) -> bytes:
        import tensorrt as trt
        builder, network, _parser, forced = self._network(spec)
        config = builder.create_builder_config()
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
        if not self.tf32 and hasattr(trt.BuilderFlag, "TF32"):  # guarded: TensorRT 11 may drop it
            config.clear_flag(trt.BuilderFlag.TF32)  # FP32 means FP32, as on the emulator
        if not self.strong and not spec.reference:
            config.set_flag(trt.BuilderFlag.FP16)
            if forced:
                config.set_flag(trt.BuilderFlag.OBEY_PRECISION_CONSTRAINTS)
        profile = builder.create_optimization_profile()
        inputs = [network.get_input(i) for i in range(network.num_inputs)]
        for tensor in (t for t in inputs if any(d < 0 for d in _dims(t.shape))):
            if tensor.name not in self.shapes:
                raise TrtBisectError(f"input {tensor.name} has a dynamic shape "
                                     f"{_dims(tensor.shape)}; pass --shape {tensor.name}:1x3x224x224")
            dims = trt.Dims(list(self.shapes[tensor.name]))
            profile.set_shape(tensor.name, dims, dims, dims)
        if any(any(d < 0 for d in _dims(t.shape)) for t in inputs):
            config.add_optimization_profile(profile)
        cache_file = self.cache_dir / f"timing-{self.trt_version}.cache"
        cache = config.create_timing_cache(cache_file.read_bytes() if cache_file.exists() else b"")
        config.set_timing_cache(cache, ignore_mismatch=False)
        log.info("building TensorRT engine %d (%s)", self.builds + 1,
                 "FP32 reference" if spec.reference else f"{len(spec.fp32)} nodes FP32")
        blob = builder.build_serialized_network(network, config)
        if blob is None:
            raise TrtBisectError("TensorRT failed to build the engine (see its log above); with "
                                 "precision constraints, a fused pattern may lack an FP32 kernel")
        self.builds += 1
        _write_bytes(cache_file, bytes(_buffer(config.get_timing_cache().serialize())))
        return bytes(_buffer(blob))


def _buffer(mem: Any) -> memoryview:
    return memoryview(mem)  # IHostMemory exposes the buffer protocol (not in the 10.13 stubs)
