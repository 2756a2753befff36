from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.models.make_models import zoo as build_zoo


@pytest.fixture(autouse=True)
def private_engine_cache(tmp_path_factory, monkeypatch):
    """Engines built by tests (fake or real) never land in the user's ~/.cache/trtbisect."""
    monkeypatch.setenv("TRTBISECT_CACHE_DIR", str(tmp_path_factory.mktemp("engine-cache")))


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true",
                     help="Also run tests marked slow (the whole fuzz corpus, kill/resume).")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def zoo():
    return build_zoo()


def save_zoo_model(z, folder: Path) -> tuple[Path, Path]:
    """The model and its inputs as files, the way a user hands them to the CLI."""
    folder.mkdir(parents=True, exist_ok=True)
    model, inputs = folder / f"{z.name}.onnx", folder / f"{z.name}_inputs.npz"
    onnx.save(z.model, model)
    np.savez(inputs, **z.inputs)
    return model, inputs


def x_to_y(nodes, size: int = 4, opset: int = 13) -> onnx.ModelProto:
    """A model of `nodes` from float input x[size] to float output y[size]."""
    from onnx import TensorProto, helper

    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [size])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def script_module(name: str):
    """A benchmark script under scripts/ imported as a module (its helpers are tested)."""
    folder = str(Path(__file__).resolve().parent.parent / "scripts")
    sys.path.insert(0, folder)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(folder)
