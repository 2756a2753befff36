"""The quantized plan for other tools: ModelOpt's ONNX PTQ with the plan's layers excluded
(Python and CLI), and the commands file. The mixed Q/DQ model itself is written by run.py
(the plan's layers with their Q/DQ removed: TensorRT 10 and 11 build it as it stands).

ModelOpt matches each `nodes_to_exclude` entry as a regular expression with `re.match`
(modelopt.onnx.quantization's expand_node_names_from_patterns), so a name is escaped and
anchored: `^` by re.match, `$` here; a name with regex syntax in it matches only itself.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import onnx

from ..base.escape import visible

QuantResult = Any  # quant/run.py's QuantResult (it imports this module: no import back)

# ModelOpt with --no-deps (its metadata asks an unpinned torch: the CUDA build), then the quant
# extra: everything ModelOpt 0.47 requires and its ONNX PTQ imports, so pip's resolver has
# nothing to say (pyproject.toml; tried in a fresh venv, docs/quantization.md "Set-up")
INSTALL = ("pip install --no-deps nvidia-modelopt==0.47.0 && pip install 'trtbisect[quant]' "
           "(from a checkout: pip install -e '.[quant]'; docs/quantization.md)")


def quantize_mode(formats) -> str:
    """ModelOpt's --quantize_mode for a file of these formats."""
    return "fp8" if any(f.startswith("fp8") for f in formats) else "int8"


def patterns(names) -> list[str]:
    """`nodes_to_exclude` entries that match exactly these node names."""
    return [re.escape(n) + "$" for n in names]


def stem_of(result: "QuantResult") -> str:
    return result.model_path.rsplit("/", 1)[-1].removesuffix(".onnx")


def renderings(result: "QuantResult", model: onnx.ModelProto,
               reproduction: dict | None = None, calibrated: bool = False) -> dict:
    """Every tool's view of the plan. `reproduction`: ModelOpt's own run of the rendered
    exclusions (ptq.reproduce), said beside its line and recorded; `calibrated`: calib.npz is
    the data trtbisect gave ModelOpt (else the run's samples)."""
    from pathlib import Path

    mode = quantize_mode({f for la in result.layers for f in la.formats})
    excl = patterns(result.plan)
    known = result.reference.endswith(".onnx")
    # commands.sh runs from the run folder: the FP32 model by its absolute path
    ref = str(Path(result.reference).resolve()) if known else "model_fp32.onnx"
    # a file FP16 elsewhere is rewritten so; ModelOpt keeps FP16 nodes in FP32 by op type only
    high = "fp16" if result.half_nodes else "fp32"
    fp32_ops = sorted(set(result.fp32_ops.values()))
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
           f"--quantize_mode={mode}", "--calibration_data_path=calib.npz",
           f"--high_precision_dtype={high}", "--calibration_eps", "cpu",
           "--output_path=model.quant.onnx"]
    if excl:
        cli += ["--nodes_to_exclude", *excl]
    if fp32_ops:
        cli += ["--op_types_to_exclude_fp16", *fp32_ops]
    cli_line = shlex.join(cli)
    lines = ["#!/bin/sh", "# trtbisect: the quantized plan for other tools (precision.json has "
             "the plan and its reasons)",
             f"# ModelOpt ONNX PTQ, the plan's {len(result.plan)} layer(s) left in float "
             f"({INSTALL}); calib.npz: "
             + ("the data ModelOpt was given" if calibrated else
                "the run's samples (the file's own calibration data is not known)"),
             *([] if known else ["# model_fp32.onnx: the FP32 model the file was quantized "
                                 "from (give it with --reference to name it here)"]),
             cli_line, *_reproduction_lines(reproduction)]
    if result.units:
        plan_file = f"{stem_of(result)}.unquantized.onnx"
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
            "trtexec": shlex.join(["trtexec", f"--onnx={stem_of(result)}.unquantized.onnx",
                                   "--stronglyTyped"]) if result.units else None,
            "modelopt_python": python,
            "modelopt_cli": cli_line, "quantize_mode": mode,
            **({"modelopt_reproduction": reproduction} if reproduction is not None else {}),
            "commands_sh": "\n".join(lines) + "\n"}


def _reproduction_lines(rep: dict | None) -> list[str]:
    """commands.sh's words on ModelOpt's own run of the line above (ptq.reproduce)."""
    if rep is None:
        return []
    if not rep.get("ran"):
        return [f"# ModelOpt failed on this line here: {visible(rep.get('error', ''))}"]
    name = visible(rep["path"].rsplit("/", 1)[-1])
    judged = "passes" if rep["passed"] else "FAILS"
    worst = max((e.get("rel", 0.0) for e in rep["errors"].values()
                 if isinstance(e.get("rel"), (int, float))), default=None)
    said = f" (max relative error {worst:.3g})" if worst is not None else ""
    if rep["exact"]:
        return [f"# tried: ModelOpt quantizes exactly the layers the plan keeps quantized; its "
                f"file ({name}) {judged} the run's criteria{said}"]
    off = []
    if rep["also_unquantized"]:
        off.append(f"also leaves {', '.join(map(visible, rep['also_unquantized']))} un-quantized (it skips "
                   "neighbours of excluded nodes)")
    if rep["also_quantized"]:
        off.append(f"quantizes {', '.join(map(visible, rep['also_quantized']))} besides")
    return [f"# ModelOpt cannot reproduce the plan exactly: it {'; it '.join(off)}; its file "
            f"({name}) {judged} the run's criteria{said}. The plan itself is the "
            ".unquantized.onnx file below"]
