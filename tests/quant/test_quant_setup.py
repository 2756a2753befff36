"""Set-up of the quantized road (#42 item 6, #46 item 7): the quant extra holds what ModelOpt
0.47 requires and its ONNX PTQ imports, the printed install line names it, and `trtbisect env`
says in one line what is missing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtbisect.cli import main
from trtbisect.outputs.quantized import INSTALL
from trtbisect.quant import ptq

ROOT = Path(__file__).resolve().parents[2]


def _name(req: str) -> str:
    return re.split(r"[<>=~!; \[]", req, maxsplit=1)[0].lower()


def test_the_quant_extra_holds_every_requirement_but_modelopt():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["quant"]
    names = {_name(r) for r in extra}
    wanted = {d.lower() for d in ptq.REQUIRES.values()} - {"nvidia-modelopt"}
    assert wanted <= names, wanted - names
    assert "nvidia-modelopt" not in names  # its metadata pulls CUDA torch: --no-deps
    assert "--no-deps nvidia-modelopt==0.47.0" in INSTALL and "[quant]" in INSTALL


def test_env_says_what_is_missing_in_one_line(monkeypatch):
    monkeypatch.setattr(ptq, "REQUIRES", {**ptq.REQUIRES, "no_such_module_x": "no-such-dist"})
    res = CliRunner().invoke(main, ["env", "--json"])
    rows = {r["component"]: r for r in json.loads(res.output)}
    row = rows["ModelOpt ONNX PTQ"]
    assert not row["usable"] and "\n" not in row["detail"]
    assert row["detail"].startswith("missing ") and "no-such-dist" in row["detail"]
    assert INSTALL in row["detail"]
    monkeypatch.setattr(ptq, "missing", lambda: [])
    monkeypatch.setattr("importlib.metadata.version", lambda dist: "0.47.0")
    res = CliRunner().invoke(main, ["env", "--json"])
    row = {r["component"]: r for r in json.loads(res.output)}["ModelOpt ONNX PTQ"]
    assert row["usable"] and "nvidia-modelopt 0.47.0" in row["detail"]
