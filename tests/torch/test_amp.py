"""`trtbisect torch`: planted faults found exactly on CPU, the layer-wise view, the emulated
kernels, the pasted snippet, the CLI and its exit codes, torch as an optional extra."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")

from tests.models.torch_models import EXPECTED  # noqa: E402
from trtbisect.cli import main  # noqa: E402
from trtbisect.torch.driver import diagnose  # noqa: E402
from trtbisect.torch.emulation import ReducedStorage  # noqa: E402
from trtbisect.torch.export import load_torch_model  # noqa: E402
from trtbisect.torch.layerwise import layerwise, summarize  # noqa: E402
from trtbisect.torch.precision import pick_precision, reduced  # noqa: E402
from trtbisect.torch.result import TorchOptions  # noqa: E402
from trtbisect.torch.runner import TorchRunner  # noqa: E402

FILE = Path(__file__).parents[1] / "models" / "torch_models.py"


def _diagnose(name: str, mode: str, dtype: str = "fp16", out_dir: Path | None = None):
    tm = load_torch_model(f"{FILE}:{name}")
    return diagnose(tm, TorchOptions(pick_precision(mode, dtype, "cpu")), out_dir)


@pytest.mark.parametrize("mode", ["half", "autocast"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_planted_faults_give_exact_module_sets(name, mode):
    r = _diagnose(name, mode)
    expected = EXPECTED[name][mode]
    assert frozenset(r.fp32_modules) == expected
    assert r.verdict == ("fixed" if expected else "fp16_ok") and r.one_minimal
    assert r.precision.execution == "cpu-emulated"
    assert r.evaluations <= 6  # the layer-wise prior seeds the search
    if expected:
        assert all(e.passed for e in r.errors_after.values())
        assert not all(e.passed for e in r.errors_before.values())
        assert all(e.passed for e in r.snippet_check.values())


def test_bf16_keeps_fp32_range_so_overflow_faults_need_nothing():
    assert _diagnose("overflow", "half", "bf16").verdict == "fp16_ok"
    assert _diagnose("amp_conv_overflow", "autocast", "bf16").verdict == "fp16_ok"


def test_culprits_say_why_in_pytorch_terms():
    why = {c.module: (c.cls, c.why) for c in _diagnose("overflow", "half").culprits}
    assert why["norm"][0] == "RMSNorm" and why["norm"][1].startswith("aten.pow overflows FP16")
    bn = _diagnose("bn_tiny_var", "half").culprits[0]
    assert (bn.module, bn.cls) == ("features.1", "BatchNorm2d") and "running_var" in bn.why
    stem = _diagnose("amp_conv_overflow", "half").culprits[0]
    assert stem.why.startswith("keeps stem.0's output")


def test_layerwise_view_finds_the_first_inf_and_the_overflowing_op():
    tm = load_torch_model(f"{FILE}:amp_conv_overflow")
    stats = layerwise(TorchRunner(tm.module, pick_precision("autocast", "fp16", "cpu")), tm)
    summary = summarize(stats, 0.01)
    assert summary["first_nonfinite"] == "stem.0" and summary["first_overflow"] == "stem.0"
    assert stats["stem.0"].overflow_ops.get("aten.convolution", 0) > 0
    assert stats["stem.0"].fp32_absmax > 65504 and stats["stem.0"].out_of_range > 0
    assert stats["stem.1"].new_nonfinite and not stats["stem.1"].nonfinite_origin
    assert not stats["stem"].nonfinite_origin  # only the innermost module is the origin
    assert list(stats)[:3] == ["stem.0", "stem.1", "stem"]  # the order modules finish


def test_emulation_rounds_every_result_to_the_dtype_the_op_returns():
    x = torch.tensor([300.0, 1.0], dtype=torch.float16)
    events = []
    with ReducedStorage(torch.float16, lambda op, n: events.append((op, n))):
        square = x * x  # 90000 is beyond FP16
        total = x.sum(dtype=torch.float32)  # asked for FP32: stays FP32
        view = x.view(2, 1)  # views stay views
    assert square.dtype == torch.float16 and torch.isinf(square[0]) and square[1] == 1
    assert total.dtype == torch.float32 and float(total) == 301.0
    assert view.data_ptr() == x.data_ptr()
    assert events == [("aten.mul", 1)]


def test_snippet_applies_exactly_the_verified_plan(tmp_path):
    r = _diagnose("amp_conv_overflow", "half", out_dir=tmp_path)
    plan = json.loads((tmp_path / "torch_plan.json").read_text())
    assert plan["fp32_modules"] == ["stem"] and plan["verdict"] == "fixed"
    assert plan["precision"] == {"mode": "half", "dtype": "fp16", "device": "cpu",
                                 "kernels": "emulated", "execution": "cpu-emulated"}
    assert {"module": "stem", "class": "Sequential"}.items() <= plan["culprits"][0].items()
    spec = importlib.util.spec_from_file_location("fp32_plan", tmp_path / "fp32_plan.py")
    snippet = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(snippet)
    assert snippet.FP32_MODULES == ["stem"] and snippet.MODE == "half"
    tm = load_torch_model(f"{FILE}:amp_conv_overflow")
    x = tm.args(tm.samples[0])[0]
    with torch.no_grad():
        ref = tm.module(x)
    model = snippet.apply_trtbisect_plan(tm.module)
    assert model.stem[0].weight.dtype == torch.float32 and model.head.weight.dtype == torch.float16
    with reduced(r.precision):
        y = model(x.half())
    assert y.dtype == torch.float16 and torch.isfinite(y).all()
    assert float((y.float() - ref).abs().max()) <= 0.01 * float(ref.abs().max())


BAD = textwrap.dedent("""
    import torch
    from torch import nn

    class Huge(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(3, 3)
            self.head = nn.Linear(3, 2)
            with torch.no_grad():
                self.head.weight.mul_(1e6)

        def forward(self, x):
            return self.head(self.body(x))

    def huge():
        torch.manual_seed(0)
        return Huge(), torch.ones(2, 3)

    class Nan(nn.Module):
        def forward(self, x):
            return torch.log(-x.abs() - 1)

    def nan():
        return Nan()
""")


@pytest.fixture()
def bad_file(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text(BAD)
    return path


@pytest.mark.parametrize("factory, args, code, verdict", [
    ("huge", ["--mode", "half"], 4, "no_plan"),  # its output itself is beyond FP16
    ("huge", ["--mode", "autocast"], 0, "fixed"),  # an FP32 head returns FP32
    ("nan", ["--input", "x:2x3"], 3, "reference_invalid"),
    ("huge", ["--no-search"], 0, "not_searched"),
])
def test_torch_cli_exit_codes(bad_file, tmp_path, factory, args, code, verdict):
    r = CliRunner().invoke(main, ["-q", "torch", f"{bad_file}:{factory}", *args, "--device", "cpu",
                                  "--out", str(tmp_path / "out"), "--json"])
    assert r.exit_code == code, r.output
    assert json.loads(r.stdout)["verdict"] == verdict


def test_torch_cli_human_output(tmp_path):
    r = CliRunner().invoke(main, ["-q", "torch", f"{FILE}:overflow", "--mode", "half",
                                  "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    for text in ("emulated kernels", "first module whose ops overflow: norm", "RMSNorm",
                 "aten.pow", "certified 1-minimal", "fp32_plan.py"):
        assert text in r.stdout
    assert {p.name for p in tmp_path.iterdir()} >= {"torch_plan.json", "fp32_plan.py",
                                                    "torch_layerwise.json"}


def test_every_torch_command_has_help():
    for command in ("export", "torch"):
        r = CliRunner().invoke(main, [command, "--help"])
        assert r.exit_code == 0 and "Example" in r.output


def test_without_torch_the_commands_give_an_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails
    for command in ("torch", "export"):
        r = CliRunner().invoke(main, [command, f"{FILE}:overflow"])
        assert r.exit_code == 2 and "pip install 'trtbisect[torch]'" in r.output


def test_import_and_help_do_not_import_torch():
    code = ("import sys, trtbisect, trtbisect.cli\n"
            "from click.testing import CliRunner\n"
            "for args in (['--help'], ['torch', '--help'], ['export', '--help'], ['run', '--help']):\n"
            "    assert CliRunner().invoke(trtbisect.cli.main, args).exit_code == 0\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


@pytest.mark.gpu
@pytest.mark.parametrize("name, mode", [("overflow", "half"), ("amp_conv_overflow", "autocast")])
def test_cuda_real_kernels_find_the_planted_fault(name, mode):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    tm = load_torch_model(f"{FILE}:{name}")
    r = diagnose(tm, TorchOptions(pick_precision(mode, "fp16", "cuda")))
    assert r.precision.execution == "cuda-native"
    assert frozenset(r.fp32_modules) == EXPECTED[name][mode]


def test_input_samples_are_seeded(bad_file):
    a = load_torch_model(f"{bad_file}:nan", ["x:2x3"], seed=5, samples=2)
    b = load_torch_model(f"{bad_file}:nan", ["x:2x3"], seed=5, samples=2)
    assert len(a.samples) == 2 and np.array_equal(a.samples[1]["x"], b.samples[1]["x"])
    assert not np.array_equal(a.samples[0]["x"], a.samples[1]["x"])


def test_torch_takes_the_criterion_flags(tmp_path):
    """`torch` judges by the same criteria as `run` (judge/flags.py): the outputs carry the
    criterion's scores, and a broken --check hook is one line and exit 2."""
    r = CliRunner().invoke(main, ["-q", "torch", f"{FILE}:overflow", "--mode", "half",
                                  "--metric", "cosine:0.999", "--check-error-stat", "quantile",
                                  "--out", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert plan["verdict"] == "fixed"
    (e,) = plan["errors_after"].values()
    assert {s["criterion"] for s in e["scores"]} == {"quantile", "cosine:0.999"}
    hook = tmp_path / "hook.py"
    hook.write_text("def check(fp32, fp16, sample):\n    return 1\n")
    r = CliRunner().invoke(main, ["-q", "torch", f"{FILE}:overflow", "--mode", "half",
                                  "--check", f"{hook}:check", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "returned int 1" in r.output and "Traceback" not in r.output


def test_torch_takes_precision_as_run_does_and_bf16_holds_the_overflow():
    """`--precision bf16` (the flag run/compare/check take; --dtype still works): bfloat16
    has FP32's range, so the RMSNorm overflow FP16 needs FP32 for is fine."""
    for flag in ("--precision", "--dtype"):
        r = CliRunner().invoke(main, ["-q", "torch", f"{FILE}:overflow", "--mode", "half",
                                      flag, "bf16", "--device", "cpu", "--json"])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["verdict"] == "fp16_ok"
