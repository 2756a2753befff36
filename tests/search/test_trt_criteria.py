"""The TensorRT search judges engines by the run's criteria (judge/engine.py), as the emulator
does: `--metric`, `--check-error-stat`, `--check FILE.py:FUNC`, `--pass-rate`, in the run's
process and on its GPU workers (parallel/trt_pool.py), and through `trtbisect run --backend trt`.

On the fake TensorRT only (tests/fixtures/trt/): it computes with the ORT emulator, so these
tests show the wiring and the verdicts, never TensorRT's numbers. Nothing here ran on TensorRT
or a GPU.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.backends.test_trt_backend import LN, fake
from tests.conftest import save_zoo_model
from tests.parallel.test_trt_pool import FUSED, install_fake
from tests.test_cli import assert_one_line_error, invoke
from trtbisect.errors import EXIT_USAGE, TrtBisectError
from trtbisect.judge.compare import Tolerance
from trtbisect.judge.flags import parse_criteria
from trtbisect.stages.trt import TrtSearchOptions, run_trt_search

TIGHT = Tolerance(rtol=1e-4)  # `healthy`'s all-FP16 output misses it (rel 5e-4)


def search(z, folder: Path, samples=None, emulator_plan=None, **kw):
    """The TensorRT search on `z` (one sample unless given), `kw` its options."""
    kw.setdefault("cache_dir", folder / "c")
    return run_trt_search(z.model, samples or [z.inputs], folder / "out", TrtSearchOptions(**kw),
                          emulator_plan=emulator_plan)


def phases(report) -> list[tuple[str, bool]]:
    return [(t["phase"], t["passed"]) for t in report.result.trials]


# ------------------------------------------------------------------------- (a) a metric

def test_a_looser_metric_changes_the_trt_searchs_plan(monkeypatch, zoo, tmp_path):
    """`healthy` under rtol 1e-4: the default criterion fails its all-FP16 engine and TensorRT
    searches (no emulator plan given: the TensorRT checks alone decide); cosine >= 0.999
    passes it, so the plan is empty. The engines are the same: the second search builds none
    of those the first built."""
    fake.install(monkeypatch)
    z = zoo["healthy"]
    default = search(z, tmp_path, tolerance=TIGHT)
    cosine = search(z, tmp_path, tolerance=TIGHT, cache_dir=tmp_path / "c",
                    criteria=parse_criteria(metrics=["cosine:0.999"]))
    assert phases(default)[0] == ("fp16", False) and default.result.found
    assert default.result.fp32 and default.result.trt_checks > 1
    assert phases(cosine) == [("fp16", True)] and cosine.result.fp32 == []
    assert cosine.builds == 0 and cosine.cache_hits >= 2  # FP32 reference + all-FP16 engines
    assert cosine.criterion == "cosine:0.999" and cosine.to_json()["criterion"] == "cosine:0.999"
    assert default.criterion is None and "criterion" not in default.to_json()


def test_the_default_criteria_object_is_todays_search(monkeypatch, zoo, tmp_path):
    """`Criteria()` (what `run` passes without criterion flags) is no criterion at all: the
    same trials, plan and builds as `criteria=None`."""
    fake.install(monkeypatch, fused=FUSED)
    z = zoo[LN]
    plain = search(z, tmp_path / "none", emulator_plan=sorted(z.expected_fp32), certify=True)
    given = search(z, tmp_path / "empty", emulator_plan=sorted(z.expected_fp32), certify=True,
                   criteria=parse_criteria())
    assert given.result.to_json() == plain.result.to_json() and given.builds == plain.builds
    assert plain.result.trt_only == ["ln/Sub"]


def test_a_criterion_naming_no_output_is_refused_before_the_search(monkeypatch, zoo, tmp_path):
    fake.install(monkeypatch)
    z = zoo["healthy"]
    with pytest.raises(TrtBisectError, match="names no output of the model") as err:
        search(z, tmp_path, criteria=parse_criteria(metrics=["nope:cosine:0.9"]))
    assert err.value.exit_code == EXIT_USAGE and fake.builds() == 1  # the FP32 reference only


# --------------------------------------------------------------------- (b) a --check hook

HOOK = """\
import os
import numpy as np

def strict(fp32, candidate, sample):
    with open({log!r}, "a") as fh:
        fh.write(f"{{os.getpid()}}\\n")
    d = np.abs(candidate["y"] - fp32["y"]).max()
    return bool(d <= 5e-4 * np.abs(fp32["y"]).max()), float(d)
"""


def write_hook(tmp_path: Path) -> tuple[str, Path]:
    log = tmp_path / "calls.log"
    (tmp_path / "hook.py").write_text(HOOK.format(log=str(log)))
    return f"{tmp_path / 'hook.py'}:strict", log


def test_a_check_hook_drives_the_trt_search_on_one_and_two_gpus(monkeypatch, zoo, tmp_path):
    """A user hook (max error within 5e-4 of the output's peak) needs more FP32 nodes than
    the default criterion on `layernorm_overflow` with a planted fusion. On 2 simulated GPUs
    the workers import the hook again and reach the one-GPU plan, trials and builds."""
    fake.install(monkeypatch, fused=FUSED)
    z = zoo[LN]
    spec, log = write_hook(tmp_path)
    kw = dict(emulator_plan=sorted(z.expected_fp32), certify=True)
    default = search(z, tmp_path / "default", **kw)
    one = search(z, tmp_path / "one", criteria=parse_criteria(checks=[spec]), **kw)
    calls_one = log.read_text().split()
    assert set(calls_one) == {str(os.getpid())}  # judged in this process
    assert len(calls_one) == one.result.trt_checks  # once per engine (one sample)
    assert set(default.result.fp32) == z.expected_fp32 | {"ln/Sub"}
    assert set(one.result.fp32) > set(default.result.fp32)  # the hook asks for more
    assert one.criterion == f"--check {spec}"

    log.unlink()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    two = search(z, tmp_path / "two", criteria=parse_criteria(checks=[spec]), workers=2,
                 worker_setup=functools.partial(install_fake, FUSED), **kw)
    assert two.result.to_json() == one.result.to_json()  # plan, trials, checks
    assert two.builds == one.builds == one.result.trt_checks + 1  # + the FP32 reference
    workers = {b["pid"] for b in two.parallel["builders"]}
    calls_two = {int(p) for p in log.read_text().split()}
    assert len(workers) == 2 and calls_two == workers  # only the GPU workers judged


def test_a_hook_that_raises_in_a_gpu_worker_is_the_one_line_hook_error(monkeypatch, zoo,
                                                                       tmp_path):
    fake.install(monkeypatch)
    z = zoo[LN]
    (tmp_path / "boom.py").write_text("def check(fp32, candidate, sample):\n"
                                      "    raise ValueError('no engines\\nplease')\n")
    crit = parse_criteria(checks=[str(tmp_path / "boom.py")])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    for workers in (None, 2):
        with pytest.raises(TrtBisectError) as err:
            search(z, tmp_path / str(workers), criteria=crit, workers=workers,
                   emulator_plan=sorted(z.expected_fp32),
                   worker_setup=functools.partial(install_fake, ()))
        # a worker names the hook as criteria_flags hands it over: FILE.py:FUNCTION, absolute
        spec = tmp_path / ("boom.py" if workers is None else "boom.py:check")
        assert str(err.value) == f"--check {spec} raised ValueError: no engines please"
        assert err.value.exit_code == EXIT_USAGE


# ------------------------------------------------------------------------ (c) --pass-rate

def test_pass_rate_is_honoured_by_the_trt_search_and_its_workers(monkeypatch, zoo, tmp_path):
    """Two samples: a quiet one (inputs x 1e-3: no overflow, all-FP16 passes) first, then
    the real one (all-FP16 overflows). Every sample must pass by default; --pass-rate 0.5
    takes all-FP16. On 2 GPUs every plan is judged on both samples, as in one process."""
    fake.install(monkeypatch, fused=FUSED)
    z = zoo[LN]
    quiet = {k: v * np.float32(1e-3) for k, v in z.inputs.items()}
    samples = [quiet, z.inputs]
    kw = dict(samples=samples, emulator_plan=sorted(z.expected_fp32), certify=True)
    half = parse_criteria(pass_rate=0.5)
    every = search(z, tmp_path / "every", **kw)
    rate = search(z, tmp_path / "rate", criteria=half, **kw)
    assert phases(every)[0] == ("fp16", False) and every.result.trt_only == ["ln/Sub"]
    assert phases(rate) == [("fp16", True)] and rate.result.fp32 == []
    assert rate.criterion.endswith("on at least 0.5 of the samples")

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    setup = functools.partial(install_fake, FUSED)
    for crit, seq in ((None, every), (half, rate)):
        par = search(z, tmp_path / f"par{crit is None}", criteria=crit, workers=2,
                     worker_setup=setup, **kw)
        assert par.result.to_json() == seq.result.to_json() and par.builds == seq.builds


# -------------------------------------------------------------------------------- (d) CLI

def test_run_backend_trt_takes_the_runs_criterion(monkeypatch, zoo, tmp_path):
    """No refusal any more: `run --backend trt --metric ...` judges the engines by it
    (verify_on_tensorrt passes the run's criteria), where the default fails all-FP16."""
    fake.install(monkeypatch)
    model, inputs = save_zoo_model(zoo["healthy"], tmp_path)
    got = {}
    for name, flags in (("default", []), ("cosine", ["--metric", "cosine:0.999"])):
        r = invoke("-q", "run", model, "--inputs", inputs, "--rtol", "1e-4", "--backend", "trt",
                   "--validation-share", "0", "--out", tmp_path / name, "--json", *flags)
        assert r.exit_code == 0, r.output
        got[name] = json.loads(r.output)
        assert got[name]["tensorrt"] == json.loads(
            (tmp_path / name / "precision.json").read_text())["tensorrt"]
    trt = {k: v["tensorrt"] for k, v in got.items()}
    assert trt["default"]["result"]["trials"][0]["passed"] is False
    assert trt["cosine"]["result"]["trials"][0]["passed"] is True
    assert got["cosine"]["verdict"] == "fp16_ok" and got["cosine"]["fp32_nodes"] == []
    assert got["default"]["fp32_nodes"] and "criterion" not in trt["default"]
    assert trt["cosine"]["criterion"] == "cosine:0.999"


def test_run_backend_trt_hook_raising_on_an_engine_is_a_one_line_error(monkeypatch, zoo,
                                                                       tmp_path):
    """A hook that passes every emulator plan and raises on the first engine it judges: the
    run stops with the hook's one-line error, exit 2, as a raising hook does on the emulator."""
    fake.install(monkeypatch)
    model, inputs = save_zoo_model(zoo["healthy"], tmp_path)
    hook = tmp_path / "engines.py"
    hook.write_text("import sys\n"
                    "def check(fp32, candidate, sample):\n"
                    "    f = sys._getframe()\n"
                    "    while f is not None:\n"
                    "        if f.f_code.co_name == 'run_trt_search':\n"
                    "            raise RuntimeError('not on engines')\n"
                    "        f = f.f_back\n"
                    "    return True\n")
    r = invoke("-q", "run", model, "--inputs", inputs, "--backend", "trt", "--check", hook,
               "--out", tmp_path / "o")
    assert_one_line_error(r, 2, f"--check {hook} raised RuntimeError: not on engines")


def test_run_backend_trt_still_refuses_bf16(monkeypatch, zoo, tmp_path):
    fake.install(monkeypatch)
    model, inputs = save_zoo_model(zoo["healthy"], tmp_path)
    r = invoke("-q", "run", model, "--inputs", inputs, "--backend", "trt", "--precision", "bf16",
               "--out", tmp_path / "o")
    assert_one_line_error(r, 2, "--backend trt verifies FP16 plans only")
