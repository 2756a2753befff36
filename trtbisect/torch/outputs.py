"""What a `trtbisect torch` run writes: torch_plan.json, torch_layerwise.json,
torch_trace.json and fp32_plan.py."""

from __future__ import annotations

import inspect
import json
import time
from dataclasses import replace
from pathlib import Path

from .result import TorchResult
from .snippet import SNIPPET_FUNCTIONS


def _finish(result: TorchResult, out_dir: Path | None, started: float) -> TorchResult:
    """The result with its time, and with the files it wrote where it has `out_dir`: each a
    new result (a result is never changed once built)."""
    result = replace(result, seconds=time.perf_counter() - started)
    return write_outputs(result, out_dir) if out_dir is not None else result


def write_outputs(result: TorchResult, out_dir: Path) -> TorchResult:
    """The run's files as one generation of `out_dir` (outputs/outdir.py, as `run` writes its
    own): an earlier run's files move to `.previous/`, never left beside these, and
    torch_plan.json comes last. Returns the result with the files it wrote."""
    from ..base.files import atomic_write_json, atomic_write_records, atomic_write_text
    from ..outputs.outdir import TORCH_PLAN, OutputDir

    files = dict(result.files)
    with OutputDir(out_dir).generation(keep=_inputs(result.source)) as gen:
        if result.stats:
            atomic_write_records(out_dir / "torch_layerwise.json",
                                 [s.to_json() for s in result.stats.values()])
            files["layerwise"] = str(out_dir / "torch_layerwise.json")
        if result.verdict in ("fixed", "fp16_ok"):
            atomic_write_text(out_dir / "fp32_plan.py", render_snippet(result))
            files["snippet"] = str(out_dir / "fp32_plan.py")
        if result.search is not None:
            atomic_write_json(out_dir / "torch_trace.json", result.search.to_json())
            files["trace"] = str(out_dir / "torch_trace.json")
        files["plan"] = str(out_dir / TORCH_PLAN)
        result = replace(result, files=files)
        gen.commit(result.to_json(), TORCH_PLAN)
    return result


def _inputs(source: str) -> list[Path]:
    """The factory's file (`model.py:build`): an input of the run, never moved or deleted."""
    path = Path(source.rpartition(":")[0] or source)
    return [path] if path.suffix == ".py" else []


def render_snippet(result: TorchResult) -> str:
    """fp32_plan.py: the plan and the exact code that was verified, ready to paste."""
    p = result.precision
    dtype = "torch.float16" if p.dtype == "fp16" else "torch.bfloat16"
    if p.mode == "half":
        usage = (f"    model = apply_trtbisect_plan(model)  # the rest becomes {dtype}\n"
                 f"    y = model(x.to({dtype}))")
    else:
        usage = ("    model = apply_trtbisect_plan(model)\n"
                 f"    with torch.autocast(\"{p.device}\", dtype={dtype}):\n"
                 "        y = model(x)")
    lines = [
        f'"""trtbisect plan for {result.source}: keep {len(result.fp32_modules)} module(s) in '
        f"FP32 under {p.mode} {p.dtype}.",
        "",
        f"Found with {p.describe()}; verdict: {result.verdict}.",
        "",
        "Usage:",
        usage,
        '"""',
        "",
        "import functools",
        "",
        "import torch",
        "",
        f"FP32_MODULES = {json.dumps(result.fp32_modules, indent=4)}",
        f'MODE = "{p.mode}"',
        f"DTYPE = {dtype}",
        "",
        "",
        "def apply_trtbisect_plan(model):",
        '    """Apply the plan to `model` in place and return it."""',
        "    return apply_plan(model, FP32_MODULES, MODE, DTYPE)",
        "",
    ]
    for fn in SNIPPET_FUNCTIONS:
        lines += ["", inspect.getsource(fn).rstrip(), ""]
    return "\n".join(lines)
