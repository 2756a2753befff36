"""The TensorRT backend.

Without TensorRT (every machine CI has): the package imports, `--backend trt` fails with exit 2
and a hint, `trtbisect env` rows say why, and the backend meets the Backend contract on paper.
With the `trt` marker, on a machine with TensorRT, cuda-python and a CUDA GPU: real engines.
Those tests skip anywhere else; nothing in this file has been run on TensorRT by CI.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import pickle
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import pytest

from trtbisect.backends import base
from trtbisect.backends import trt as trt_backend
from trtbisect.errors import EXIT_USAGE, TrtBisectError
from trtbisect.graph import node_names
from trtbisect.judge.compare import Tolerance, compare_outputs
from trtbisect.stages.trt import TrtSearchOptions, run_trt_search

BLOCK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in {'tensorrt', 'tensorrt_bindings', 'cuda', 'polygraphy', 'torch'}:
            raise ImportError('blocked ' + name)
sys.meta_path.insert(0, Block())
"""


def run_blocked(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True,
                          cwd=Path(__file__).parents[2], timeout=120)


def test_imports_without_tensorrt_cuda_or_torch():
    proc = run_blocked(
        "import trtbisect, trtbisect.judge.trt_layers, trtbisect.backends.trt, trtbisect.cli\n"
        "heavy = [m for m in ('tensorrt', 'cuda', 'torch', 'polygraphy') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "from trtbisect.backends.trt import backend_status, trt_available\n"
        "rows = {name: (ok, why) for name, ok, why in backend_status()}\n"
        "assert rows['tensorrt'][0] is False and 'pip install' in rows['tensorrt'][1]\n"
        "assert rows['--backend trt'][0] is False and rows['torch'][0] is False\n"
        "assert trt_available()[0] is False\n"
        "print('ok')\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_backend_trt_without_tensorrt_is_a_usage_error(monkeypatch, zoo, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt -> ImportError
    with pytest.raises(TrtBisectError) as err:
        trt_backend.TrtBackend(zoo["layernorm_overflow"].model)
    assert err.value.exit_code == EXIT_USAGE
    assert "tensorrt is not installed" in str(err.value) and "pip install" in str(err.value)
    with pytest.raises(TrtBisectError) as err:
        run_trt_search(zoo["layernorm_overflow"].model, [{}], tmp_path / "out")
    assert err.value.exit_code == EXIT_USAGE and not (tmp_path / "out").exists()
    with pytest.raises(TrtBisectError, match="at least one input sample"):
        run_trt_search(zoo["layernorm_overflow"].model, [], tmp_path / "out")


@contextlib.contextmanager
def restored_tensorrt_modules():
    """sys.modules' tensorrt entries exactly as before, present or absent.

    monkeypatch.delitem(..., raising=False) on an absent key records nothing to undo, so a
    module imported during a test would stay and hide a real TensorRT from later tests.
    """
    def mine(name: str) -> bool:
        return name.partition(".")[0] in ("tensorrt", "tensorrt_bindings")
    saved = {k: v for k, v in sys.modules.items() if mine(k)}
    for k in saved:
        del sys.modules[k]
    try:
        yield
    finally:
        for k in [k for k in sys.modules if mine(k)]:
            del sys.modules[k]
        sys.modules.update(saved)


@pytest.fixture
def no_tensorrt_leak():
    with restored_tensorrt_modules():
        yield


def test_stubs_only_tensorrt_is_not_tensorrt(no_tensorrt_leak, monkeypatch, tmp_path, zoo):
    """`pip install tensorrt-stubs` leaves a `tensorrt/` holding only .pyi files, which Python
    imports as an empty namespace package: that must read as 'TensorRT missing'."""
    (tmp_path / "tensorrt").mkdir()
    (tmp_path / "tensorrt" / "__init__.pyi").write_text("class Builder: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TrtBisectError) as err:
        trt_backend.TrtBackend(zoo["layernorm_overflow"].model)
    assert err.value.exit_code == EXIT_USAGE and "stubs" in str(err.value)
    ok, why = trt_backend.trt_available()
    assert not ok and "stubs" in why


def test_restoring_sys_modules_removes_a_tensorrt_imported_during_the_test(tmp_path):
    """The fixture above, checked: what a test imported is gone, what was there is back."""
    before = sys.modules.get("tensorrt", "absent")
    (tmp_path / "tensorrt").mkdir()
    sys.path.insert(0, str(tmp_path))
    try:
        with restored_tensorrt_modules():
            importlib.import_module("tensorrt")  # the empty namespace package under tmp_path
            assert sys.modules["tensorrt"].__path__[0].startswith(str(tmp_path))
    finally:
        sys.path.remove(str(tmp_path))
    assert sys.modules.get("tensorrt", "absent") is before


def test_cache_dir_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TRTBISECT_CACHE_DIR", str(tmp_path / "engines"))
    assert trt_backend.default_cache_dir() == tmp_path / "engines"
    monkeypatch.delenv("TRTBISECT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert trt_backend.default_cache_dir() == tmp_path / "xdg" / "trtbisect" / "engines"


def fake_tensorrt(version: str = "10.13.0.35") -> types.ModuleType:
    mod = types.ModuleType("tensorrt")
    mod.Builder = object  # type: ignore[attr-defined]
    mod.__version__ = version  # type: ignore[attr-defined]
    return mod


def test_tensorrt_without_cuda_device_is_a_usage_error(monkeypatch, zoo):
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt())
    for name in ("cuda", "cuda.bindings", "cuda.bindings.runtime", "cuda.cudart"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(TrtBisectError) as err:
        trt_backend.TrtBackend(zoo["layernorm_overflow"].model)
    assert err.value.exit_code == EXIT_USAGE and "CUDA device" in str(err.value)
    rows = {name: (ok, why) for name, ok, why in trt_backend.backend_status()}
    assert rows["tensorrt"] == (True, "TensorRT 10.13.0.35")
    assert rows["cuda (cuda-python)"][0] is False and rows["--backend trt"][0] is False


def test_cuda_python_seeing_no_device(monkeypatch):
    runtime = types.ModuleType("cuda.bindings.runtime")
    runtime.cudaGetDeviceCount = lambda: (0, 0)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt("11.4.0"))
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", runtime)
    ok, why = trt_backend.trt_available()
    assert not ok and why == "TensorRT 11.4.0; cuda-python is installed but sees no CUDA device"


def test_cuda_errors_become_user_errors():
    class Err(int):
        @property
        def value(self) -> int:
            return int(self)
    assert trt_backend._cuda((Err(0), 42)) == 42
    assert trt_backend._cuda((Err(0),)) is None
    with pytest.raises(TrtBisectError, match="CUDA call failed"):
        trt_backend._cuda((Err(100), 0))


def test_backend_matches_the_protocol():
    """Same members and parameter names as base.Backend, so the pipeline can swap backends."""
    for member in ("candidates", "run", "run_tensors", "close"):
        want = list(inspect.signature(getattr(base.Backend, member)).parameters)
        got = list(inspect.signature(getattr(trt_backend.TrtBackend, member)).parameters)
        assert got == want, member
    assert trt_backend.TrtBackend.name == "trt"
    for extra in ("reference", "engine_layers", "latency_ms", "save_engine", "write_onnx",
                  "forced_layers"):
        assert callable(getattr(trt_backend.TrtBackend, extra))


# ---------------------------------------------- trt.py end to end on a fake TensorRT (CPU)

def load_fake():
    path = Path(__file__).parents[1] / "fixtures" / "trt" / "fake_tensorrt.py"
    spec = importlib.util.spec_from_file_location("fake_tensorrt", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fake_tensorrt"] = module
    spec.loader.exec_module(module)
    return module


fake = load_fake()
LN = "layernorm_overflow"


def emulator_check(z):
    from trtbisect.backends.ort import Emulator, Reference
    from trtbisect.graph import Graph
    graph = Graph(z.model)
    ref, emu = Reference(graph).run(z.inputs), Emulator(graph)

    def check(fp32):
        return all(e.passed for e in compare_outputs(ref, emu.run(fp32, z.inputs), Tolerance()).values())
    return check


def test_fake_trt10_agreement_costs_three_builds(monkeypatch, zoo, tmp_path):
    """Emulator and (fake) TensorRT agree: FP32 + FP16 + final, then nothing on a rerun."""
    _, cuda = fake.install(monkeypatch)
    z = zoo[LN]
    report = run_trt_search(z.model, [z.inputs], tmp_path / "out",
                            TrtSearchOptions(cache_dir=tmp_path / "c"),
                            emulator_check=emulator_check(z))
    r = report.result
    assert set(r.fp32) == z.expected_fp32 and r.emulator_agreed and r.trt_only == []
    assert report.builds == 3 == fake.builds() and r.trt_checks == 2
    assert report.trt_version == "10.13.0.35" and not report.strongly_typed
    assert [p.status for p in report.precision] == ["honoured"] * len(z.expected_fp32)
    assert set(report.latency_ms) == {"fp32", "fp16", "final"}
    assert report.trtexec.startswith(f"trtexec --onnx={tmp_path / 'out' / 'model_named.onnx'} --fp16 "
                                     "--precisionConstraints=obey --layerPrecisions=")
    for node in z.expected_fp32:
        assert f"{node}:fp32" in report.trtexec
    assert "--precision-constraints obey" in report.polygraphy
    layer_map = json.loads(Path(report.files["layer_map"]).read_text())
    assert set(layer_map["nodes"]) == set(z.expected_fp32) | set(layer_map["nodes"])
    assert Path(report.files["engine"]).read_bytes()
    assert not cuda.memory and cuda.streams == 0  # every buffer and stream released
    json.dumps(report.to_json())

    again = run_trt_search(z.model, [z.inputs], tmp_path / "out2",
                           TrtSearchOptions(cache_dir=tmp_path / "c"), emulator_plan=r.fp32)
    assert again.builds == 0 and again.cache_hits >= 3 and again.result.fp32 == r.fp32


def test_fake_trt10_fusion_disagreement_is_refined(monkeypatch, zoo, tmp_path):
    """The fake fuses ln/Sub with ln/Pow: Pow's FP32 request only holds with Sub FP32 too."""
    fake.install(monkeypatch, fused=[("ln/Sub", "ln/Pow")])
    z = zoo[LN]
    report = run_trt_search(z.model, [z.inputs], tmp_path / "out",
                            TrtSearchOptions(cache_dir=tmp_path / "c"),
                            emulator_plan=sorted(z.expected_fp32))
    r = report.result
    assert r.emulator_agreed is False and r.trt_only == ["ln/Sub"]
    assert set(r.fp32) == z.expected_fp32 | {"ln/Sub"}
    assert r.culprit_layers == ["ln/Sub + ln/Pow"]
    assert report.builds == 1 + r.trt_checks  # FP32 reference + one build per TensorRT check
    assert ("engine layer `ln/Sub + ln/Pow` contains ONNX nodes ln/Sub, ln/Pow; "
            "ln/Sub, ln/Pow must stay FP32") in report.culprits


def test_fake_swallowed_request_is_flagged(monkeypatch, zoo, tmp_path):
    fake.install(monkeypatch, swallowed={"mlp/Relu"})
    z = zoo[LN]
    backend = trt_backend.TrtBackend(z.model, cache_dir=tmp_path)
    try:
        plan = ["mlp/Relu", "ln/Pow"]
        checks = {c.node: c.status for c in
                  trt_backend.tl.check_precisions(backend.engine_layers(plan, z.inputs), plan)}
        assert checks == {"mlp/Relu": "not-honoured", "ln/Pow": "honoured"}
        assert list(backend.forced_layers(plan)) == plan  # both were asked for
    finally:
        backend.close()


def test_fake_request_trt_never_honours_ends_without_plan(monkeypatch, zoo, tmp_path):
    """ln/Pow is always swallowed into FP16: no plan passes, and the report says why."""
    fake.install(monkeypatch, swallowed={"ln/Pow"})
    z = zoo[LN]
    report = run_trt_search(z.model, [z.inputs], tmp_path / "out",
                            TrtSearchOptions(cache_dir=tmp_path / "c"),
                            emulator_plan=sorted(z.expected_fp32))
    r = report.result
    assert not r.found and r.emulator_agreed is False
    assert [t["phase"] for t in r.trials] == ["fp16", "verify", "layers"]  # all-FP32 fails too
    assert report.builds == 4 and len(r.fp32) == len(zoo[LN].model.graph.node)
    assert any(w.startswith("FP32 request for ln/Pow not honoured") for w in report.warnings)


@pytest.mark.parametrize("mode", ["unfused", "debug", "outputs"])
def test_fake_layerwise_modes(monkeypatch, zoo, tmp_path, mode):
    fake.install(monkeypatch, fused=[("ln/Sub", "ln/Pow")])
    z = zoo[LN]
    backend = trt_backend.TrtBackend(z.model, cache_dir=tmp_path, layerwise=mode)
    names = ["residual/Add_output_0", "ln/Sub_output_0", "ln/Pow_output_0", "ln/Sqrt_output_0"]
    assert {t for n in z.model.graph.node for t in n.output} >= set(names)
    try:
        fp16 = backend.run_tensors(True, z.inputs, names)
        fp32 = backend.run_tensors(False, z.inputs, names)
    finally:
        backend.close()
    hidden = {"ln/Sub_output_0"} if mode == "unfused" else set()  # fused away: not emitted
    assert set(fp16) == set(fp32) == set(names) - hidden
    assert np.isinf(fp16["ln/Pow_output_0"]).any() and np.isfinite(fp32["ln/Pow_output_0"]).all()
    assert all(v.dtype == np.float32 for v in fp16.values())


@pytest.mark.parametrize("changes", [False, True])
def test_fake_marking_that_hides_the_fault_is_reported(monkeypatch, zoo, tmp_path, changes):
    fake.install(monkeypatch, marking_changes_engine=changes)
    z = zoo[LN]
    backend = trt_backend.TrtBackend(z.model, cache_dir=tmp_path, layerwise="outputs")
    try:
        tensors = backend.run_tensors(True, z.inputs, ["ln/Pow_output_0"])
    finally:
        backend.close()
    assert np.isinf(tensors["ln/Pow_output_0"]).any() != changes
    assert bool(backend.warnings) == changes
    assert all("exposing intermediate tensors changed the FP16 engine" in w for w in backend.warnings)


def test_fake_trt11_builds_the_mixed_onnx(monkeypatch, zoo, tmp_path):
    fake.install(monkeypatch, version="11.4.0.106")
    z = zoo[LN]
    report = run_trt_search(z.model, [z.inputs], tmp_path / "out",
                            TrtSearchOptions(cache_dir=tmp_path / "c"),
                            emulator_plan=sorted(z.expected_fp32))
    assert report.strongly_typed and report.result.emulator_agreed and report.builds == 3
    assert set(report.result.fp32) == z.expected_fp32
    mixed = onnx.load(report.files["onnx"])
    assert Path(report.files["onnx"]).name == "final_mixed.onnx"
    assert any(n.op_type == "Cast" for n in mixed.graph.node)
    assert report.trtexec == (f"trtexec --onnx={report.files['onnx']} --stronglyTyped --noTF32 "
                              "--minShapes=x:1x16x32 --optShapes=x:1x16x32 --maxShapes=x:1x16x32 "
                              f"--profilingVerbosity=detailed --saveEngine={report.files['engine']}")
    with pytest.raises(TrtBisectError, match="typing='weak'"):
        trt_backend.TrtBackend(z.model, cache_dir=tmp_path, typing="weak")


def test_fake_dynamic_input_needs_a_shape(monkeypatch, zoo, tmp_path):
    fake.install(monkeypatch)
    model = onnx.ModelProto()
    model.CopyFrom(zoo[LN].model)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    backend = trt_backend.TrtBackend(model, cache_dir=tmp_path)
    try:
        with pytest.raises(TrtBisectError, match="pass --shape x:"):
            backend.engine_layers(())
    finally:
        backend.close()
    backend = trt_backend.TrtBackend(model, cache_dir=tmp_path, shapes={"x": (1, 16, 32)})
    try:
        assert backend.engine_layers(())
        blob = pickle.loads((next(tmp_path.glob("*.engine"))).read_bytes())
        assert blob["profiles"] == [{"x": ((1, 16, 32),) * 3}]
    finally:
        backend.close()


# ------------------------------------- TensorRT behaviours the backend once got wrong (fake)

def test_fake_debug_listener_succeeds_and_is_detached_after_the_run(monkeypatch, zoo, tmp_path):
    """process_debug_tensor must return True (None reads as failure), and the listener must
    not stay attached to the cached context, where later runs would keep calling it."""
    fake.install(monkeypatch)
    z = zoo[LN]
    backend = trt_backend.TrtBackend(z.model, cache_dir=tmp_path, layerwise="debug")
    try:
        got = backend.run_tensors(True, z.inputs, ["ln/Pow_output_0"])
        assert np.isinf(got["ln/Pow_output_0"]).any()
        for engine in backend._engines.values():
            calls = engine.context._debug_calls
            engine.infer(z.inputs)  # a later plain run on the same cached context
            assert engine.context._debug_calls == calls
    finally:
        backend.close()


def test_fake_record_separated_fused_metadata_names_exactly_its_nodes(monkeypatch, zoo, tmp_path):
    """Fused metadata joined by \\x1e: read whole, the entry is one unknown name and the
    ForeignNode range ln/Pow...ln/Sqrt would pull in ln/ReduceMean_1 and ln/Add."""
    fake.install(monkeypatch, fused=[("ln/Pow", "ln/Sqrt")], foreign=True)
    z = zoo[LN]
    backend = trt_backend.TrtBackend(z.model, cache_dir=tmp_path)
    try:
        layers = {layer.name: layer for layer in backend.engine_layers((), z.inputs)}
    finally:
        backend.close()
    fused = layers["{ForeignNode[ln/Pow...ln/Sqrt]}"]
    assert fused.nodes == ("ln/Pow", "ln/Sqrt") and fused.source == "metadata"


def test_fake_request_read_in_fp32_but_written_in_fp16_is_not_honoured(monkeypatch, zoo, tmp_path):
    """mlp/Relu reads mlp/fc1/Add's FP32 output but is swallowed into FP16: an FP32 tensor
    touching the layer is no proof; its own output type is."""
    fake.install(monkeypatch, swallowed={"mlp/Relu"})
    z = zoo[LN]
    backend = trt_backend.TrtBackend(z.model, cache_dir=tmp_path)
    try:
        plan = ["mlp/fc1/Add", "mlp/Relu"]
        checks = {c.node: c.status for c in
                  trt_backend.tl.check_precisions(backend.engine_layers(plan, z.inputs), plan)}
    finally:
        backend.close()
    assert checks == {"mlp/fc1/Add": "honoured", "mlp/Relu": "not-honoured"}


def test_fake_latency_is_gpu_time_from_cuda_events(monkeypatch, zoo, tmp_path):
    """The fake GPU clock advances EXEC_MS per execution and nothing else: CUDA events measure
    exactly that; a host timer around enqueue + sync measures the host's work too."""
    fake.install(monkeypatch)
    z = zoo[LN]
    report = run_trt_search(z.model, [z.inputs], tmp_path / "out",
                            TrtSearchOptions(cache_dir=tmp_path / "c"),
                            emulator_plan=sorted(z.expected_fp32))
    assert report.latency_ms == dict.fromkeys(("fp32", "fp16", "final"), fake.EXEC_MS)
    assert report.latency_clock == "cuda-events" and report.to_json()["latency_clock"]


def test_fake_latency_without_cuda_events_is_labelled_host_time(monkeypatch, zoo, tmp_path):
    fake.install(monkeypatch)
    monkeypatch.delattr(fake._CudaRuntime, "cudaEventElapsedTime")
    z = zoo[LN]
    report = run_trt_search(z.model, [z.inputs], tmp_path / "out",
                            TrtSearchOptions(cache_dir=tmp_path / "c"),
                            emulator_plan=sorted(z.expected_fp32))
    assert report.latency_clock == "host" and all(v > 0 for v in report.latency_ms.values())


def test_fake_interrupted_cache_write_leaves_no_partial_file(monkeypatch, zoo, tmp_path):
    """Engines and the timing cache go through a temp file and os.replace: a run killed while
    writing leaves nothing that a later run would read as a (truncated) cached engine."""
    fake.install(monkeypatch)
    z = zoo[LN]
    backend = trt_backend.TrtBackend(z.model, cache_dir=tmp_path / "c")

    def killed(src, dst):
        raise KeyboardInterrupt
    monkeypatch.setattr(os, "replace", killed)
    try:
        with pytest.raises(KeyboardInterrupt):
            backend.run(frozenset(), z.inputs)
    finally:
        backend.close()
    assert list((tmp_path / "c").iterdir()) == []


@pytest.mark.parametrize("version", ["10.13.0.35", "11.4.0.106"])
def test_fake_tensorrt_without_a_tf32_flag_still_builds(monkeypatch, zoo, tmp_path, version):
    fake.install(monkeypatch, version=version, tf32_flag=False)
    z = zoo[LN]
    backend = trt_backend.TrtBackend(z.model, cache_dir=tmp_path)
    try:
        out = backend.run(frozenset(z.expected_fp32), z.inputs)
    finally:
        backend.close()
    assert all(np.isfinite(v).all() for v in out.values())


# ------------------------------------------------------------------ real TensorRT (opt-in)

@pytest.fixture(scope="module")
def gpu():
    ok, why = trt_backend.trt_available()
    if not ok:
        pytest.skip(f"TensorRT backend not usable here: {why}")
    return why


def ort_reference(model, feeds):
    import onnxruntime as ort
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(feeds))))


@pytest.mark.trt
def test_fp32_engine_matches_onnxruntime(gpu, zoo, tmp_path):
    z = zoo["layernorm_overflow"]
    backend = trt_backend.TrtBackend(z.model, cache_dir=tmp_path)
    try:
        got = backend.reference(z.inputs)
        errors = compare_outputs(ort_reference(z.model, z.inputs), got, Tolerance(rtol=1e-3))
        assert all(e.passed for e in errors.values()), errors
        assert backend.builds == 1
    finally:
        backend.close()


@pytest.mark.trt
def test_engine_layers_map_back_to_onnx_nodes(gpu, zoo, tmp_path):
    z = zoo["layernorm_overflow"]
    backend = trt_backend.TrtBackend(z.model, cache_dir=tmp_path)
    try:
        layers = backend.engine_layers((), z.inputs)
        order = backend.candidates()
        mapped = {n for layer in layers for n in layer.nodes}
        assert mapped and mapped <= set(node_names(backend.model))
        assert len(mapped & set(order)) >= len(order) // 2  # most candidates are found
        assert any(layer.source == "metadata" for layer in layers)
        assert any("fp16" in layer.float_dtypes for layer in layers)  # it is an FP16 engine
    finally:
        backend.close()


@pytest.mark.trt
def test_layerwise_tensors_and_engine_cache(gpu, zoo, tmp_path):
    z = zoo["layernorm_overflow"]
    backend = trt_backend.TrtBackend(z.model, cache_dir=tmp_path)
    names = [o for node in z.model.graph.node for o in node.output][:8]
    try:
        tensors = backend.run_tensors(True, z.inputs, names)
        assert tensors and set(tensors) <= set(names)
        assert all(v.dtype == np.float32 for v in tensors.values() if v.dtype.kind == "f")
        backend.run(frozenset(), z.inputs)
        built = backend.builds
    finally:
        backend.close()
    again = trt_backend.TrtBackend(z.model, cache_dir=tmp_path)
    try:
        again.run(frozenset(), z.inputs)
        assert again.builds == 0 and again.cache_hits == 1 and built >= 1
    finally:
        again.close()


@pytest.mark.trt
def test_run_trt_search_verifies_the_emulator_plan(gpu, zoo, tmp_path):
    z = zoo["layernorm_overflow"]
    report = run_trt_search(z.model, [z.inputs], tmp_path / "out",
                            TrtSearchOptions(cache_dir=tmp_path / "cache"),
                            emulator_plan=sorted(z.expected_fp32))
    r = report.result
    assert r.found and set(r.emulator_fp32 or ()) == set(z.expected_fp32)
    if r.emulator_agreed:
        assert report.builds <= 3  # FP32, FP16, final
    assert set(report.latency_ms) == {"fp32", "fp16", "final"}
    for path in report.files.values():
        assert Path(path).stat().st_size > 0
    assert json.loads(Path(report.files["layer_map"]).read_text())["layers"]
    assert report.trtexec.startswith("trtexec --onnx=")
    assert ("--stronglyTyped" in report.trtexec) == report.strongly_typed
    json.dumps(report.to_json())
