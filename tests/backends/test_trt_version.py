"""Which TensorRT is installed, read without importing it; `--trt-version`'s default follows it
(else 11, the current release); `trtbisect env` says what it found and which path
`--backend trt` takes. Packages are planted on sys.path as NVIDIA ships them: the full wheel's
`tensorrt/__init__.py` holds `__version__ = "..."`; PyPI's `tensorrt-cu12` is a shim that
re-exports `tensorrt_bindings` (tensorrt_cu12-11.4.0.106.tar.gz, tensorrt/__init__.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.backends.test_trt_backend import restored_tensorrt_modules
from tests.conftest import save_zoo_model
from tests.test_cli import invoke
from trtbisect.backends import trt as trt_backend
from trtbisect.context import Options

# what NVIDIA's __init__.py does after __version__: load libraries this machine lacks
UNIMPORTABLE = 'raise ImportError("libnvinfer.so.11: cannot open shared object file")\n'


@pytest.fixture
def site(monkeypatch, tmp_path):
    """A folder first on sys.path, with no tensorrt imported while the test runs."""
    with restored_tensorrt_modules():
        monkeypatch.syspath_prepend(str(tmp_path))
        yield tmp_path


def plant(site: Path, package: str, text: str) -> Path:
    (site / package).mkdir()
    init = site / package / "__init__.py"
    init.write_text(text)
    return init


def test_nvidia_wheel_is_read_without_importing_it(site):
    init = plant(site, "tensorrt", '__version__ = "10.8.0.43"\n' + UNIMPORTABLE)
    assert trt_backend.installed_tensorrt() == ("10.8.0.43", str(init))
    assert trt_backend.default_trt_version() == 10 and Options().judge.trt_version == 10
    assert "tensorrt" not in sys.modules  # found, not imported


def test_pypi_shim_is_followed_to_the_bindings(site):
    plant(site, "tensorrt", "from tensorrt_bindings import *\n"
                            "from tensorrt_bindings import __version__\n")
    init = plant(site, "tensorrt_bindings", '__version__ = "11.4.0.106"\n' + UNIMPORTABLE)
    assert trt_backend.installed_tensorrt() == ("11.4.0.106", str(init))
    assert trt_backend.default_trt_version() == 11


def test_no_tensorrt_stubs_or_bindings_alone_mean_none(site, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(site)])  # a real TensorRT elsewhere would be found
    plant(site, "tensorrt_bindings", '__version__ = "11.4.0.106"\n')  # no `tensorrt` to import
    assert trt_backend.installed_tensorrt() is None
    (site / "tensorrt").mkdir()
    (site / "tensorrt" / "__init__.pyi").write_text("class Builder: ...\n")  # tensorrt-stubs
    assert trt_backend.installed_tensorrt() is None
    assert trt_backend.default_trt_version() == 11 and Options().judge.trt_version == 11
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # blocked
    assert trt_backend.installed_tensorrt() is None


@pytest.mark.parametrize("version,default", [("8.6.1", 10), ("9.3.0.1", 10), ("10.13.0.35", 10),
                                             ("11.0.0.5", 11), ("12.0.0.1", 11)])
def test_default_is_the_nearest_version_trtbisect_knows(site, version, default):
    plant(site, "tensorrt", f'__version__ = "{version}"\n')
    assert trt_backend.default_trt_version() == default


def rows() -> dict[str, tuple[bool, str]]:
    return {name: (ok, why) for name, ok, why in trt_backend.backend_status()}


def test_env_rows_say_what_was_found_and_the_path(site):
    init = plant(site, "tensorrt", '__version__ = "11.4.0.106"\n' + UNIMPORTABLE)
    r = rows()
    ok, why = r["tensorrt"]
    assert not ok and why.startswith(f"TensorRT 11.4.0.106 ({init}); importing it failed")
    assert "libnvinfer.so.11" in why
    ok, path = r["--backend trt path"]
    assert ok and path.startswith("strong typing: each plan is built from its mixed ONNX")
    assert "checked against the 11.4 bindings' API, never run here" in path
    assert r["--trt-version default"] == (True, "11: the installed TensorRT's major version")


def test_env_rows_for_tensorrt_10_and_12(site):
    init = plant(site, "tensorrt", '__version__ = "10.13.0.35"\n')
    path = rows()["--backend trt path"][1]
    assert path.startswith("weak typing: BuilderFlag.FP16, OBEY_PRECISION_CONSTRAINTS")
    assert "checked against the 10.13 bindings' API" in path
    assert rows()["--trt-version default"][1].startswith("10:")
    init.write_text('__version__ = "12.0.1"\n')
    path = rows()["--backend trt path"][1]
    assert path.endswith("12.0.1 is newer than 11.4, the release its calls were checked against")


def test_env_without_tensorrt(site, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    r = rows()
    assert r["tensorrt"][0] is False and "pip install" in r["tensorrt"][1]
    assert r["--backend trt path"] == (False, "none: no TensorRT")
    assert r["--trt-version default"] == (True, "11: no TensorRT found, so the current release; "
                                                "the TensorRT 10 renderings are written too, "
                                                "labelled")


@pytest.mark.parametrize("installed,expected", [(None, 11), ("10.13.0.35", 10), ("11.4.0.106", 11)])
def test_run_targets_the_installed_version_by_default(site, monkeypatch, zoo, installed, expected):
    if installed:
        plant(site, "tensorrt", f'__version__ = "{installed}"\n')
    else:
        monkeypatch.setitem(sys.modules, "tensorrt", None)
    model, inputs = save_zoo_model(zoo["healthy"], site / "m")
    out = site / "o"
    r = invoke("-q", "run", model, "--inputs", inputs, "--out", out, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["semantics"]["trt_version"] == expected
    plan = json.loads((out / "precision.json").read_text())
    assert plan["renderings"]["trt_version"] == expected
    # both versions are rendered either way, each labelled with its version
    assert {"trtexec_trt10", "trtexec_trt11", "tensorrt_python", "tensorrt_python_trt11"} \
        <= set(plan["renderings"])
    script = (out / "commands.sh").read_text()
    other = 10 if expected == 11 else 11
    assert (f"# The plan targets TensorRT {expected} (--trt-version); the TensorRT {other} "
            "renderings are kept, labelled.") in script
    assert "# TensorRT 10, trtexec (weak typing):" in script
    given = invoke("-q", "run", model, "--inputs", inputs, "--out", site / "o2", "--json",
                   "--trt-version", str(other))
    assert json.loads(given.output)["semantics"]["trt_version"] == other  # the flag wins
