"""A run's files: the plan and its renderings for every tool, written as one generation.

`write_outputs` replaces the previous generation atomically (outdir.py): the mixed model the
run judged is moved into place (never rewritten), and precision.json lands last.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from .. import __version__
from ..backends.ort import emulation_of_mixed
from ..base.files import (
    atomic_write,
    atomic_write_json,
    atomic_write_records,
    atomic_write_text,
    claim,
    move_file,
)
from ..context import Context
from ..diagnosis.diagnose import annotate
from ..graph import Graph, named_as_trtbisect_names
from ..judge import semantics
from ..judge.loadable import InputCheck
from ..judge.mixed import Written, graph_model
from ..judge.precision import FP16
from ..outputs.outdir import OutputDir
from ..outputs.render import RenderContext
from ..result import RunResult
from ..stages.written import write_plan

# verdicts whose plan is written with its renderings
PLAN_VERDICTS = ("fixed", "fp16_ok", "partial", "over_budget", "fragile", "unvalidated")

# report.py's write_report, handed down by the caller (the report sits above the writers)
ReportWriter = Callable[[RunResult, Path], dict[str, str]]


def write_outputs(result: RunResult, ctx: Context, out_dir: Path,
                  report: ReportWriter | None = None) -> RunResult:
    """Every file atomically, as one generation that replaces the last (outdir.py): the plan
    is written last, never beside an earlier run's files. The input model is only read.
    `report`: writes report.html and report.md into the same generation (None: no report).
    Returns the result with what writing records (a new one; the one given is unchanged):
    the files written (`files`), the staged files moved, the mixed model written and the
    renderings' context."""
    with OutputDir(out_dir).generation(keep=ctx.sources) as gen:
        result = _write_files(result, ctx, out_dir, report)
        gen.commit(result.to_json())
    return result


def _write_files(result: RunResult, ctx: Context, out_dir: Path,
                 report: ReportWriter | None = None) -> RunResult:
    stem = ctx.path.stem
    files = dict(result.files)  # the result's files, and each one written here after them
    if result.verdict in PLAN_VERDICTS:
        # the copy the plan was judged on, named, where it differs from the file (graph/repair.py)
        if ctx.graph.inlined or ctx.graph.repairs or not named_as_trtbisect_names(ctx.model):
            path = out_dir / f"{stem}.named.onnx"
            graph_model(ctx.graph).save(path, held=ctx.input_check)
            files["named_model"] = str(path)
        if result.rewritten_model is not None:
            path = out_dir / f"{stem}.rewritten.onnx"
            result.rewritten_model.save(path, held=ctx.input_check)
            files["rewritten_model"] = str(path)
        if _builds_differently(ctx):
            path = out_dir / f"{stem}.autocast_input.onnx"
            graph_model(ctx.judged).save(path, held=ctx.input_check)
            files["autocast_input"] = str(path)
        mixed_path = out_dir / f"{stem}.mixed.onnx"
        mixed = result.mixed_model
        if result.staged:  # the files judged in the run, moved into place
            for f in result.staged:
                claim(out_dir / Path(f).name)  # listed in the generation before it lands
                move_file(f, out_dir / Path(f).name)
        else:
            if mixed is None:
                mixed = write_plan(ctx, result.fp32_nodes)
            mixed.save(mixed_path, held=ctx.input_check)
        files["mixed_model"] = str(mixed_path)
        rc = render_context(result, ctx, out_dir, files)
        result = replace(result, files=dict(files), staged=[], mixed_model=mixed,
                         render_context=rc, emulated_mixed=None)
        r = result.renderings()
        if r["trtexec_layer_precisions"] is not None:
            atomic_write_text(out_dir / "layer_precisions.txt", f"{r['trtexec_layer_precisions']}\n")
            files["layer_precisions"] = str(out_dir / "layer_precisions.txt")
        atomic_write_json(out_dir / "autocast_nodes_to_exclude.json", r["autocast_nodes_to_exclude"])
        files["autocast_nodes_to_exclude"] = str(out_dir / "autocast_nodes_to_exclude.json")
        from ..outputs.render import commands_script
        atomic_write_text(out_dir / "commands.sh", commands_script(result.fp32_nodes, rc))
        files["commands"] = str(out_dir / "commands.sh")
    if result.stats:
        atomic_write_records(out_dir / "layerwise.json",
                             [s.to_json() for s in result.stats.values()])
        files["layerwise"] = str(out_dir / "layerwise.json")
    if result.search is not None:
        files["journal"] = str(out_dir / "journal.jsonl")
        atomic_write_json(out_dir / "trace.json", result.search.to_json())
        files["trace"] = str(out_dir / "trace.json")
    if result.culprit_groups:
        path = out_dir / f"{stem}.annotated.onnx"
        meta = {"trtbisect.verdict": result.verdict, "trtbisect.version": __version__,
                "trtbisect.fp32_nodes": ",".join(result.fp32_nodes)}
        annotated = annotate(ctx.model, result.culprit_groups,
                             {c.node: c.why for c in result.culprits}, meta)
        graph_model(ctx.graph, annotated).save(path, held=ctx.input_check)
        files["annotated_model"] = str(path)
    if report is not None:  # the pages read the files written so far
        files.update(report(replace(result, files=dict(files)), out_dir))
    files["plan"] = str(out_dir / "precision.json")
    return replace(result, files=files)


QUANT_KEYS = ("trtbisect.version", "trtbisect.verdict", "trtbisect.unquantized_layers",
              "trtbisect.fp32_nodes")


def save_quantized(path: Path, model: onnx.ModelProto, declares: dict[str, str],
                   held: InputCheck | None = None) -> None:
    """A file the quantized road writes (its plan's model, or the file ModelOpt wrote that the
    run judged), as the FP16 road writes its own: it declares what it computes in its metadata
    (`declares`: trtbisect.unquantized_layers, trtbisect.fp32_nodes, ...; an earlier run's
    entries replaced, never repeated), lands atomically, and is held to the checker's full
    check and to loading in ONNX Runtime (judge/loadable.py; `held`: the input's record)."""
    from ..base.files import save_model
    from ..judge.loadable import require_written_valid

    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [p for p in out.metadata_props if p.key not in QUANT_KEYS and p.key not in declares]
    del out.metadata_props[:]
    out.metadata_props.extend(kept)
    out.metadata_props.extend(onnx.StringStringEntryProto(key=k, value=v)
                              for k, v in {"trtbisect.version": __version__, **declares}.items())
    save_model(path, out)
    require_written_valid(path, None, held)


def write_quantized(result: Callable[[dict[str, str]], Any], commands_sh: str, out_dir: Path,
                    keep: Sequence[Path], held: InputCheck | None = None,
                    model: tuple[str, str, onnx.ModelProto, dict[str, str]] | None = None,
                    judge: Callable[[Path], None] | None = None, commands: bool = False,
                    report: Callable[[Any, Path], dict[str, str]] | None = None,
                    side: Callable[[Path], dict[str, str]] | None = None) -> Any:
    """The quantized road's files (quant/run.py), as one generation of --out that replaces the
    last (outdir.py), as `write_outputs` writes the FP16 road's: `model` (its key in the
    files, its file name, the model, what it declares) saved by `save_quantized`, then judged
    from the file by `judge` (one judge: what `check` says of it, inside the generation,
    before anything claims it passed); commands.sh (`commands`, or with a model: the
    renderings' `commands_sh`) and what `side` writes beside it; `report`'s pages;
    precision.json last. `result(files)`: the run's result with the files written so far
    (quant/run.py builds it once the file is judged); returns the one precision.json holds."""
    files: dict[str, str] = {}
    with OutputDir(out_dir).generation(keep=keep) as gen:
        if model is not None:
            key, name, proto, declares = model
            save_quantized(out_dir / name, proto, declares, held)
            files[key] = str(out_dir / name)
            if judge is not None:
                judge(out_dir / name)
        if model is not None or commands:
            atomic_write_text(out_dir / "commands.sh", commands_sh)
            files["commands"] = str(out_dir / "commands.sh")
            if side is not None:  # what the commands read, beside them (quant/ptq.py)
                files.update(side(out_dir))
        files["plan"] = str(out_dir / "precision.json")
        if report is not None:
            files.update(report(result(files), out_dir))
        written = result(files)
        gen.commit(written.to_json())
    return written


def _builds_differently(ctx: Context) -> bool:
    """AutoCast must convert the graph the plan was judged on, not the model as given: under
    --semantics trt TensorRT's build folds constant subgraphs and BatchNorms in FP32
    (semantics.prepare: the nodes it `renamed`), which AutoCast would compute in FP16, and it
    clamps a Constant node's out-of-range value as a weight, which AutoCast would cast (to
    inf or 0; an initializer's value AutoCast clamps itself). Otherwise the model as given
    is what it converts: nothing else differs, and no copy of the weights is written."""
    if ctx.search is None or ctx.prepared is None or ctx.prepared.semantics != "trt":
        return False
    if ctx.prepared.renamed:
        return True
    low = ctx.rules.precision
    for node in ctx.model.graph.node:
        t = semantics.constant_tensor(node) if node.op_type == "Constant" else None
        a = numpy_helper.to_array(t) if t is not None else None
        if a is not None and a.dtype.kind == "f" and not np.array_equal(
                semantics.round_weight(a, "clamp", low), semantics.round_weight(a, "inf", low),
                equal_nan=True):
            return True
    return False


def _bytes_writer(data: bytes) -> Callable[[str], object]:
    return lambda tmp: Path(tmp).write_bytes(data)


def render_context(result: RunResult, ctx: Context, out_dir: Path,
                   files: dict[str, str]) -> RenderContext:
    """What every rendering needs to reproduce this run; writes the samples (one .npz each),
    a Polygraphy data loader and the judge's own graph beside the plan, each named in
    `files` (the run's files so far, the mixed model's among them)."""
    from ..base.files import npz_bytes
    from ..data.inputs import declared_shape
    from ..outputs.render import data_loader_script, output_bounds, relative_to, shape_ranges

    work = out_dir.resolve()
    samples = []
    for k, sample in enumerate(ctx.given_sample or ()):  # held-out ones too: the user's data
        path = out_dir / "inputs" / f"sample_{k:03d}.npz"
        atomic_write(path, _bytes_writer(npz_bytes(sample)))
        samples.append(relative_to(path, work))
    for stale in (out_dir / "inputs").glob("sample_*.npz"):  # a previous run's: the folder
        if relative_to(stale, work) not in samples:  # is the samples (AutoCast, check lines)
            stale.unlink()
    atomic_write_text(out_dir / "data_loader.py", data_loader_script(samples))
    files["samples"] = str(out_dir / "inputs")
    files["data_loader"] = str(out_dir / "data_loader.py")
    emulated = out_dir / f"{ctx.path.stem}.mixed.emulated.onnx"
    judged = result.emulated_mixed  # what Polygraphy's check runs: the judge's graph
    if judged is None:  # the plan changed since it was judged (TensorRT)
        fused = ctx.prepared is not None and ctx.prepared.semantics == "trt"
        judged = Written(*emulation_of_mixed(Graph.from_path(files["mixed_model"]), ctx.rules,
                                             fused))
    judged.save(emulated, held=ctx.input_check)
    files["emulated_mixed_model"] = str(emulated)
    g = ctx.judged  # the plan names its nodes
    names: dict[int, str] = {onnx.TensorProto.FLOAT: "fp32", onnx.TensorProto.FLOAT16: "fp16",
             onnx.TensorProto.BFLOAT16: "bf16", onnx.TensorProto.INT32: "int32",
             onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT8: "int8",
             onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.BOOL: "bool"}
    stem = ctx.path.stem
    return RenderContext(
        model=relative_to(files.get("rewritten_model")
                          or files.get("named_model") or ctx.path, work),
        mixed_model=relative_to(files["mixed_model"], work), workdir=str(work),
        emulated_model=relative_to(emulated, work),
        tolerance=result.tolerance, criteria=result.criteria, outputs=tuple(g.output_names()),
        output_bounds=output_bounds(ctx.given_reference, result.tolerance),
        shape_ranges=shape_ranges({v.name: declared_shape(v) for v in g.inputs()},
                                  ctx.given_sample),
        samples=tuple(samples), data_loader="data_loader.py",
        autocast_output=f"{stem}.autocast.onnx", engine_stem=stem, node_names=tuple(g.names),
        true_fp32=not ctx.rules.tf32,
        trt_version=ctx.prepared.trt_version if ctx.prepared else 11,
        judge_args=judge_args(ctx),
        reference_model=relative_to(ctx.path, work) if "rewritten_model" in files else None,
        output_types={n: tuple(names.get(g.types.get(t, 0), "other")
                               for t in g.node(n).output if t) for n in result.fp32_nodes},
        inner_nodes=tuple(n for n in g.candidates() if g.is_inner(n)),
        precision=ctx.rules.precision.name,
        autocast_model=(relative_to(files["autocast_input"], work)
                        if "autocast_input" in files else None),
        fp32_by_schema=tuple(g.fp32_by_schema()))


def judge_args(ctx: Context) -> tuple[str, ...]:
    """The flags that make `trtbisect check` judge as this run did."""
    if ctx.prepared is None:
        return ()
    return ("--semantics", ctx.prepared.semantics, "--trt-version", str(ctx.prepared.trt_version),
            "--tf32" if ctx.rules.tf32 else "--no-tf32",
            *(("--fp16-accumulate",) if ctx.rules.accumulate else ()),
            *(("--precision", ctx.rules.precision.name)
              if ctx.rules.precision.name != FP16.name else ()))
