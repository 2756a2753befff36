"""The torch run's result: torch_plan.json keeps its keys, their order and their values
(tests/fixtures/torch_plan_golden.json, written by the code before the torch result became
a kind of the run's result; rewrite it with `python -m tests.torch.test_torch_result` only for a
change of the file's contents that is meant), and its verdicts' exit codes are the run's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.torch.test_amp import BAD as BROKEN  # noqa: E402  (huge: beyond FP16; nan: FP32 NaN)
from trtbisect.judge.criteria import Criteria  # noqa: E402
from trtbisect.result import VERDICT_EXIT  # noqa: E402
from trtbisect.torch.driver import diagnose  # noqa: E402
from trtbisect.torch.export import load_torch_model  # noqa: E402
from trtbisect.torch.precision import pick_precision  # noqa: E402
from trtbisect.torch.result import TorchOptions  # noqa: E402

MODELS = Path(__file__).parents[1] / "models" / "torch_models.py"
GOLDEN = Path(__file__).parents[1] / "fixtures" / "torch_plan_golden.json"
# case -> (models file, factory, mode, --input, search, samples, pass rate, verdict): each
# verdict, and samples judged under the default criterion and under a pass rate
CASES = {
    "fixed": ("models", "amp_conv_overflow", "half", (), True, 1, 1.0, "fixed"),
    "fp16_ok": ("models", "healthy", "autocast", (), True, 1, 1.0, "fp16_ok"),
    "not_searched": ("models", "overflow", "half", (), False, 1, 1.0, "not_searched"),
    "no_plan": ("broken", "huge", "half", (), True, 1, 1.0, "no_plan"),
    "reference_invalid": ("broken", "nan", "half", ("x:2x3",), True, 1, 1.0,
                          "reference_invalid"),
    "fixed_on_3_samples": ("broken", "huge", "autocast", ("x:2x3",), True, 3, 1.0, "fixed"),
    "no_plan_on_3_samples": ("broken", "huge", "half", ("x:2x3",), True, 3, 1.0, "no_plan"),
    "fixed_on_2_of_3_samples": ("broken", "huge", "autocast", ("x:2x3",), True, 3, 0.6,
                                "fixed"),
}


def _plan(case: str, folder: Path) -> tuple[dict, dict, int, dict]:
    """(torch_plan.json, to_json(), exit code, the other files written) of `case`, with what
    varies from run to run (versions, the folder, seconds) set to fixed values."""
    which, factory, mode, inputs, search, samples, rate, _ = CASES[case]
    source = MODELS
    if which == "broken":
        source = folder / "broken.py"
        source.write_text(BROKEN)
    tm = load_torch_model(f"{source}:{factory}", inputs, samples=samples)
    out = folder / "out"
    opts = TorchOptions(pick_precision(mode, "fp16", "cpu"), search=search,
                        criteria=Criteria(pass_rate=rate))
    r = diagnose(tm, opts, out)
    written = json.loads((out / "torch_plan.json").read_text())
    others = {f.name: f.read_text().replace(str(folder), "<folder>")
              .replace(str(MODELS.parent), "<models>")
              for f in sorted(out.iterdir())
              if f.name != "torch_plan.json" and not f.name.startswith(".trtbisect")}
    return _steady(written, folder), _steady(r.to_json(), folder), r.exit_code, others


def _steady(plan: dict, folder: Path) -> dict:
    fixed = {"version": "V", "torch": "T", "seconds": 0.0, "source": Path(plan["source"]).name,
             "files": {k: Path(v).relative_to(folder).as_posix()
                       for k, v in plan["files"].items()}}
    return json.loads(json.dumps({k: fixed.get(k, v) for k, v in plan.items()}))


def test_a_run_into_an_earlier_runs_folder_leaves_none_of_its_files_beside_its_own(tmp_path):
    """One generation per --out, as `run` writes (outputs/outdir.py): a no_plan run into the
    folder of a fixed run retires that run's fp32_plan.py to .previous/ (a deploy script
    never pastes the old plan beside the new verdict); the user's own file there stays."""
    fixed = tmp_path / "fixed"
    fixed.mkdir()
    _plan("fixed", fixed)
    out = fixed / "out"
    (out / "notes.txt").write_text("mine")
    opts = TorchOptions(pick_precision("half", "fp16", "cpu"))
    source = tmp_path / "broken.py"
    source.write_text(BROKEN)
    r = diagnose(load_torch_model(f"{source}:huge", ()), opts, out)
    assert r.verdict == "no_plan"
    assert not (out / "fp32_plan.py").exists()
    assert (out / ".previous" / "fp32_plan.py").is_file()
    assert json.loads((out / ".previous" / "torch_plan.json").read_text())["verdict"] == "fixed"
    assert json.loads((out / "torch_plan.json").read_text())["verdict"] == "no_plan"
    assert (out / "notes.txt").read_text() == "mine"


def test_an_older_torch_runs_folder_is_retired_not_refused(tmp_path):
    """A folder an earlier trtbisect's `torch` run wrote, with no manifest: its
    torch_plan.json lists its files, so they are retired like a generation's."""
    import os
    _plan("fixed", tmp_path)
    out = tmp_path / "out"
    os.remove(out / ".trtbisect-manifest.json")
    r = diagnose(load_torch_model(f"{MODELS}:healthy", ()),
                 TorchOptions(pick_precision("autocast", "fp16", "cpu")), out)
    assert r.verdict == "fp16_ok"
    assert (out / ".previous" / "torch_trace.json").is_file()
    assert json.loads((out / "torch_plan.json").read_text())["verdict"] == "fp16_ok"


@pytest.mark.parametrize("case", sorted(CASES))
def test_torch_plan_json_keeps_its_keys_order_and_values(case, tmp_path):
    written, returned, code, others = _plan(case, tmp_path)
    golden = json.loads(GOLDEN.read_text())[case]
    assert written["verdict"] == CASES[case][-1]
    assert list(written) == list(golden["plan"])  # the keys, in the file's order
    # the values; floats to the CPU's summation order (a mean of float32 errors differs in its
    # fifth digit between x86 kernels: the golden was written on another processor)
    assert _same(written, golden["plan"])
    assert returned == written  # what --json prints is what the file says
    assert code == golden["exit_code"] == VERDICT_EXIT[written["verdict"]]  # run's table
    assert _same(others, golden["others"])  # torch_trace.json, torch_layerwise.json, ...


def _same(a, b) -> bool:
    """Equal, keys in order, floats within 1e-3 relative (and ints and strings exactly)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-3, abs=1e-12, nan_ok=True)
    if isinstance(a, str) and isinstance(b, str) and a != b:  # a JSON file's text
        try:
            return _same(json.loads(a), json.loads(b))
        except ValueError:
            return False
    return a == b


def _write_golden(folder: Path) -> None:
    out = {}
    for case in sorted(CASES):
        (folder / case).mkdir()
        written, _, code, others = _plan(case, folder / case)
        out[case] = {"plan": written, "exit_code": code, "others": others}
    GOLDEN.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory(prefix="trtbisect-golden-") as d:
        _write_golden(Path(d))
    sys.exit(0)
