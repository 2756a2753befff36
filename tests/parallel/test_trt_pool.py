"""TensorRT builders on several GPUs (`TrtSearchOptions(workers=N)`, parallel/trt_pool.py).

On the fake TensorRT only (tests/fixtures/trt/): each spawned worker installs it before it
builds its TrtBackend, and "GPUs" are `CUDA_VISIBLE_DEVICES` entries no CUDA ever reads. What
is shown: the plan, the trace and the builds of the sequential TensorRT search, each worker on
its own device, a dead worker replaced. Nothing here ran on TensorRT or a GPU.
"""

from __future__ import annotations

import functools
import os

import pytest

from tests.backends.test_trt_backend import LN, fake
from trtbisect.parallel import trt_pool
from trtbisect.parallel.pool import DIE_ONCE_ENV
from trtbisect.stages.trt import TrtSearchOptions, run_trt_search

FUSED = (("ln/Sub", "ln/Pow"),)  # TensorRT disagrees with the emulator: a refinement runs


def install_fake(fused: tuple = ()) -> None:
    """A worker's setup (spawned: it runs there, before TensorRT is imported)."""
    fake.install(pytest.MonkeyPatch(), fused=fused)


def search(z, out, workers=None, setup=None):
    return run_trt_search(z.model, [z.inputs], out / "out",
                          TrtSearchOptions(cache_dir=out / "c", certify=True, workers=workers,
                                           worker_setup=setup),
                          emulator_plan=sorted(z.expected_fp32))


@pytest.mark.parametrize("workers", [2, 3])
def test_gpu_workers_reach_the_sequential_plan_trace_and_builds(monkeypatch, zoo, tmp_path,
                                                                workers):
    fake.install(monkeypatch, fused=FUSED)
    z = zoo[LN]
    seq = search(z, tmp_path / "seq")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    said = []
    par = run_trt_search(
        z.model, [z.inputs], tmp_path / "par" / "out",
        TrtSearchOptions(cache_dir=tmp_path / "par" / "c", certify=True, workers=workers,
                         worker_setup=functools.partial(install_fake, FUSED)),
        emulator_plan=sorted(z.expected_fp32), say=said.append)
    assert seq.result.emulator_agreed is False and seq.result.trt_only == ["ln/Sub"]
    assert par.result.to_json() == seq.result.to_json()  # plan, trials (the trace), checks
    assert par.builds == seq.builds == seq.result.trt_checks + 1  # + the FP32 reference
    info = par.parallel
    assert info["gpus"] == ["0", "1", "2"][:workers]
    assert said == [info["chosen"]] and info["chosen"].startswith(f"TensorRT builders: {workers} GPUs")
    assert info["evaluated"] - info["speculative"] == seq.result.trt_checks
    assert info["rounds"] < seq.result.trt_checks  # some plans were built side by side
    pids = {b["pid"]: b["gpu"] for b in info["builders"]}
    assert os.getpid() not in pids and len(set(pids.values())) == len(pids) >= 2
    assert set(pids.values()) <= set(info["gpus"])
    assert sum(b["plans"] for b in info["builders"]) == info["evaluated"]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2"  # the parent's own is untouched
    assert "parallel" not in seq.to_json() and par.to_json()["parallel"] == info


def test_a_dead_gpu_worker_is_replaced_and_its_plan_built_again(monkeypatch, zoo, tmp_path):
    fake.install(monkeypatch, fused=FUSED)
    z = zoo[LN]
    seq = search(z, tmp_path / "seq")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.setenv(DIE_ONCE_ENV, str(tmp_path / "died"))
    par = search(z, tmp_path / "par", 2, functools.partial(install_fake, FUSED))
    assert (tmp_path / "died").exists() and par.parallel["replaced"] == 1
    assert par.result.to_json() == seq.result.to_json() and par.builds == seq.builds
    assert {b["gpu"] for b in par.parallel["builders"]} <= {"3", "5"}


def test_one_visible_gpu_builds_in_this_process(monkeypatch, zoo, tmp_path):
    fake.install(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    z = zoo[LN]
    report = search(z, tmp_path, workers=4)
    assert report.parallel == {"gpus": ["1"], "chosen": report.parallel["chosen"]}
    assert report.parallel["chosen"].startswith("TensorRT builders: 1 GPU, in this process")
    assert set(report.result.fp32) == z.expected_fp32


@pytest.mark.parametrize("env, workers, expected", [
    ({"CUDA_VISIBLE_DEVICES": "0,1,2"}, 2, ["0", "1"]),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2"}, 8, ["0", "1", "2"]),
    ({"CUDA_VISIBLE_DEVICES": "GPU-a1, GPU-b2"}, 4, ["GPU-a1", "GPU-b2"]),
    ({"CUDA_VISIBLE_DEVICES": "2,-1,3"}, 4, ["2"]),  # CUDA stops at an invalid entry
    ({"CUDA_VISIBLE_DEVICES": ""}, 4, []),  # no GPU at all
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, None, ["0"]),  # no --workers: one builder
])
def test_gpus_come_from_cuda_visible_devices(env, workers, expected):
    def smi():
        raise AssertionError("nvidia-smi is not asked when CUDA_VISIBLE_DEVICES is set")
    devices, why = trt_pool.choose_gpus(workers, env, smi)
    assert devices == expected
    assert why.startswith({0: "TensorRT builders: no GPU visible",
                           1: "TensorRT builders: 1 GPU, in this process"}.get(
        len(devices), f"TensorRT builders: {len(devices)} GPUs"))


def test_gpus_come_from_nvidia_smi_else_one_is_assumed():
    listing = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n"
               "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)\n"
               "  MIG 1g.10gb Device 0: (UUID: MIG-3)\n"
               "GPU 2: NVIDIA H100 80GB HBM3 (UUID: GPU-4)\n")
    devices, why = trt_pool.choose_gpus(8, {}, lambda: listing)
    assert devices == ["0", "1", "2"] and "from nvidia-smi -L" in why
    assert trt_pool.choose_gpus(8, {}, lambda: None)[0] == ["0"]


def test_run_with_workers_builds_on_the_gpus_and_says_so(monkeypatch, zoo, tmp_path):
    """`trtbisect run --backend trt --workers 2` as the CLI drives it (pipeline.run, then
    verify_on_tensorrt): precision.json says which GPUs built, and the plan is the one-GPU
    run's."""
    import json

    from tests.conftest import save_zoo_model
    from trtbisect.context import Options
    from trtbisect.pipeline import run, verify_on_tensorrt

    fake.install(monkeypatch, fused=FUSED)
    start = trt_pool.start
    monkeypatch.setattr(trt_pool, "start", lambda b, s, r, d, j, _setup: start(
        b, s, r, d, j, functools.partial(install_fake, FUSED)))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    model, inputs = save_zoo_model(zoo[LN], tmp_path)
    got = {}
    for workers in (1, 2):
        opts = Options.of(inputs=[str(inputs)], workers=workers, threads=1)
        out = tmp_path / f"w{workers}"
        said: list[str] = []
        monkeypatch.setenv("TRTBISECT_CACHE_DIR", str(tmp_path / f"engines{workers}"))
        verify_on_tensorrt(run(model, opts, out), opts, out, said.append)
        got[workers] = json.loads((out / "precision.json").read_text())["tensorrt"]
        assert [m for m in said if m.startswith("TensorRT builders")] == (
            ["TensorRT builders: 2 GPUs (0, 1; 2 visible, from CUDA_VISIBLE_DEVICES=0,1; "
             "--workers 2)"] if workers == 2 else [])
    assert got[2]["result"] == got[1]["result"] and got[1]["result"]["trt_only"] == ["ln/Sub"]
    assert got[2]["builds"] == got[1]["builds"] == got[1]["result"]["trt_checks"] + 1
    assert "parallel" not in got[1] and got[2]["parallel"]["gpus"] == ["0", "1"]
