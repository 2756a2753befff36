"""The package's public face (trtbisect/__init__.py): every name it lists resolves to the object
in its module, `import trtbisect` loads no runtime, and nothing else is offered by that name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import trtbisect

TORCH_NAMES = {"export", "load_torch_model", "resolve_model_arg", "diagnose_torch",
               "TorchOptions", "pick_precision", "apply_plan", "module_of"}


@pytest.mark.parametrize("name", sorted(set(trtbisect._API)))
def test_every_public_name_is_its_modules_object(name):
    if name in TORCH_NAMES:
        pytest.importorskip("torch")
    module, attribute = trtbisect._API[name]
    obj = getattr(trtbisect, name)
    # the face names each object where it is defined, not a module that merely imports it
    assert obj.__module__ == module and obj.__name__ == attribute


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        trtbisect.nothing_here  # noqa: B018


def test_importing_the_package_loads_no_runtime():
    probe = ("import json, sys, trtbisect; print(json.dumps(sorted(m for m in sys.modules "
             "if m.partition('.')[0] in {'numpy', 'onnx', 'onnxruntime', 'torch', 'click'})))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_the_face_runs_the_demo_like_the_command(tmp_path):
    """The docstring's example: run() through the face gives the CLI's plan for the demo."""
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    opts = trtbisect.Options.of(inputs=[str(root / "models" / "demo_inputs.npz")])
    result = trtbisect.run(root / "models" / "demo.onnx", opts)
    assert isinstance(result, trtbisect.RunResult)
    assert result.verdict == "fixed" and len(result.fp32_nodes) == 7
