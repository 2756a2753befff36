"""Every rendering of one precision plan, for the tool a person deploys with.

One plan (the ONNX nodes kept in FP32) and one `RenderContext` (paths, tolerances, shapes,
samples) give: trtexec for TensorRT 10 (weak typing) and 11 (strong typing on the mixed
ONNX), Polygraphy `run` and a Polygraphy check of the mixed model on ONNX Runtime, ModelOpt
AutoCast (CLI and Python), and TensorRT Python snippets (10 weak typing, 11 strong typing).
Both TensorRT versions are always rendered; `RenderContext.trt_version` says which one the plan
targets. A tool that cannot express a node name gets a refusal that says why, never a command
that silently means another plan.

The grammars encoded here, with their sources:
- trtexec (samples/common/sampleOptions.cpp, `splitNameAndValue`, `getLayerPrecisions`;
  https://github.com/NVIDIA/TensorRT/blob/release/10.16/samples/common/sampleOptions.cpp):
  a spec is split on every `,` (no escape exists); each item holding `'` must hold exactly
  two and the name is what they enclose; otherwise the name is everything before the last
  `:`. A name may hold one `*`, a wildcard over layer names (sampleUtils.cpp,
  `matchStringWithOneWildcard`). So `,` and `'` cannot be written, `*` only where it matches
  no other node, `:` and spaces can. `--noTF32` turns TF32 off (on by default); TensorRT 11
  builds strongly typed networks by default and keeps `--stronglyTyped` as a no-op
  (https://github.com/NVIDIA/TensorRT/blob/main/samples/common/sampleOptions.cpp).
- Polygraphy 0.53 (tools/args/util/util.py `parse_arglist_to_tuple_list`): one argv word per
  `name:value`, split at the last `:`, so any name is fine except one starting with `-`,
  which argparse reads as an option. TF32 is off unless `--tf32`. Its `max` check fails an
  output when max|d| > atol AND max|d|/|ref| > rtol (comparator/compare.py `SimpleThreshold`).
  The run's criterion goes per output: trtbisect's default as that max check, Polygraphy's
  statistics as `--check-error-stat`/`--rtol`/`--atol`/`--error-quantile` words, cosine and SNR
  as `--compare cosine_similarity|snr` with their thresholds (judge/). Polygraphy runs every
  comparison function on every output and fails on any failing iteration, so top-K, IoU, a
  `--check` hook, a pass rate below 1, or outputs judged by different kinds of criteria are
  refused in a comment beside the `trtbisect check` line that judges them.
- ModelOpt AutoCast 0.47 (modelopt/onnx/autocast/convert.py `convert_to_mixed_precision`):
  `nodes_to_exclude` are regular expressions; by default it also keeps nodes whose outputs
  exceed `data_max=512` or whose initializers exceed 65504, and turns graph inputs/outputs to
  FP16 unless `--keep_io_types`. It keeps the nodes of If/Loop/Scan subgraphs in FP32 unless
  they read only subgraph initializers (precisionconverter.py
  `_convert_initializers_recursive`: "Control-flow subgraphs ... do not get the
  activation-bracketing casts"), so it cannot run a plan's FP16 subgraph nodes in FP16: its
  rendering says so, and the mixed ONNX is the plan.
- Nodes inside subgraphs carry trtbisect's qualified names (`If_3[then_branch]/Mul_0`) in the
  named model the TensorRT renderings build, and onnx-tensorrt names each layer after its node,
  inside If branches and Loop bodies too (ImporterContext::registerLayer, getNodeName;
  importSubgraph parses a branch with the same parseGraph), so trtexec, Polygraphy and the
  TensorRT Python snippet name them as they name any layer.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..judge.compare import Tolerance
from ..judge.criteria import Criteria
from ..judge.precision import FP16, Precision
from ..judge.precision import precision as low_precision

Shape = tuple[int, ...]
ShapeRange = tuple[Shape, Shape, Shape]  # min, opt, max

TRTEXEC_TYPES = ("fp32", "fp16", "bf16", "int8", "fp8", "int32", "int64", "bool", "uint8", "int4")


class Unrenderable(ValueError):
    """A tool's grammar cannot express a name of the plan."""


class Inexpressible(ValueError):
    """A tool cannot express the run's criterion (a metric or check it lacks)."""


@dataclass(frozen=True)
class RenderContext:
    """What a command needs besides the plan to reproduce the run that found it.

    Paths are written as given: `for_run` makes them relative to `workdir` (the plan's folder,
    where commands.sh `cd`s) when they lie inside it, absolute otherwise.
    """

    model: str = "model.onnx"  # the FP32 ONNX whose node names the plan uses
    mixed_model: str = "model.mixed.onnx"
    # The mixed model with every float16 tensor as explicit Cast(float16)->Cast(float) rounding:
    # ONNX Runtime's CPU provider runs float16 ops in float32 and so hides FP16 overflow.
    emulated_model: str | None = None
    workdir: str | None = None
    tolerance: Tolerance = field(default_factory=Tolerance)
    criteria: Criteria = field(default_factory=Criteria)  # judge/criteria.py; default: max|d|
    outputs: tuple[str, ...] = ()
    output_bounds: Mapping[str, float] = field(default_factory=dict)  # smallest over samples
    shape_ranges: Mapping[str, ShapeRange] = field(default_factory=dict)  # dynamic inputs only
    samples: tuple[str, ...] = ()  # one .npz per sample, keyed by input name
    data_loader: str | None = None  # Polygraphy data-loader script reading `samples`
    reference_outputs: str = "fp32_outputs.json"
    autocast_output: str = "model.autocast.onnx"
    engine_stem: str = "model"
    node_names: tuple[str, ...] = ()  # every node of the model (wildcard collisions)
    output_types: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # trtexec names
    true_fp32: bool = True  # the judge computed FP32 as IEEE FP32: no TF32 in the engine
    judge_args: tuple[str, ...] = ()  # `trtbisect check` flags of the run's judge (--semantics ...)
    # the FP32 truth checks compare with, when `model` is not it (a rewritten model)
    reference_model: str | None = None
    trt_version: int = 11  # the TensorRT the run targeted (--trt-version); both are rendered
    inner_nodes: tuple[str, ...] = ()  # candidates inside If/Loop/Scan subgraphs
    precision: str = "fp16"  # the low precision of the plan (--precision): fp16 | bf16
    # what AutoCast converts, when not `model`: the FP32 model as TensorRT builds it (under
    # --semantics trt: folds in FP32, Constant values as weights; reports/write.py)
    autocast_model: str | None = None
    # nodes no FP16 file holds in float16 (Graph.fp32_by_schema: Range): weak typing may still
    # pick FP16 kernels for them, so TensorRT 10's lines pin them with the plan (`pinned`)
    fp32_by_schema: tuple[str, ...] = ()

    @property
    def low(self) -> Precision:
        """The plan's low precision: its flags and names in every tool."""
        return low_precision(self.precision)


@dataclass(frozen=True)
class Rendering:
    key: str
    title: str
    text: str  # a command, a few commands, or a script; a `#` comment when refused
    refused: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.refused


# ------------------------------------------------------------------------ trtexec grammar

def _split(s: str, sep: str) -> list[str]:
    """trtexec's `splitToStringVec`: like str.split except that "" gives no item."""
    return s.split(sep) if s else []


def parse_trtexec_item(item: str) -> tuple[str, str]:
    """One `name:value` item as trtexec's `splitNameAndValue` reads it."""
    quoted = _split(item, "'")
    if len(quoted) != 1:
        if len(quoted) != 3:
            raise ValueError(f"trtexec: found {len(quoted) - 1} ' in {item!r}, expected 2")
        return quoted[0] + quoted[1], quoted[2][1:]
    parts = _split(item, ":")
    return ":".join(parts[:-1]) if len(parts) > 1 else parts[0], parts[-1]


def parse_trtexec_spec(spec: str) -> list[tuple[str, str]]:
    """A `--layerPrecisions`/`--layerOutputTypes`/`--*Shapes` value as trtexec parses it."""
    return [parse_trtexec_item(item) for item in _split(spec, ",")]


def _wildcard_match(pattern: str, target: str) -> bool:
    if "*" not in pattern:
        return pattern == target
    head, tail = pattern.split("*", 1)
    return (len(target) >= len(head) + len(tail) and target.startswith(head)
            and target.endswith(tail))


def trtexec_name(name: str, others: Sequence[str] = ()) -> str:
    """`name` as written in a trtexec spec, proven by parsing it back; Unrenderable if not."""
    if not name:
        raise Unrenderable("trtexec cannot name a layer with an empty name")
    if "," in name:
        raise Unrenderable(f"trtexec cannot express node {name!r}: it splits every spec on ','")
    if "'" in name:
        raise Unrenderable(f"trtexec cannot express node {name!r}: a ' starts a quoted name")
    if "*" in name:
        clash = [o for o in others if o != name and _wildcard_match(name, o)]
        if clash or not others:
            raise Unrenderable(f"trtexec reads the '*' in node {name!r} as a wildcard"
                               + (f" that also matches {clash[0]!r}" if clash else ""))
    if parse_trtexec_item(f"{name}:fp32") != (name, "fp32"):  # pragma: no cover - guard
        raise Unrenderable(f"trtexec would misread node {name!r}")
    return name


def _dims(shape: Shape, sep: str) -> str:
    return sep.join(str(int(d)) for d in shape)


def trtexec_shapes(shape_ranges: Mapping[str, ShapeRange]) -> list[str]:
    """--minShapes/--optShapes/--maxShapes for the dynamic inputs."""
    if not shape_ranges:
        return []
    names = {k: trtexec_name(k) for k in shape_ranges}
    return [f"--{flag}=" + ",".join(f"{names[k]}:{_dims(r[i], 'x')}"
                                     for k, r in shape_ranges.items())
            for i, flag in enumerate(("minShapes", "optShapes", "maxShapes"))]


def trtexec_argv(onnx_path: str, engine_path: str, *, strongly_typed: bool,
                 fp32_layers: Sequence[str] = (),
                 output_types: Mapping[str, Sequence[str]] | None = None,
                 shape_ranges: Mapping[str, ShapeRange] | None = None,
                 no_tf32: bool = True, known_names: Sequence[str] = (),
                 profiling: bool = False, layer_info_path: str | None = None,
                 low: Precision = FP16) -> list[str]:
    """argv of trtexec building the plan. Weak typing (TensorRT 10): `--fp16` (`--bf16` for
    a BF16 plan) with precision constraints on `fp32_layers`. Strong typing: `onnx_path` is
    the mixed model and carries the precisions. Raises Unrenderable when a name cannot be
    written."""
    argv = ["trtexec", f"--onnx={onnx_path}"]
    if strongly_typed:
        argv.append("--stronglyTyped")
    else:
        argv.append(low.trtexec_flag)
        names = [trtexec_name(n, known_names) for n in fp32_layers]
        if names:
            types = output_types or {}
            argv += ["--precisionConstraints=obey",
                     "--layerPrecisions=" + ",".join(f"{n}:fp32" for n in names),
                     "--layerOutputTypes=" + ",".join(
                         f"{n}:{_output_types(types.get(n))}" for n in names)]
    if no_tf32:
        argv.append("--noTF32")
    argv += trtexec_shapes(shape_ranges or {})
    if profiling:
        argv.append("--profilingVerbosity=detailed")
    argv.append(f"--saveEngine={engine_path}")
    if layer_info_path:
        argv.append(f"--exportLayerInfo={layer_info_path}")
    return argv


def _output_types(types: Sequence[str] | None) -> str:
    """fp32 for float outputs, the output's own type for the others (one type broadcasts)."""
    if not types or all(t in ("fp32", "fp16", "bf16") for t in types):
        return "fp32"
    unknown = [t for t in types if t not in TRTEXEC_TYPES]
    if unknown:
        raise Unrenderable(f"trtexec has no name for output type {unknown[0]!r}")
    return "+".join("fp32" if t in ("fp16", "bf16") else t for t in types)


# ------------------------------------------------------------------------ Polygraphy grammar

def polygraphy_word(name: str, value: str) -> str:
    """One `name:value` argv word; Polygraphy splits at the last ':' so any name but one that
    argparse would take for an option can be written."""
    if name.startswith("-"):
        raise Unrenderable(f"Polygraphy cannot express {name!r}: argparse reads a word "
                           "starting with '-' as an option")
    return f"{name}:{value}"


def _poly_dims(shape: Shape) -> str:
    return "[" + _dims(shape, ",") + "]"


def polygraphy_shapes(shape_ranges: Mapping[str, ShapeRange], *, profile: bool) -> list[str]:
    if not shape_ranges:
        return []
    if not profile:
        return ["--input-shapes", *(polygraphy_word(k, _poly_dims(r[1]))
                                    for k, r in shape_ranges.items())]
    out = []
    for i, flag in enumerate(("--trt-min-shapes", "--trt-opt-shapes", "--trt-max-shapes")):
        out += [flag, *(polygraphy_word(k, _poly_dims(r[i])) for k, r in shape_ranges.items())]
    return out


def polygraphy_tolerances(ctx: RenderContext) -> list[str]:
    """trtbisect's per-output "max|d| <= rtol*max|ref| + atol" as Polygraphy's max check.

    Polygraphy fails an output when max|d| > atol AND max(|d|/|ref|) > rtol. With rtol 0 and
    atol set to trtbisect's bound the second clause holds whenever the first does, so the
    check is exactly trtbisect's for one sample; the bound depends on max|ref|, so with several
    samples the smallest bound is used (stricter than trtbisect on the other samples).
    """
    if not ctx.output_bounds:
        rtol = max([ctx.tolerance.rtol, *(r for r, _ in ctx.tolerance.per_output.values())])
        return ["--check-error-stat", "max", "--rtol", repr(float(rtol)), "--atol",
                repr(float(ctx.tolerance.atol))]
    return ["--check-error-stat", "max", "--rtol", "0", "--atol",
            *(polygraphy_word(k, repr(float(v))) for k, v in ctx.output_bounds.items()),
            "--validate"]


POLYGRAPHY_FUNCS = ("simple", "cosine_similarity", "snr")  # --compare, in Polygraphy's order


def polygraphy_criterion(ctx: RenderContext) -> list[str]:
    """The run's criterion in Polygraphy's words, per output: trtbisect's default as
    `polygraphy_tolerances` writes it, --check-error-stat/--rtol/--atol/--error-quantile for
    Polygraphy's statistics, --compare cosine_similarity/snr with their thresholds for those
    metrics. Raises Inexpressible where Polygraphy has no such judgement (top-K sets, IoU, a
    --check hook, a pass rate below 1) or runs it on outputs this run does not (Polygraphy
    runs every comparison function on every output), and Unrenderable for a name."""
    crit = ctx.criteria
    if crit.default:
        return polygraphy_tolerances(ctx)
    if crit.hooks:
        raise Inexpressible("--check runs Python on each sample; Polygraphy's comparisons "
                            "(and `debug --check`, a command per build) cannot")
    if crit.pass_rate < 1:
        raise Inexpressible(f"--pass-rate {crit.pass_rate:g}: Polygraphy fails the comparison "
                            "when any iteration fails")
    per_output = {name: crit.for_output(name) for name in ctx.outputs}
    kinds = set()
    for name, crits in per_output.items():
        funcs: list[str] = []
        for c in crits:
            if c.entry.polygraphy is None:
                raise Inexpressible(f"--metric {c.spec()}: {c.entry.why_not_polygraphy}")
            funcs.append(c.entry.polygraphy(c.args).get("compare", "simple"))
        if len(set(funcs)) != len(funcs):
            raise Inexpressible(f"output {name!r} has two criteria of one Polygraphy "
                                "comparison function")
        kinds.add(frozenset(funcs or ["simple"]))
    if len(kinds) != 1:
        raise Inexpressible("the outputs are judged by different kinds of criteria, while "
                            "Polygraphy runs each comparison function on every output")
    (kind,) = kinds
    argv = [] if kind == {"simple"} else ["--compare", *[f for f in POLYGRAPHY_FUNCS
                                                           if f in kind]]
    if "simple" in kind:
        stats, rtols, atols, quants = [], [], [], []
        for name, crits in per_output.items():
            rtol, atol = ctx.tolerance.for_output(name)
            stat = next((c for c in crits if c.entry.family == "stat"), None)
            if stat is None:  # trtbisect's default, as its max check (polygraphy_tolerances)
                bound = ctx.output_bounds.get(name, atol)
                stats.append(polygraphy_word(name, "max"))
                rtols.append(polygraphy_word(name, "0"))
                atols.append(polygraphy_word(name, repr(float(bound))))
                continue
            words = stat.entry.polygraphy(stat.args)  # type: ignore[misc]
            stats.append(polygraphy_word(name, words["check_error_stat"]))
            rtols.append(polygraphy_word(name, repr(float(rtol))))
            atols.append(polygraphy_word(name, repr(float(atol))))
            if "error_quantile" in words:
                quants.append(polygraphy_word(name, words["error_quantile"]))
        argv += ["--check-error-stat", *stats, "--rtol", *rtols, "--atol", *atols]
        argv += ["--error-quantile", *quants] if quants else []
    for func, flag in (("cosine_similarity", "--cosine-similarity-threshold"),
                       ("snr", "--snr-threshold")):
        if func in kind:
            argv.append(flag)
            for name, crits in per_output.items():
                (c,) = [c for c in crits if c.entry.polygraphy(c.args).get("compare") == func]  # type: ignore[misc]
                key = flag[2:].replace("-", "_")
                argv.append(polygraphy_word(name, c.entry.polygraphy(c.args)[key]))  # type: ignore[misc]
    return argv


def polygraphy_convert_argv(onnx_path: str, engine_path: str, *, strongly_typed: bool,
                            fp32_layers: Sequence[str] = (),
                            shape_ranges: Mapping[str, ShapeRange] | None = None,
                            low: Precision = FP16) -> list[str]:
    """argv of `polygraphy convert` building the same engine (weak or strong typing; `--fp16`
    or `--bf16`)."""
    argv = ["polygraphy", "convert", onnx_path]
    if strongly_typed:
        argv.append("--strongly-typed")
    else:
        argv.append(low.polygraphy_flag)
        if fp32_layers:
            argv += ["--precision-constraints", "obey", "--layer-precisions",
                     *(polygraphy_word(n, "float32") for n in fp32_layers)]
    argv += polygraphy_shapes(shape_ranges or {}, profile=True)
    return argv + ["-o", engine_path]


# ------------------------------------------------------------------------ renderings

def command_line(argv: Sequence[str]) -> str:
    """One shell command line: every word quoted (a name may hold spaces, quotes, `$(...)`,
    line breaks). A NUL byte is the one thing no shell word and no argv can carry."""
    bad = next((w for w in argv if "\0" in w), None)
    if bad is not None:
        raise Unrenderable(f"a command-line argument cannot hold the NUL byte in {bad!r}")
    return shlex.join(argv)


def autocast_patterns(fp32_nodes: Sequence[str]) -> list[str]:
    """AutoCast `nodes_to_exclude`: anchored, escaped regular expressions (any name works)."""
    return [f"^{re.escape(n)}$" for n in fp32_nodes]


def pinned(plan: Sequence[str], ctx: RenderContext) -> list[str]:
    """The nodes weak typing (TensorRT 10) is told to keep in FP32: the plan's, then those no
    FP16 file holds in float16 (`RenderContext.fp32_by_schema`), which the judge computed in
    FP32 as the mixed model and TensorRT 11 do."""
    kept = set(plan)
    return [*plan, *(n for n in ctx.fp32_by_schema if n not in kept)]


def layer_precisions(fp32_nodes: Sequence[str], ctx: RenderContext | None = None) -> str:
    """trtexec's `--layerPrecisions` value (weak typing: `pinned`). Raises Unrenderable."""
    known = ctx.node_names if ctx else ()
    nodes = pinned(fp32_nodes, ctx) if ctx else fp32_nodes
    return ",".join(f"{trtexec_name(n, known)}:fp32" for n in nodes)


def _refusal(key: str, title: str, why: str, alternative: str) -> Rendering:
    text = f"# {title}: cannot express this plan. {why}. {alternative}"
    return Rendering(key, title, text, (why,))


def _criterion_refusal(key: str, title: str, why: str, instead: str, line: str = "") -> Rendering:
    """A tool that cannot judge by the run's criterion: said in the file, with the
    `trtbisect check` line that does (runnable, when given)."""
    text = f"# {title}: Polygraphy cannot express this run's criterion: {why}. {instead}"
    return Rendering(key, title, text + (f"\n{line}" if line else ""),
                     (f"criterion: {why}",))


def _trtexec10(plan: Sequence[str], ctx: RenderContext) -> Rendering:
    key, title = "trtexec_trt10", "TensorRT 10, trtexec (weak typing)"
    try:
        argv = trtexec_argv(ctx.model, f"{ctx.engine_stem}.{ctx.low.name}.plan",
                            strongly_typed=False, fp32_layers=pinned(plan, ctx),
                            output_types=ctx.output_types, shape_ranges=ctx.shape_ranges,
                            no_tf32=ctx.true_fp32, known_names=ctx.node_names, low=ctx.low)
        text = command_line(argv)
    except Unrenderable as exc:
        return _refusal(key, title, str(exc), "Build the mixed ONNX strongly typed (TensorRT 11 "
                        "recipe) or use the TensorRT Python snippet.")
    return Rendering(key, title, text)


def _trtexec11(plan: Sequence[str], ctx: RenderContext) -> Rendering:
    key, title = ("trtexec_trt11", "TensorRT 11, trtexec (strong typing: the mixed model "
                  "carries the precisions; --stronglyTyped is the default there and needed on 10)")
    try:
        argv = trtexec_argv(ctx.mixed_model, f"{ctx.engine_stem}.mixed.plan", strongly_typed=True,
                            shape_ranges=ctx.shape_ranges, no_tf32=ctx.true_fp32)
        text = command_line(argv)
    except Unrenderable as exc:
        return _refusal(key, title, str(exc), "Use the TensorRT Python API with the mixed ONNX.")
    return Rendering(key, title, text)


def _data_args(ctx: RenderContext) -> list[str]:
    return ["--data-loader-script", ctx.data_loader] if ctx.data_loader else []


def _polygraphy_run(plan: Sequence[str], ctx: RenderContext) -> Rendering:
    key = "polygraphy"
    title = f"Polygraphy: TensorRT 10 {ctx.low.label} with the plan vs ONNX Runtime FP32"
    try:
        argv = ["polygraphy", "run", ctx.model, "--trt", "--onnxrt", ctx.low.polygraphy_flag,
                *([] if ctx.true_fp32 else ["--tf32"])]
        kept = pinned(plan, ctx)
        if kept:
            argv += ["--precision-constraints", "obey", "--layer-precisions",
                     *(polygraphy_word(n, "float32") for n in kept)]
        argv += polygraphy_shapes(ctx.shape_ranges, profile=True)
        argv += _data_args(ctx) + polygraphy_criterion(ctx)
        text = command_line(argv)
    except Inexpressible as exc:
        return _criterion_refusal(key, title, str(exc), "The `trtbisect check` line under "
                                  "the Polygraphy check below judges the mixed ONNX by it")
    except Unrenderable as exc:
        return _refusal(key, title, str(exc), "Use the Polygraphy check of the mixed ONNX.")
    return Rendering(key, title, text)


def _polygraphy_check(plan: Sequence[str], ctx: RenderContext) -> Rendering:
    key, title = ("polygraphy_check", "Polygraphy: the mixed ONNX on ONNX Runtime vs the FP32 "
                  "model's outputs (no GPU needed; the emulated form rounds every FP16 tensor, "
                  "which ONNX Runtime's CPU float16 kernels would not)")
    try:
        data = _data_args(ctx)
        save = ["polygraphy", "run", ctx.reference_model or ctx.model, "--onnxrt", *data,
                "--save-outputs", ctx.reference_outputs]
        check = ["polygraphy", "run", ctx.emulated_model or ctx.mixed_model, "--onnxrt", *data,
                 "--load-outputs", ctx.reference_outputs, *polygraphy_criterion(ctx)]
        text = command_line(save) + "\n" + command_line(check)
    except Inexpressible as exc:
        return _criterion_refusal(key, title, str(exc), "`trtbisect check` judges the mixed "
                                  "ONNX by it:", _check_line(ctx.mixed_model, ctx))
    except Unrenderable as exc:
        return _refusal(key, title, str(exc), "Use `trtbisect check` on the mixed ONNX.")
    return Rendering(key, title, text)


def _calibration(ctx: RenderContext) -> str | None:
    """AutoCast reads one .npz, or a folder of them for several samples."""
    if not ctx.samples:
        return None
    if len(ctx.samples) == 1:
        return ctx.samples[0]
    return str(Path(ctx.samples[0]).parent)


def _check_line(path: str, ctx: RenderContext) -> str:
    """`trtbisect check` of a converted model with the tolerance the plan was found under."""
    from ..judge.flags import criteria_flags
    tol = ctx.tolerance
    argv = ["trtbisect", "check", path, "--reference", ctx.reference_model or ctx.model,
            "--rtol", repr(tol.rtol),
            "--atol", repr(tol.atol), *ctx.judge_args]
    for name, (r, a) in tol.per_output.items():
        argv += ["--output-tol", f"{name}:{r!r}:{a!r}"]
    argv += criteria_flags(ctx.criteria)
    if len(ctx.samples) > CHECK_LINE_SAMPLES:  # the folder holds exactly the samples
        argv += ["--inputs", _calibration(ctx) or "."]
    else:
        for s in ctx.samples:
            argv += ["--inputs", s]
    return command_line(argv)


CHECK_LINE_SAMPLES = 16  # more samples: the check line names their folder


def _autocast_subgraphs(plan: Sequence[str], ctx: RenderContext) -> list[str]:
    """Comment lines for a plan that runs subgraph nodes in FP16 (AutoCast cannot)."""
    half = [n for n in ctx.inner_nodes if n not in set(plan)]
    if not half:
        return []
    return [f"# AutoCast 0.47 keeps If/Loop/Scan subgraph nodes in FP32: it cannot run the "
            f"plan's {len(half)} FP16",
            "# subgraph node(s) in FP16 (e.g. " + ", ".join(half[:3]) + "), so its output "
            "is a more-FP32 plan than this one,",
            "# judged by the check line below. The plan itself is the mixed ONNX; judge it "
            "with:",
            "#   " + _check_line(ctx.mixed_model, ctx)]


def _autocast_input(ctx: RenderContext) -> list[str]:
    """Comment lines for an AutoCast input that is not the model itself."""
    if not ctx.autocast_model:
        return []
    return ["# AutoCast converts the FP32 model as TensorRT builds it (--onnx_path: constant "
            "subgraphs and BatchNorms",
            "# folded in FP32, Constant values as weights; docs/semantics.md), the graph the plan "
            "was judged on. Given the model",
            "# itself, it would compute those in FP16 (a -3.4e38 mask fill becomes -inf) where "
            "TensorRT clamps or folds them."]


def _autocast(plan: Sequence[str], ctx: RenderContext) -> Rendering:
    argv = ["python", "-m", "modelopt.onnx.autocast",
            f"--onnx_path={ctx.autocast_model or ctx.model}",
            f"--output_path={ctx.autocast_output}",
            f"--low_precision_type={ctx.low.autocast_type}",
            "--keep_io_types", "--data_max=inf", "--init_max=inf"]
    calib = _calibration(ctx)
    if calib:
        argv.append(f"--calibration_data={calib}")
    if plan:
        argv += ["--nodes_to_exclude", *autocast_patterns(plan)]
    key, title = "autocast", "ModelOpt AutoCast (CLI), then trtbisect's judgement of its output"
    try:
        text = "\n".join([*_autocast_input(ctx), *_autocast_subgraphs(plan, ctx),
                          command_line(argv),
                          _check_line(ctx.autocast_output, ctx)])
    except Unrenderable as exc:
        return _refusal(key, title, str(exc), "Use AutoCast's Python API (below).")
    return Rendering(key, title, text)


def _autocast_python(plan: Sequence[str], ctx: RenderContext) -> Rendering:
    calib = _calibration(ctx)
    text = "\n".join([
        *_autocast_input(ctx),
        *_autocast_subgraphs(plan, ctx),
        "import onnx",
        "from modelopt.onnx.autocast import convert_to_mixed_precision",
        "",
        "model = convert_to_mixed_precision(",
        f"    onnx_path={(ctx.autocast_model or ctx.model)!r},",
        f'    low_precision_type="{ctx.low.autocast_type}",',
        f"    nodes_to_exclude={json.dumps(autocast_patterns(plan), ensure_ascii=False)},",
        '    data_max=float("inf"),  # keep only the plan\'s nodes, not every output above 512',
        '    init_max=float("inf"),',
        "    keep_io_types=True,",
        f"    calibration_data={calib!r},",
        ")",
        f"onnx.save(model, {ctx.autocast_output!r})",
    ])
    return Rendering("autocast_python", "ModelOpt AutoCast (Python API)", text)


# The TensorRT Python snippets below use only names the bindings of their target release define
# (trtbisect/backends/trt_surface/*.json, from NVIDIA's wheels): tests/backends/test_trt_surface.py runs
# each on the fake TensorRT of that release, which raises AttributeError for any other name.

def _tensorrt_python(plan: Sequence[str], ctx: RenderContext) -> Rendering:
    """TensorRT 10 weak typing through the Python API (removed in TensorRT 11)."""
    low = ctx.low
    text = "\n".join([
        "# TensorRT 10 only: TensorRT 11 removed weak typing (no BuilderFlag.FP16, no",
        "# layer.precision); there, build the mixed ONNX (the TensorRT 11 Python snippet).",
        "import tensorrt as trt",
        "",
        f"FP32_NODES = {json.dumps(pinned(plan, ctx), ensure_ascii=False)}",
        "",
        "def onnx_nodes(layer):",
        '    """ONNX nodes a layer came from: its name, and the parser\'s metadata entries."""',
        "    names = {layer.name}",
        '    for entry in (getattr(layer, "metadata", "") or "").split("\\x1f"):',
        '        if entry.startswith("[ONNX Layer: "):',
        '            names.add(entry[len("[ONNX Layer: "):].split(" | ")[0].rstrip("]"))',
        "    return names",
        "",
        "logger = trt.Logger(trt.Logger.WARNING)",
        "builder = trt.Builder(logger)",
        "network = builder.create_network(0)",
        "parser = trt.OnnxParser(network, logger)",
        f"if not parser.parse_from_file({ctx.model!r}):",
        '    raise SystemExit("\\n".join(str(parser.get_error(i)) for i in range(parser.num_errors)))',
        "config = builder.create_builder_config()",
        f"config.set_flag(trt.BuilderFlag.{low.builder_flag})",
        "config.set_flag(trt.BuilderFlag.OBEY_PRECISION_CONSTRAINTS)",
        *(["config.clear_flag(trt.BuilderFlag.TF32)  # the plan was judged in true FP32"]
          if ctx.true_fp32 else []),
        *_profile_lines(ctx),
        "wanted = set(FP32_NODES)",
        "for i in range(network.num_layers):",
        "    layer = network.get_layer(i)",
        "    if onnx_nodes(layer) & wanted:",
        "        layer.precision = trt.float32",
        "        for j in range(layer.num_outputs):",
        f"            if layer.get_output(j).dtype in (trt.float32, trt.{low.trt_type}):",
        "                layer.set_output_type(j, trt.float32)",
        "engine = builder.build_serialized_network(network, config)",
        f"with open({ctx.engine_stem + '.' + low.name + '.plan'!r}, 'wb') as f:",
        "    f.write(engine)",
    ])
    return Rendering("tensorrt_python", "TensorRT 10 Python API (weak typing)", text)


def _tensorrt_python11(plan: Sequence[str], ctx: RenderContext) -> Rendering:
    """Strong typing through the Python API: the mixed ONNX carries every precision."""
    text = "\n".join([
        f"# TensorRT 11 (and 10): the mixed ONNX carries the plan as {ctx.low.trt_type} and "
        "float32 types;",
        "# nothing is set per layer. STRONGLY_TYPED is how TensorRT 11 always builds and what",
        "# TensorRT 10 needs to respect the types.",
        "import tensorrt as trt",
        "",
        "logger = trt.Logger(trt.Logger.WARNING)",
        "builder = trt.Builder(logger)",
        "network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))",
        "parser = trt.OnnxParser(network, logger)",
        f"if not parser.parse_from_file({ctx.mixed_model!r}):",
        '    raise SystemExit("\\n".join(str(parser.get_error(i)) for i in range(parser.num_errors)))',
        "config = builder.create_builder_config()",
        *(["config.clear_flag(trt.BuilderFlag.TF32)  # the plan was judged in true FP32"]
          if ctx.true_fp32 else []),
        *_profile_lines(ctx),
        "engine = builder.build_serialized_network(network, config)",
        f"with open({ctx.engine_stem + '.mixed.plan'!r}, 'wb') as f:",
        "    f.write(engine)",
    ])
    return Rendering("tensorrt_python_trt11",
                     "TensorRT 11 Python API (strong typing: the mixed model carries the "
                     "precisions; also TensorRT 10)", text)


def _profile_lines(ctx: RenderContext) -> list[str]:
    if not ctx.shape_ranges:
        return []
    lines = ["profile = builder.create_optimization_profile()"]
    for name, (lo, opt, hi) in ctx.shape_ranges.items():
        lines.append(f"profile.set_shape({name!r}, {list(lo)}, {list(opt)}, {list(hi)})")
    return lines + ["config.add_optimization_profile(profile)"]


RENDERERS = (_trtexec10, _trtexec11, _polygraphy_run, _polygraphy_check, _autocast,
             _autocast_python, _tensorrt_python, _tensorrt_python11)
PYTHON_RENDERINGS = ("autocast_python", "tensorrt_python", "tensorrt_python_trt11")


def render_all(fp32_nodes: Sequence[str], ctx: RenderContext) -> dict[str, Rendering]:
    """Every rendering of the plan, keyed by tool."""
    plan = list(fp32_nodes)
    return {r.key: r for r in (render(plan, ctx) for render in RENDERERS)}


def renderings_json(fp32_nodes: Sequence[str], ctx: RenderContext) -> dict[str, object]:
    """The `renderings` block of precision.json: texts, raw values and refusals."""
    rs = render_all(fp32_nodes, ctx)
    out: dict[str, object] = {k: r.text for k, r in rs.items()}
    try:
        out["trtexec_layer_precisions"] = layer_precisions(fp32_nodes, ctx)
    except Unrenderable:
        out["trtexec_layer_precisions"] = None  # the reason is under "refused"
    out["autocast_nodes_to_exclude"] = autocast_patterns(fp32_nodes)
    out["refused"] = {k: list(r.refused) for k, r in rs.items() if r.refused}
    out["workdir"] = ctx.workdir
    out["trt_version"] = ctx.trt_version  # the target; the other version's renderings are kept
    return out


def commands_script(fp32_nodes: Sequence[str], ctx: RenderContext) -> str:
    """commands.sh: every rendering, run from the plan's folder wherever it is called from."""
    lines = ["#!/bin/sh",
             "# Apply the trtbisect plan with the tool you deploy with. Paths are relative to",
             "# this folder or absolute; the script runs from here wherever it is called from.",
             'cd "$(dirname "$0")" || exit 1',
             f"# The plan targets TensorRT {ctx.trt_version} (--trt-version); the TensorRT "
             f"{10 if ctx.trt_version == 11 else 11} renderings are kept, labelled.", ""]
    for r in render_all(fp32_nodes, ctx).values():
        lines.append(f"# {r.title}:")
        # split on "\n" alone, the shell's only line end: str.splitlines() also splits on
        # \r, \x1c-\x1e, \x85, \u2028, \u2029, which a quoted name may hold (the lines are
        # joined with "\n" again: another plan's names in the script)
        if r.key in PYTHON_RENDERINGS:
            lines += ["# (Python; saved for reference, not run by this script)",
                      *(f"#   {ln}" if ln else "#" for ln in r.text.split("\n"))]
        else:
            lines += r.text.split("\n")
        lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------ context and files

def shape_ranges(declared: Mapping[str, Sequence[int | str | None]],
                 samples: Sequence[Mapping[str, np.ndarray]]) -> dict[str, ShapeRange]:
    """min/opt/max per input with a dynamic dimension, from the shapes the samples had."""
    out: dict[str, ShapeRange] = {}
    for name, dims in declared.items():
        if all(isinstance(d, int) and d > 0 for d in dims):
            continue
        shapes = [tuple(int(d) for d in s[name].shape) for s in samples if name in s]
        if not shapes:
            continue
        lo = tuple(min(d) for d in zip(*shapes))
        hi = tuple(max(d) for d in zip(*shapes))
        out[name] = (lo, shapes[0], hi)
    return out


def output_bounds(references: Sequence[Mapping[str, np.ndarray]],
                  tolerance: Tolerance) -> dict[str, float]:
    """Per output, the smallest rtol*max|ref| + atol over samples (compare.py's bound)."""
    out: dict[str, float] = {}
    for ref in references:
        for name, value in ref.items():
            if not np.issubdtype(np.asarray(value).dtype, np.floating):
                continue
            a = np.asarray(value, dtype=np.float64)
            finite = a[np.isfinite(a)]
            rtol, atol = tolerance.for_output(name)
            bound = rtol * float(np.max(np.abs(finite), initial=0.0)) + atol
            out[name] = min(out.get(name, bound), bound)
    return out


def relative_to(path: str | Path, workdir: Path) -> str:
    """`path` relative to `workdir` when inside it, else absolute."""
    p = Path(path).resolve()
    try:
        return str(p.relative_to(workdir.resolve()))
    except ValueError:
        return str(p)


DATA_LOADER = '''"""Polygraphy data loader: feeds the samples trtbisect judged the plan on.

Written by trtbisect. Use: polygraphy run ... --data-loader-script {name}
"""
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SAMPLES = {samples}


def load_data():
    for name in SAMPLES:
        with np.load(HERE / name) as z:
            yield {{k: z[k] for k in z.files}}
'''


def data_loader_script(samples: Sequence[str], name: str = "data_loader.py") -> str:
    """The script's text; `samples` are paths relative to the script's folder."""
    return DATA_LOADER.format(name=name, samples=json.dumps(list(samples), ensure_ascii=False))
