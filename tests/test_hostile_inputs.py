"""Hooks, data loaders and files written to break the run (issue #35): no silently wrong
data, no hang, no traceback, no stdout that is not the results."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import save_zoo_model
from tests.test_cli import invoke
from tests.test_data_sources import _loader, _model
from trtbisect.data.sources import iter_items
from trtbisect.graph import Graph


@pytest.fixture
def two(zoo, tmp_path):
    return save_zoo_model(zoo["two_outputs"], tmp_path)


# ---------------------------------------------------------------- item 1: copies


def test_a_loader_that_reuses_one_buffer_gives_every_sample(tmp_path):
    """`buf[...] = k; yield {"x": buf}`: each sample is what was yielded when it was yielded."""
    g = Graph.from_path(_model(tmp_path))
    loader = _loader(tmp_path, "def load_data():\n"
                               "    buf = np.zeros((2, 16), np.float32)\n"
                               "    for k in range(3):\n"
                               "        buf[...] = k\n"
                               "        yield {'x': buf}\n")
    got = [item.sample["x"] for item in iter_items(g, [], str(loader), {}, 0)]
    assert [float(x[0, 0]) for x in got] == [0.0, 1.0, 2.0]
    assert all(np.all(x == k) for k, x in enumerate(got))


def test_a_hook_that_makes_the_reference_writable_again_changes_nothing(two, tmp_path):
    """A hook that sets every array's `writeable` flag back (on it and on its base) and zeroes
    it: the next plan is judged on the real reference, so the verdict is the one an honest
    hook gets."""
    model, inputs = two
    honest = tmp_path / "honest.py"
    honest.write_text("import numpy as np\n"
                      "def check(fp32, fp16, sample):\n"
                      "    return bool(np.isfinite(fp16['out_b']).all()"
                      " and np.abs(fp16['out_b'] - fp32['out_b']).max() < 0.5)\n")
    vandal = tmp_path / "vandal.py"
    vandal.write_text(
        "import numpy as np\n"
        "def _wreck(a):\n"
        "    while a is not None:\n"
        "        try:\n"
        "            a.flags.writeable = True\n"
        "            a[...] = 0\n"
        "        except (ValueError, TypeError):\n"
        "            pass\n"
        "        a = getattr(a, 'base', None)\n"
        "        a = a if isinstance(a, np.ndarray) else None\n"
        "def check(fp32, fp16, sample):\n"
        "    ok = bool(np.isfinite(fp16['out_b']).all()"
        " and np.abs(fp16['out_b'] - fp32['out_b']).max() < 0.5)\n"
        "    for d in (fp32, fp16, sample):\n"
        "        for a in d.values():\n"
        "            _wreck(a)\n"
        "    return ok\n")
    runs = {}
    for name, hook in (("honest", honest), ("vandal", vandal)):
        r = invoke("-q", "run", model, "--inputs", inputs, "--check", f"{hook}:check",
                   "--out", tmp_path / name, "--json")
        assert r.exit_code == 0, r.output
        runs[name] = json.loads(r.stdout)
    assert runs["vandal"]["fp32_nodes"] == runs["honest"]["fp32_nodes"] != []
    assert runs["vandal"]["verdict"] == runs["honest"]["verdict"] == "fixed"


# ---------------------------------------------------------------- item 4: stdout


def test_json_stays_json_when_a_hook_and_a_loader_print(two, tmp_path):
    """print() in a hook (at import and per call) and in a data loader goes to stderr:
    stdout is one JSON document."""
    model, inputs = two
    hook = tmp_path / "chatty.py"
    hook.write_text("import numpy as np\nprint('HOOK-IMPORTED')\n"
                    "def check(fp32, fp16, sample):\n"
                    "    print('HOOK-CALLED', fp16['out_b'].shape)\n"
                    "    return bool(np.isfinite(fp16['out_b']).all())\n")
    loader = tmp_path / "chatty_loader.py"
    loader.write_text("import numpy as np\nprint('LOADER-IMPORTED')\n"
                      f"def load_data():\n    print('LOADER-STARTED')\n"
                      f"    yield dict(np.load({str(inputs)!r}))\n    print('LOADER-DONE')\n")
    r = invoke("-q", "run", model, "--data-loader-script", loader, "--check", f"{hook}:check",
               "--out", tmp_path / "o", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "fp16_ok"  # the hook asks only for a finite out_b
    for words in ("HOOK-IMPORTED", "HOOK-CALLED", "LOADER-IMPORTED", "LOADER-STARTED", "LOADER-DONE"):
        assert words in r.stderr and words not in r.stdout
