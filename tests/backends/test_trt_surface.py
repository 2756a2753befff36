"""TensorRT's real API, checked without TensorRT (issue #22).

`trtbisect/backends/trt_surface/<release>.json` is the API of NVIDIA's bindings wheels for
TensorRT 10.13 and 11.4 (`scripts/trt_surface.py`). The fake TensorRT the tests run on is that
surface (`tests/fixtures/trt/fake_tensorrt.py`): a name its release lacks raises AttributeError,
and every name used from outside the fake is recorded. Here:

* the committed surfaces hold what the real wheels say, and the fake raises for every member
  11.4 removed;
* trt.py's code paths, driven on the fake of each release (TensorRT 10 weak and strong typing,
  TensorRT 11, the three layer-wise modes, dynamic shapes, a release without BuilderFlag.TF32),
  use only names that release has, and probe absent ones only through hasattr/getattr;
* every TensorRT name trt.py and trt_layers.py mention was reached on one of those paths (a
  static AST pass against the dynamic record), so a branch no fake run takes cannot hide a
  removed name;
* the Python snippets render.py writes run on the fake of their target release (the TensorRT 10
  one on 10.13 only, the strongly typed one on both), and every TensorRT name in them resolves.

Each check is also run on a planted use of a removed name, which must fail it.
"""

from __future__ import annotations

import ast
import json
import runpy
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest

from tests.backends.test_trt_backend import fake
from trtbisect.backends import trt as trt_backend
from trtbisect.backends import trt_surface
from trtbisect.errors import TrtBisectError
from trtbisect.outputs import render
from trtbisect.stages.trt import TrtSearchOptions, run_trt_search

ROOT = Path(__file__).resolve().parents[2]
TRT_PY = ROOT / "trtbisect" / "backends" / "trt.py"
TRT_LAYERS_PY = ROOT / "trtbisect" / "judge" / "trt_layers.py"
LN = "layernorm_overflow"
S10, S11 = trt_surface.load(10), trt_surface.load(11)


# ------------------------------------------------------------------------ the surfaces

def test_surfaces_are_the_pinned_wheels(monkeypatch):
    """The committed files come from the wheels scripts/trt_surface.py pins (a refresh that
    changes a pin must regenerate the file, and the reverse)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("trt_surface_script",
                                                  ROOT / "scripts" / "trt_surface.py")
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, script)
    spec.loader.exec_module(script)
    assert trt_surface.releases() == sorted(trt_surface.CHECKED.values()) == ["10.13", "11.4"]
    for pin in script.PINS:
        data = json.loads((trt_surface.HERE / f"{pin.release}.json").read_text())
        assert (data["tensorrt"], data["sha256"]) == (pin.version, pin.sha256)
        assert data["wheel"].startswith(pin.dist.replace("-", "_") + f"-{pin.version}-")
        assert (trt_surface.HERE / f"{pin.release}.json").read_text() == script.dumps(data)


def test_surfaces_say_what_the_release_notes_say():
    """TensorRT 11 removed weak typing (https://docs.nvidia.com/deeplearning/tensorrt/11.4.0/
    api/migration/tensorrt-10x-to-11x.html); the binaries agree, name by name."""
    weak = {"set_output_type", "precision", "reset_precision", "precision_is_set",
            "reset_output_type", "output_type_is_set"}
    assert weak <= S10.members("ILayer") and not weak & S11.members("ILayer")
    assert {"get_output_type", "metadata", "name", "num_outputs"} <= S11.members("ILayer")
    for flag in ("FP16", "OBEY_PRECISION_CONSTRAINTS", "PREFER_PRECISION_CONSTRAINTS", "INT8"):
        assert S10.has("BuilderFlag", flag) and not S11.has("BuilderFlag", flag)
    assert S10.has("BuilderFlag", "TF32") and S11.has("BuilderFlag", "TF32")
    # an inherited member is reachable, an enum's values are too
    assert S11.has("IConvolutionLayer", "get_output") and S11.has("DataType", "HALF")
    assert S11.enums["NetworkDefinitionCreationFlag"]["STRONGLY_TYPED"] == 0  # 1 in 10.13
    assert S10.enums["NetworkDefinitionCreationFlag"]["STRONGLY_TYPED"] == 1
    assert S10.module["float32"] == S11.module["float32"] == "DataType.FLOAT"


def removed_in_11() -> list[tuple[str, str]]:
    """(class, member) of the classes the fake imitates that 10.13 has and 11.4 does not."""
    owners = sorted({cls._trt for cls in fake.CLASSES} | {"BuilderFlag",
                                                          "NetworkDefinitionCreationFlag"})
    return [(o, n) for o in owners for n in sorted(S10.members(o) - S11.members(o))]


def test_the_fake_imitating_11_lacks_every_removed_member(monkeypatch):
    """Imitating 11.4, each member 11.4 removed from a class the fake imitates raises
    AttributeError (as on the real module): read on the class, and read or written on an
    object (ILayer's weak-typing calls, BuilderFlag.FP16); imitating 10.13 none of them does."""
    removed = removed_in_11()
    assert len(removed) == 40 and ("ILayer", "set_output_type") in removed
    for version, absent in (("11.4.0.106", True), ("10.13.0.35", False)):
        trt, _ = fake.install(monkeypatch, version=version)
        targets = {cls._trt: cls for cls in fake.CLASSES}
        targets.update(BuilderFlag=trt.BuilderFlag,
                       NetworkDefinitionCreationFlag=trt.NetworkDefinitionCreationFlag)
        for owner, name in removed:
            if absent:
                with pytest.raises(AttributeError, match=name):
                    getattr(targets[owner], name)
                assert not hasattr(targets[owner], name)
            else:
                try:
                    getattr(targets[owner], name)
                except NotImplementedError:
                    pass  # 10.13 has it; the fake does not implement it
        layer = fake._Layer("n", "Relu", [])
        with pytest.raises(AttributeError) if absent else nullcontext():
            layer.precision = trt.float32
        with pytest.raises(AttributeError) if absent else nullcontext():
            layer.set_output_type(0, trt.float32)
        with pytest.raises(AttributeError) if absent else nullcontext():
            trt.Builder(trt.Logger(trt.Logger.WARNING)).create_builder_config().set_flag(
                trt.BuilderFlag.FP16)


def test_the_fake_defines_only_real_api(monkeypatch):
    """A public name a fake class defines, or the fake's own code sets, must be a member of that
    TensorRT class in a checked release: the fake cannot invent API."""
    fake.install(monkeypatch)
    fake.check_fake_classes()

    class Invented(fake._Guarded):
        _trt = "ILayer"

        def set_output_types(self):  # a typo of set_output_type: no release has it
            pass

    monkeypatch.setattr(fake, "CLASSES", fake.CLASSES + (Invented,))
    with pytest.raises(TypeError, match="set_output_types"):
        fake.check_fake_classes()
    code = compile("layer.precisions = 1", fake.__file__, "exec")  # as if the fake's own line
    with pytest.raises(TypeError, match="invents ILayer.precisions"):
        exec(code, {"layer": fake._Layer("n", "Relu", [])})


# ------------------------------------------------------ trt.py driven on every release

@dataclass(frozen=True)
class Run:
    label: str
    accesses: tuple[fake.Access, ...]


def drive(monkeypatch, zoo, tmp: Path) -> list[Run]:
    """trt.py's code paths, each on the fake of the release it targets."""
    z = zoo[LN]
    runs = []

    def record(label: str, version: str, body, **install) -> None:
        fake.install(monkeypatch, version=version, **install)
        body()
        runs.append(Run(label, tuple(fake.ACCESSES)))

    def search(typing: str = "auto") -> None:
        out = tmp / f"out-{len(runs)}"
        run_trt_search(z.model, [z.inputs], out,
                       TrtSearchOptions(cache_dir=tmp / f"c-{len(runs)}", typing=typing),
                       emulator_plan=sorted(z.expected_fp32))
        trt_backend.backend_status()

    def layerwise(mode: str) -> None:
        backend = trt_backend.TrtBackend(z.model, cache_dir=tmp / f"c-{len(runs)}",
                                         layerwise=mode)
        try:
            backend.run_tensors(True, z.inputs, ["ln/Pow_output_0", "ln/Sqrt_output_0"])
        finally:
            backend.close()

    def dynamic() -> None:
        model = onnx.ModelProto()
        model.CopyFrom(z.model)
        model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
        backend = trt_backend.TrtBackend(model, cache_dir=tmp / f"c-{len(runs)}",
                                         shapes={"x": (1, 16, 32)})
        try:
            backend.run(frozenset(z.expected_fp32), z.inputs)
        finally:
            backend.close()

    def fails(body, match: str):
        def run() -> None:
            with pytest.raises(TrtBisectError, match=match):
                body()
        return run

    def dynamic_without_shape() -> None:
        model = onnx.ModelProto()
        model.CopyFrom(z.model)
        model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
        backend = trt_backend.TrtBackend(model, cache_dir=tmp / f"c-{len(runs)}")
        try:
            backend.engine_layers(())
        finally:
            backend.close()

    unfused = "INetworkDefinition.mark_unfused_tensors_as_debug_tensors"
    for version in ("10.13.0.35", "11.4.0.106"):
        major = version.split(".")[0]
        record(f"{major}: search", version, search, fused=[("ln/Sub", "ln/Pow")])
        for mode in ("unfused", "debug", "outputs"):
            record(f"{major}: layer-wise {mode}", version, lambda m=mode: layerwise(m),
                   marking_changes_engine=True)
        record(f"{major}: layer-wise auto", version, lambda: layerwise("auto"))
        record(f"{major}: layer-wise auto, no unfused marking", version,
               lambda: layerwise("auto"), without=[unfused])
        record(f"{major}: layer-wise auto, no debug tensors", version,
               lambda: layerwise("auto"), without=[unfused, "INetworkDefinition.mark_debug"])
        record(f"{major}: dynamic input", version, dynamic)
        record(f"{major}: dynamic input, no --shape", version,
               fails(dynamic_without_shape, "pass --shape"))
        record(f"{major}: no BuilderFlag.TF32", version, dynamic, tf32_flag=False)
        record(f"{major}: parser error", version, fails(search, "parser rejected"),
               parse_error="unsupported op")
    record("10: strong typing", "10.13.0.35", lambda: search(typing="strong"))
    return runs


@pytest.fixture(scope="module")
def runs(zoo, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        yield drive(mp, zoo, tmp_path_factory.mktemp("drive"))


def test_every_path_uses_only_its_releases_names(runs):
    """The fake raised on any absent name, so the runs finishing proves most of it; here: each
    absent name was only probed (hasattr/getattr with a default) on the line that names it."""
    probes = probe_lines(TRT_PY.read_text())
    for run in runs:
        mine = [a for a in run.accesses if Path(a.file) == TRT_PY]
        assert mine, run.label
        for a in mine:
            if not a.present:
                assert (a.line, a.name) in probes, (run.label, a)


def test_the_11_path_never_reaches_weak_typing(runs):
    removed = {n for _, n in removed_in_11()}
    for run in runs:
        if run.label.startswith("11"):
            used = {a.name for a in run.accesses if a.present}
            assert not used & removed, (run.label, used & removed)
    weak = {a.name for run in runs if run.label == "10: search" for a in run.accesses}
    assert {"precision", "set_output_type", "FP16", "OBEY_PRECISION_CONSTRAINTS"} <= weak


def api_table(runs: list[Run]) -> str:
    """The TensorRT names trt.py used on each path, as the markdown table docs/tensorrt.md
    shows (its `api-table` block)."""
    used: dict[str, dict[str, set[str]]] = {}
    for run in runs:
        column = run.label.split(":")[0]
        for a in run.accesses:
            if Path(a.file) == TRT_PY and a.present:
                name = f"{a.name}*" if run.label == "10: strong typing" else a.name
                used.setdefault(a.owner or "tensorrt", {}).setdefault(column, set()).add(name)
    for columns in used.values():  # a name used by weak typing too needs no star
        columns["10"] = {n for n in columns.get("10", set())
                         if not (n.endswith("*") and n[:-1] in columns["10"])}
    lines = ["| class | TensorRT 10.13 | TensorRT 11.4 |", "|---|---|---|"]
    for owner in sorted(used, key=lambda o: (o != "tensorrt", o)):
        cells = [", ".join(f"`{n}`" for n in sorted(used[owner].get(c, ()))) for c in ("10", "11")]
        lines.append(f"| `{owner}` | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def test_docs_list_the_api_each_path_uses(runs):
    """docs/tensorrt.md's table is what the fake recorded, name for name."""
    doc = (ROOT / "docs" / "tensorrt.md").read_text()
    block = doc.split("<!-- api-table -->\n")[1].split("\n<!-- /api-table -->")[0]
    assert block == api_table(runs)


# ------------------------------------------------ static: every name mentioned was reached

TRT_NAMES = frozenset().union(*(s.members(c) for s in (S10, S11) for c in s.classes),
                              S10.module, S11.module)


@dataclass(frozen=True)
class Mention:
    line: int
    name: str
    text: str


def mentions(source: str) -> list[Mention]:
    """Attribute names that are TensorRT member names, and names hasattr/getattr probe for,
    except names the file defines itself (`self.engine = ...`, a method `close`, a dataclass
    field): those are its own objects' attributes, whatever TensorRT calls its members."""
    tree = ast.parse(source)
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own.add(node.target.id)
    own.update(n for n in TRT_NAMES if n.startswith("_"))  # __version__ and such
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in TRT_NAMES and node.attr not in own:
            found.append(Mention(node.lineno, node.attr, ast.unparse(node)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("hasattr", "getattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in TRT_NAMES
              and node.args[1].value not in own):
            found.append(Mention(node.lineno, node.args[1].value, ast.unparse(node)))
    return found


def probe_lines(source: str) -> set[tuple[int, str]]:
    return {(n.lineno, n.args[1].value) for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id in ("hasattr", "getattr") and len(n.args) >= 2
            and isinstance(n.args[1], ast.Constant)}


# Mentions of TensorRT member names on objects that are not TensorRT's: numpy arrays and
# dtypes, cuda-python, Python containers, annotations. Keyed by the expression's text.
NOT_TENSORRT = {
    "np.dtype": "numpy", "np.float32": "numpy", "host.shape": "numpy", "host.nbytes": "numpy",
    "host.ctypes.data": "numpy", "host.dtype": "numpy", "host.dtype.kind": "numpy",
    "v.dtype": "numpy", "v.dtype.kind": "numpy", "v.shape": "numpy",
    "ptrs.append": "list", "times.append": "list", "out.append": "list",
    "self.warnings.append": "list", "tensors.update": "dict",
    "clock.start": "trt.py's _Clock", "rows.append": "list", "ast.parse": "Python's ast",
    "node.value": "Python's ast", "node.value.value": "Python's ast",
    "getattr(err, 'value', err)": "a cuda-python error code",
    "_cuda(rt.cudaGetDeviceProperties(0)).name": "cuda-python", "f.write": "a Python file",
}


def unreached(source: str, file: Path, runs: list[Run]) -> list[Mention]:
    """Mentions no run recorded at their line, minus the known non-TensorRT ones, minus
    annotations (`trt.Builder` in a signature is never evaluated: TYPE_CHECKING)."""
    seen = {(a.line, a.name) for run in runs for a in run.accesses if Path(a.file) == file}
    notes = annotation_lines(source)
    return [m for m in mentions(source) if (m.line, m.name) not in seen
            and m.text not in NOT_TENSORRT and m.line not in notes]


def annotation_lines(source: str) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        anns = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            anns = [a.annotation for a in (*node.args.args, *node.args.kwonlyargs)
                    if a.annotation] + ([node.returns] if node.returns else [])
        elif isinstance(node, ast.AnnAssign):
            anns = [node.annotation]
        for ann in anns:
            lines.update(range(ann.lineno, (ann.end_lineno or ann.lineno) + 1))
    return lines


def test_every_tensorrt_name_trt_py_mentions_was_reached(runs):
    """A TensorRT name on a line no fake run executed would be checked against no release."""
    missing = unreached(TRT_PY.read_text(), TRT_PY, runs)
    assert not missing, missing
    assert len(mentions(TRT_PY.read_text())) > 80  # the pass sees trt.py's TensorRT calls


def test_trt_layers_uses_no_tensorrt_api():
    """trt_layers.py reads inspector JSON only (tests/judge/test_trt_layers.py, on fixtures in the
    real format): it imports no TensorRT and names nothing on a TensorRT module."""
    source = TRT_LAYERS_PY.read_text()
    tree = ast.parse(source)
    imported = {a.name.split(".")[0] for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names} | {n.module.split(".")[0] for n in ast.walk(tree)
                                     if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"tensorrt", "tensorrt_bindings"}
    assert not module_chains(source, "trt") and not module_chains(source, "tensorrt")


def test_a_planted_removed_name_on_an_unreached_line_fails_the_static_check(runs):
    source = TRT_PY.read_text() + (
        "\n\ndef _planted(layer):\n"
        "    if layer.precision_is_set:\n"
        "        layer.reset_precision()\n")
    missing = {m.name for m in unreached(source, TRT_PY, runs)}
    assert missing == {"precision_is_set", "reset_precision"}


def test_a_planted_removed_name_on_the_11_path_fails_the_run(monkeypatch, zoo, tmp_path):
    """trt.py's strong-typing build with one weak-typing call added: the 11.4 fake stops it."""
    real = trt_backend.TrtBackend._mark

    def planted(self, network, spec):
        if network.num_layers:
            network.get_layer(0).set_output_type(0, __import__("tensorrt").float32)
        return real(self, network, spec)

    monkeypatch.setattr(trt_backend.TrtBackend, "_mark", planted)
    fake.install(monkeypatch, version="11.4.0.106")
    backend = trt_backend.TrtBackend(zoo[LN].model, cache_dir=tmp_path)
    try:
        with pytest.raises(AttributeError, match="set_output_type"):
            backend.run(frozenset(), zoo[LN].inputs)
    finally:
        backend.close()
    fake.install(monkeypatch, version="10.13.0.35")  # the same plant is fine on 10.13
    backend = trt_backend.TrtBackend(zoo[LN].model, cache_dir=tmp_path / "10")
    try:
        backend.run(frozenset(), zoo[LN].inputs)
    finally:
        backend.close()


@pytest.mark.parametrize("version", ["10.13.0.35", "11.4.0.106"])
def test_the_fakes_inspector_writes_its_releases_format(monkeypatch, zoo, tmp_path, version):
    """What trt.py parses on the fake is the JSON the real release writes (fixtures' schema)."""
    from tests.judge.test_trt_layers import assert_real_format
    fake.install(monkeypatch, version=version, fused=[("ln/Sub", "ln/Pow")])
    backend = trt_backend.TrtBackend(zoo[LN].model, cache_dir=tmp_path)
    try:
        engine = backend._engine(backend._spec(()), zoo[LN].inputs)
        info = json.loads(engine.layer_info(backend.shapes))
    finally:
        backend.close()
    assert_real_format(info, int(version.split(".")[0]))


# ------------------------------------------------------------- the rendered snippets

def snippet_context(tmp: Path, zoo) -> tuple[render.RenderContext, list[str]]:
    """A plan of the zoo model, its files on disk, and a dynamic input (profile lines)."""
    from trtbisect.base.files import save_model
    from trtbisect.judge.mixed import write_mixed_onnx
    z = zoo[LN]
    plan = sorted(z.expected_fp32)
    save_model(tmp / "model.onnx", z.model)
    save_model(tmp / "model.mixed.onnx", write_mixed_onnx(z.model, set(plan)))
    ctx = render.RenderContext(model="model.onnx", mixed_model="model.mixed.onnx",
                               engine_stem="model",
                               shape_ranges={"x": ((1, 16, 32), (1, 16, 32), (1, 16, 32))})
    return ctx, plan


def run_snippet(key: str, version: str, monkeypatch, tmp: Path, zoo) -> list[Run]:
    """Run a rendered snippet on the fake of `version`, once as is and once with the ONNX
    parser failing (its error branch must exit with the parser's message)."""
    ctx, plan = snippet_context(tmp, zoo)
    text = render.render_all(plan, ctx)[key].text
    path = tmp / f"{key}.py"
    path.write_text(text)
    monkeypatch.chdir(tmp)
    fake.install(monkeypatch, version=version, parse_error="no such op: Foo")
    with pytest.raises(SystemExit, match="no such op: Foo"):
        runpy.run_path(str(path))
    failed = Run(f"{key} on {version}, parser error", tuple(fake.ACCESSES))
    fake.install(monkeypatch, version=version)
    runpy.run_path(str(path))
    return [failed, Run(f"{key} on {version}", tuple(fake.ACCESSES))]


def module_chains(source: str, root: str = "trt") -> list[tuple[int, list[str]]]:
    """`trt.A.B` chains of a source: (line, [A, B]), and their prefixes."""
    out = []
    for node in ast.walk(ast.parse(source)):
        chain, cur = [], node
        while isinstance(cur, ast.Attribute):
            chain.insert(0, cur.attr)
            cur = cur.value
        if chain and isinstance(cur, ast.Name) and cur.id == root:
            out.append((node.lineno, chain))
    return out


def resolves(surface: trt_surface.Surface, chain: list[str]) -> bool:
    """trt.A.B against a surface: A a module name, B a member of the class A is (or of the
    enum an enum value like float32 belongs to)."""
    owner = ""
    for name in chain:
        if not surface.has(owner, name):
            return False
        value = surface.module.get(name, "") if not owner else ""
        owner = value.rsplit(".", 1)[0] if "." in value else (f"{owner}.{name}" if owner else name)
    return True


@pytest.mark.parametrize("key,targets", [("tensorrt_python", ("10.13",)),
                                         ("tensorrt_python_trt11", ("10.13", "11.4"))])
def test_snippet_names_resolve_in_their_target_releases(zoo, tmp_path, key, targets):
    ctx, plan = snippet_context(tmp_path, zoo)
    text = render.render_all(plan, ctx)[key].text
    chains = module_chains(text)
    assert chains
    for release in targets:
        bad = [c for _, c in chains if not resolves(trt_surface.load(release), c)]
        assert not bad, (release, bad)


def test_the_tensorrt_10_snippet_runs_on_10_13_and_forces_the_plan(monkeypatch, zoo, tmp_path):
    runs = run_snippet("tensorrt_python", "10.13.0.35", monkeypatch, tmp_path, zoo)
    blob = (tmp_path / "model.fp16.plan").read_bytes()
    import pickle
    built = pickle.loads(blob)
    assert built["fp16"] and sorted(built["forced"]) == sorted(zoo[LN].expected_fp32)
    assert built["profiles"] == [{"x": ((1, 16, 32),) * 3}]
    file = tmp_path / "tensorrt_python.py"
    assert not unreached(file.read_text(), file, runs)  # every TensorRT line ran


def test_the_tensorrt_10_snippet_is_refused_by_11_4(monkeypatch, zoo, tmp_path):
    """Why it is labelled TensorRT 10 only: on 11.4 its first weak-typing line fails."""
    with pytest.raises(AttributeError, match="FP16"):
        run_snippet("tensorrt_python", "11.4.0.106", monkeypatch, tmp_path, zoo)


@pytest.mark.parametrize("version", ["10.13.0.35", "11.4.0.106"])
def test_the_strongly_typed_snippet_runs_on_both(monkeypatch, zoo, tmp_path, version):
    runs = run_snippet("tensorrt_python_trt11", version, monkeypatch, tmp_path, zoo)
    import pickle
    built = pickle.loads((tmp_path / "model.mixed.plan").read_bytes())
    assert built["strong"] and not built["fp16"] and not built["forced"]
    model = onnx.load_from_string(built["model"])
    assert any(n.op_type == "Cast" for n in model.graph.node)  # the mixed model was built
    file = tmp_path / "tensorrt_python_trt11.py"
    assert not unreached(file.read_text(), file, runs)


def test_a_planted_removed_name_in_a_snippet_fails_the_static_check():
    text = "import tensorrt as trt\nconfig.set_flag(trt.BuilderFlag.FP16)\n"
    assert all(resolves(S10, c) for _, c in module_chains(text))
    assert [c for _, c in module_chains(text) if not resolves(S11, c)] == [["BuilderFlag", "FP16"]]
