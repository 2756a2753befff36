from __future__ import annotations

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
