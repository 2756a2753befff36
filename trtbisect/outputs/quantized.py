"""The quantized plan for other tools: ModelOpt's ONNX PTQ with the plan's layers excluded
(Python and CLI), trtexec and Polygraphy on the plan's file, and the commands file. The mixed
Q/DQ model itself is written by quant/run.py (the plan's layers with their Q/DQ removed:
TensorRT 10 and 11 build it as it stands).

It sits beside render.py, not in it: render.py renders one plan of FP32 nodes through a
`RenderContext` (the FP16/BF16 road's trtexec, Polygraphy, AutoCast and TensorRT Python views
of one mixed ONNX), while a quantized plan is other data (the Q/DQ layers left in float, the
FP16 nodes kept in FP32, the FP32 model it was quantized from) for another tool's grammar
(ModelOpt's PTQ `nodes_to_exclude`); both are outputs/, below the runs that call them. It takes
plain data (`QuantPlan`), never quant/'s objects: outputs/ sits below quant/
(docs/architecture.md), and quant/run.py makes the `QuantPlan` of its result.

ModelOpt matches each `nodes_to_exclude` entry as a regular expression with `re.match`
(modelopt.onnx.quantization's expand_node_names_from_patterns), so a name is escaped and
anchored: `^` by re.match, `$` here; a name with regex syntax in it matches only itself.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base.escape import visible

# ModelOpt with --no-deps (its metadata asks an unpinned torch: the CUDA build), then the quant
# extra: everything ModelOpt 0.47 requires and its ONNX PTQ imports, so pip's resolver has
# nothing to say (pyproject.toml; tried in a fresh venv, docs/quantization.md "Set-up")
INSTALL = ("pip install --no-deps nvidia-modelopt==0.47.0 && pip install 'trtbisect[quant]' "
           "(from a checkout: pip install -e '.[quant]'; docs/quantization.md)")
CALIB = "calib.npz"  # the calibration data ModelOpt was given, as commands.sh names it


@dataclass(frozen=True)
class QuantPlan:
    """What the renderings need of a quantized run's plan, as plain data."""

    model_path: str  # the Q/DQ file judged: its stem names the plan's .unquantized.onnx
    reference: str  # the FP32 model's path (a `.onnx`), else words saying what it was
    formats: frozenset[str]  # the formats of the file's quantized layers (int8, fp8, ...)
    unquantized: tuple[str, ...]  # the plan's layers left in float, in the plan's order
    fp32_ops: tuple[str, ...]  # op types of the plan's FP16 nodes kept in FP32, sorted, once
    half: bool  # the file has FP16 nodes (ModelOpt's FP16 elsewhere)
    plan_file: bool  # the run wrote the plan's file (its search has units)

    @property
    def stem(self) -> str:
        return self.model_path.rsplit("/", 1)[-1].removesuffix(".onnx")


@dataclass(frozen=True)
class Reproduction:
    """ModelOpt's own run of the rendered exclusions (quant/ptq.py `reproduce`): whether it
    ran (`error`: its first line where it did not), the file it wrote, whether it quantizes
    exactly the layers the plan keeps quantized (else which it also leaves un-quantized and
    which it also quantizes), and that file judged by the run's judge (`errors`: per output,
    as precision.json writes an error). precision.json's renderings hold its JSON
    ("modelopt_reproduction")."""

    ran: bool
    error: str = ""
    path: str = ""
    exact: bool = False
    also_unquantized: tuple[str, ...] = ()
    also_quantized: tuple[str, ...] = ()
    passed: bool = False
    errors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict:
        if not self.ran:
            return {"ran": False, "error": self.error}
        return {"ran": True, "path": self.path, "exact": self.exact,
                "also_unquantized": list(self.also_unquantized),
                "also_quantized": list(self.also_quantized), "passed": self.passed,
                "errors": {k: dict(e) for k, e in self.errors.items()}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Reproduction:
        if not d["ran"]:
            return cls(False, d.get("error", ""))
        return cls(True, "", d["path"], d["exact"], tuple(d["also_unquantized"]),
                   tuple(d["also_quantized"]), d["passed"],
                   {k: dict(e) for k, e in d["errors"].items()})

    @classmethod
    def of(cls, renderings: Mapping[str, Any]) -> Reproduction | None:
        """The one a run's renderings hold, if any."""
        rep = renderings.get("modelopt_reproduction")
        return cls.from_json(rep) if rep else None


def quantize_mode(formats: Iterable[str]) -> str:
    """ModelOpt's --quantize_mode for a file of these formats."""
    return "fp8" if any(f.startswith("fp8") for f in formats) else "int8"


def patterns(names: Iterable[str]) -> list[str]:
    """`nodes_to_exclude` entries that match exactly these node names."""
    return [re.escape(n) + "$" for n in names]


def renderings(plan: QuantPlan, reproduction: Reproduction | None = None,
               calibrated: bool = False) -> dict:
    """Every tool's view of the plan. `reproduction`: ModelOpt's own run of the rendered
    exclusions (quant/ptq.reproduce), said beside its line and recorded; `calibrated`:
    calib.npz is the data trtbisect gave ModelOpt (else the run's samples)."""
    mode = quantize_mode(plan.formats)
    excl = patterns(plan.unquantized)
    known = plan.reference.endswith(".onnx")
    # commands.sh runs from the run folder: the FP32 model by its absolute path
    ref = str(Path(plan.reference).resolve()) if known else "model_fp32.onnx"
    # a file FP16 elsewhere is rewritten so; ModelOpt keeps FP16 nodes in FP32 by op type only
    high = "fp16" if plan.half else "fp32"
    fp32_ops = list(plan.fp32_ops)
    python = (
        "from modelopt.onnx.quantization import quantize\n"
        f"quantize(onnx_path={ref!r}, quantize_mode={mode!r},\n"
        "         calibration_data=CALIBRATION,  # the samples the file was calibrated on\n"
        f"         high_precision_dtype={high!r}, calibration_eps=['cpu'],\n"
        f"         nodes_to_exclude={excl!r},\n"
        + (f"         op_types_to_exclude_fp16={fp32_ops!r},  # by op type: coarser than "
           "the plan's nodes\n" if fp32_ops else "")
        + "         output_path='model.quant.onnx')\n")
    cli = ["python", "-m", "modelopt.onnx.quantization", f"--onnx_path={ref}",
           f"--quantize_mode={mode}", f"--calibration_data_path={CALIB}",
           f"--high_precision_dtype={high}", "--calibration_eps", "cpu",
           "--output_path=model.quant.onnx"]
    if excl:
        cli += ["--nodes_to_exclude", *excl]
    if fp32_ops:
        cli += ["--op_types_to_exclude_fp16", *fp32_ops]
    cli_line = shlex.join(cli)
    lines = ["#!/bin/sh", "# trtbisect: the quantized plan for other tools (precision.json has "
             "the plan and its reasons)",
             "# Paths are relative to this folder: the script runs from here wherever it is "
             "called from.", 'cd "$(dirname "$0")" || exit 1',
             f"# ModelOpt ONNX PTQ, the plan's {len(plan.unquantized)} layer(s) left in float "
             f"({INSTALL}); {CALIB}: "
             + ("the data ModelOpt was given" if calibrated else
                "the run's samples (the file's own calibration data is not known)"),
             *([] if known else ["# model_fp32.onnx: the FP32 model the file was quantized "
                                 "from (give it with --reference to name it here)"]),
             cli_line, *reproduction_lines(reproduction)]
    plan_file = f"{plan.stem}.unquantized.onnx"
    if plan.plan_file:
        lines += ["# TensorRT (strongly typed: precision comes from the Q/DQ in the file):",
                  shlex.join(["trtexec", f"--onnx={plan_file}", "--stronglyTyped"]),
                  "# Polygraphy: the reference's outputs on ONNX Runtime, then the plan's "
                  "engine against them (give the run's tolerance; precision.json has its "
                  "bounds)",
                  shlex.join(["polygraphy", "run", ref, "--onnxrt", "--save-outputs",
                              "reference_outputs.json"]),
                  shlex.join(["polygraphy", "run", plan_file, "--trt", "--strongly-typed",
                              "--load-outputs", "reference_outputs.json"])]
    return {"modelopt_nodes_to_exclude": excl, "modelopt_op_types_to_exclude_fp16": fp32_ops,
            "trtexec": shlex.join(["trtexec", f"--onnx={plan_file}", "--stronglyTyped"])
            if plan.plan_file else None,
            "modelopt_python": python,
            "modelopt_cli": cli_line, "quantize_mode": mode,
            **({"modelopt_reproduction": reproduction.to_json()}
               if reproduction is not None else {}),
            "commands_sh": "\n".join(lines) + "\n"}


def reproduction_lines(rep: Reproduction | None) -> list[str]:
    """commands.sh's words on ModelOpt's own run of the line above (quant/ptq.reproduce)."""
    if rep is None:
        return []
    if not rep.ran:
        return [f"# ModelOpt failed on this line here: {visible(rep.error)}"]
    name = visible(rep.path.rsplit("/", 1)[-1])
    judged = "passes" if rep.passed else "FAILS"
    worst = max((e.get("rel", 0.0) for e in rep.errors.values()
                 if isinstance(e.get("rel"), (int, float))), default=None)
    said = f" (max relative error {worst:.3g})" if worst is not None else ""
    if rep.exact:
        return [f"# tried: ModelOpt quantizes exactly the layers the plan keeps quantized; its "
                f"file ({name}) {judged} the run's criteria{said}"]
    off = []
    if rep.also_unquantized:
        off.append(f"also leaves {', '.join(map(visible, rep.also_unquantized))} un-quantized "
                   "(it skips neighbours of excluded nodes)")
    if rep.also_quantized:
        off.append(f"quantizes {', '.join(map(visible, rep.also_quantized))} besides")
    return [f"# ModelOpt cannot reproduce the plan exactly: it {'; it '.join(off)}; its file "
            f"({name}) {judged} the run's criteria{said}. The plan itself is the "
            ".unquantized.onnx file below"]
