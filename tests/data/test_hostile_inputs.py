"""Hooks, data loaders and files written to break the run (issue #35): no silently wrong
data, no hang, no traceback, no stdout that is not the results."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.conftest import save_zoo_model
from tests.data.test_data_sources import _loader, _model
from tests.fuzz.make_cases import LOOP_START, loop_model
from tests.test_cli import assert_one_line_error, invoke
from trtbisect.base.limits import Limits
from trtbisect.data.sources import iter_items
from trtbisect.data.store import SampleSet
from trtbisect.errors import TrtBisectError
from trtbisect.graph import Graph

ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.slow  # starts two worker processes
def test_json_stays_json_when_a_hook_prints_on_workers(two, tmp_path):
    """The hook runs in the worker processes too: what it prints there goes to stderr."""
    model, inputs = two
    hook = tmp_path / "chatty.py"
    hook.write_text("import numpy as np\nprint('HOOK-IMPORTED')\n"
                    "def check(fp32, fp16, sample):\n    print('HOOK-CALLED')\n"
                    "    return bool(np.isfinite(fp16['out_a']).all())\n")
    p = _start("-q", "run", model, "--inputs", inputs, "--check", f"{hook}:check",
               "--workers", "2", "--json", "--out", tmp_path / "o")
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err
    doc = json.loads(out)
    assert doc["workers"]["workers"] == 2 and doc["workers"]["inferences_run"] > 0
    assert err.count("HOOK-IMPORTED") >= 2 and "HOOK-CALLED" in err  # the parent's and theirs


# ---------------------------------------------------------------- item 2: no hang


def _saved_loop(tmp_path, stop):
    onnx.save(loop_model(stop), tmp_path / "loop.onnx")
    np.savez(tmp_path / "x.npz", x=LOOP_START)
    return str(tmp_path / "loop.onnx"), str(tmp_path / "x.npz")


def _start(*args) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "trtbisect", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(p: subprocess.Popen, words: str) -> None:
    for line in p.stderr:
        if words in line:
            return
    raise AssertionError(f"the run ended before {words!r}")


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_ends_a_run_stuck_inside_onnx_runtime(tmp_path, sig, code):
    """The FP32 reference of a Loop that never ends: the signal is seen while ORT runs (its
    run is stopped through RunOptions.terminate), not only after it returns (never)."""
    model, inputs = _saved_loop(tmp_path, None)
    p = _start("run", model, "--inputs", inputs, "--out", tmp_path / "o")
    _wait_for(p, "running the FP32 reference")
    p.send_signal(sig)
    try:
        _, err = p.communicate(timeout=60)  # without the fix: never (the Loop has 10^12 trips)
    except subprocess.TimeoutExpired:
        p.kill()
        raise
    assert p.returncode == code, err
    assert "Traceback" not in err and "interrupted" in err


def test_a_plan_whose_loop_never_ends_fails_by_the_eval_timeout(tmp_path):
    """FP16 rounding stops the Loop's counter at 2048 (< 2100, the exit): every plan that
    rounds its Add never finishes. --eval-timeout judges those plans failed, so the plan keeps
    exactly the Add in FP32; a run interrupted while one hangs resumes from its journal."""
    model, inputs = _saved_loop(tmp_path, 2100.0)
    out = tmp_path / "o"
    p = _start("run", model, "--inputs", inputs, "--out", out)  # default timeout: 600 s
    _wait_for(p, "all-FP16 evaluation")  # the all-FP16 plan hangs here
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "resume" in err, err
    lines = (out / "journal.jsonl").read_text().splitlines()
    assert lines and all(json.loads(ln) for ln in lines)  # whole lines, none cut short
    r = invoke("-q", "run", model, "--inputs", inputs, "--out", out, "--eval-timeout", "0.25",
               "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["verdict"] == "fixed" and doc["fp32_nodes"] == ["count[body]/step"]
    (score,) = doc["errors_before"]["y"]["scores"]
    assert score["criterion"] == "eval-timeout" and not score["passed"]
    r = invoke("check", out / "loop.mixed.onnx", "--reference", model, "--inputs", inputs,
               "--eval-timeout", "0.25")
    assert r.exit_code == 0, r.output  # the written plan finishes, and passes
    fp16 = tmp_path / "fp16.onnx"
    from trtbisect.judge.loadable import InputCheck
    from trtbisect.judge.mixed import mixed_model
    # the model fails the checker itself (a Loop body output of the wrong rank): its copy is
    # held to loading in ONNX Runtime, said explicitly (before, the last run's record said it)
    mixed_model(Graph.from_path(model), frozenset()).save(fp16, held=InputCheck(model))
    r = invoke("check", fp16, "--reference", model, "--inputs", inputs, "--eval-timeout", "0.25")
    assert r.exit_code == 4 and "stopped after --eval-timeout 0.25 s" in r.output, r.output


def test_a_reference_that_never_ends_is_refused_at_the_eval_timeout(tmp_path):
    model, inputs = _saved_loop(tmp_path, None)
    r = invoke("run", model, "--inputs", inputs, "--out", tmp_path / "o", "--eval-timeout", "0.2")
    assert_one_line_error(r, 2, "--eval-timeout 0.2 s")


# ---------------------------------------------------------------- item 3: bounds


def _npz_declaring(path, shape) -> None:
    """An .npz whose one member's header declares `shape` (float32), with no data."""
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<f4", "fortran_order": False,
                                                "shape": shape})
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("x.npy", head.getvalue())


@pytest.mark.parametrize("count, flags", [(10**6, ["--max-samples", "1000"]), (10**9, [])])
def test_a_tiny_npz_declaring_a_billion_empty_samples_is_refused_from_its_header(
        tmp_path, count, flags):
    model = _model(tmp_path)  # x: [n, 16]; a stack of (0, 16) samples is valid data
    path = tmp_path / "lies.npz"
    _npz_declaring(path, (count, 0, 16))
    assert path.stat().st_size < 400
    r = invoke("run", model, "--inputs", path, "--out", tmp_path / "o", *flags)
    assert_one_line_error(r, 2, f"gives {count} samples", "--max-samples")


def test_a_data_loader_that_never_ends_is_cut_at_the_sample_bound(tmp_path):
    model = _model(tmp_path)
    loader = _loader(tmp_path, "def load_data():\n"
                               "    while True:\n"
                               "        yield {'x': np.zeros((2, 16), np.float32)}\n")
    r = invoke("run", model, "--data-loader-script", loader, "--out", tmp_path / "o",
               "--max-samples", "50")
    assert_one_line_error(r, 2, "--data-loader-script gives more samples than --max-samples 50")


def test_samples_past_the_byte_bound_are_refused(tmp_path):
    model = _model(tmp_path)
    rows = np.ones((10, 2, 16), np.float32)  # 128 bytes a sample
    np.savez(tmp_path / "stack.npz", x=rows)
    np.savez_compressed(tmp_path / "deflated.npz", x=rows)
    for name in ("stack.npz", "deflated.npz"):  # declared by headers / counted as read
        r = invoke("run", model, "--inputs", tmp_path / name, "--out", tmp_path / "o",
                   "--max-input-bytes", "1K")
        assert_one_line_error(r, 2, "--max-input-bytes 1 KiB")
    r = invoke("run", model, "--inputs", tmp_path / "stack.npz", "--out", tmp_path / "o",
               "--max-input-bytes", "lots")
    assert_one_line_error(r, 2, "is not a size")
    g = Graph.from_path(model)
    assert len(SampleSet(iter_items(g, [str(tmp_path / "stack.npz")], None, {}, 0),
                         limits=Limits(input_bytes=1280))) == 10  # exactly at the bound


def test_spooling_past_its_bound_is_refused(tmp_path):
    """A data loader's samples past the memory budget are spooled to disk, each byte counted
    against --max-spool-bytes before it is written."""
    g = Graph.from_path(_model(tmp_path))
    loader = _loader(tmp_path, "def load_data():\n"
                               "    for k in range(40):\n"
                               "        yield {'x': np.full((2, 16), k, np.float32)}\n")
    one = 2 * 16 * 4
    with pytest.raises(TrtBisectError, match=r"spooled to disk pass --max-spool-bytes 2 KiB"):
        SampleSet(iter_items(g, [], str(loader), {}, 0), budget=3 * one,
                  spool=tmp_path / "spool", limits=Limits(spool_bytes=2048))
    s = SampleSet(iter_items(g, [], str(loader), {}, 0), budget=3 * one,
                  spool=tmp_path / "spool2", limits=Limits(spool_bytes=1 << 20))
    assert len(s) == 40 and 0 < s.spooled.used <= 1 << 20
    assert [float(x["x"][0, 0]) for x in s] == list(range(40))


# ---------------------------------------------------------------- item 5: long names


def _long_names(tmp_path, *flags):
    from tests.fuzz.make_cases import X, overflow_model
    up, down = "u" * 100_000, "\x1b[2J" + "d" * 100_000
    onnx.save(overflow_model((up, "up2", down)), tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", x=X)
    r = invoke("run", tmp_path / "m.onnx", "--inputs", tmp_path / "x.npz", "--out",
               tmp_path / "o", *flags)
    assert r.exit_code == 0, r.output
    plan = json.loads((tmp_path / "o" / "precision.json").read_text())
    assert set(plan["fp32_nodes"]) == {up, "up2", down}  # machines read the names whole
    return r, up


def test_a_100k_character_node_name_is_shortened_on_the_console(tmp_path):
    r, _ = _long_names(tmp_path, "--all")  # --all: the node table names every node
    assert len(r.output) < 20_000 and "\x1b" not in r.output  # 1.17 MB before
    assert "\u2026[100000" in r.output and "chars]\u2026" in r.output  # rich wraps the cell
    assert "\\x1b[2J" in r.output


@pytest.mark.slow  # matplotlib
def test_a_100k_character_node_name_is_shortened_in_the_reports(tmp_path):
    _, up = _long_names(tmp_path, "--report")
    md = (tmp_path / "o" / "report.md").read_text()
    assert len(md) < 40_000 and "[100000 chars]" in md
    html = (tmp_path / "o" / "report.html").read_text()
    assert up not in html and "[100000 chars]" in html


def test_shortened_keeps_both_ends_and_says_the_length():
    from trtbisect.base.escape import KEEP, LONG, shortened, shown_text
    assert shortened("a" * LONG) == "a" * LONG
    name = "x" * 10 + "m" * 1000 + "y" * 10
    got = shortened(f"keep {name} in FP32")
    assert got == f"keep {name[:KEEP]}\u2026[1020 chars]\u2026{name[-KEEP:]} in FP32"
    assert len(shortened(" ".join(["word"] * 10_000))) < 5000  # a long name with spaces
    assert shown_text("\x1b" * 300).startswith("\\x1b")  # escaped first, then shortened


# ---------------------------------------------------------------- minor items and tracebacks


def test_a_full_disk_names_the_file_it_could_not_write(two, tmp_path, monkeypatch):
    """A write on a full disk raises ENOSPC naming no file: the one line names it."""
    import errno

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    model, inputs = two
    monkeypatch.setattr(onnx, "save", full)
    r = invoke("-q", "run", model, "--inputs", inputs, "--out", tmp_path / "o")
    assert_one_line_error(r, 2, "No space left on device", str(tmp_path / "o"), ".onnx")


def test_a_refused_out_leaves_no_lock_in_the_users_folder(two, tmp_path, monkeypatch):
    model, inputs = two
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my notes")
    monkeypatch.chdir(mine)
    r = invoke("-q", "run", model, "--inputs", inputs, "--out", ".", "--report")
    assert_one_line_error(r, 2, "report.md")
    assert sorted(p.name for p in mine.iterdir()) == ["report.md"]
    r = invoke("-q", "run", model, "--inputs", inputs, "--out", tmp_path / "o")
    assert r.exit_code == 0 and (tmp_path / "o" / ".trtbisect.lock").exists()  # a run keeps it


@pytest.mark.parametrize("case, words", [
    ("npz-duplicate_member-run", "holds two members named 'x.npy'"),
    ("npz-header_negative_dim-run", "negative dimension"),
    ("model-initializer_raw_longer-run", "initializer 'W' does not match its shape 64x64"),
])
def test_damaged_files_are_one_line(tmp_path, case, words):
    from tests.fuzz.make_cases import cases
    (build,) = [c.build for c in cases() if c.name == case]
    r = invoke("-q", *build(tmp_path))
    assert_one_line_error(r, 2, words)


def test_a_hook_score_beyond_float_is_inf(two, tmp_path):
    model, inputs = two
    hook = tmp_path / "big.py"
    hook.write_text("def check(fp32, fp16, sample):\n    return True, -10**400\n")
    r = invoke("-q", "run", model, "--inputs", inputs, "--check", f"{hook}:check",
               "--out", tmp_path / "o", "--json")
    assert r.exit_code == 0, r.output
    (check,) = json.loads(r.stdout)["judged"]["before"]["checks"]
    assert check["value"] == "-inf" and check["passed"]


def test_sizes_read_as_people_write_them():
    from trtbisect.base.limits import parse_size
    assert [parse_size(s) for s in ("100", "1K", "512M", "2G", "1.5GiB", "3t")] == [
        100, 1024, 512 << 20, 2 << 30, 3 << 29, 3 << 40]
    for bad in ("", "-1", "1e3", "lots", "5 apples"):
        with pytest.raises(ValueError):
            parse_size(bad)
