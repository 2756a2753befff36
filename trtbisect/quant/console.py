"""What `trtbisect run` prints for a quantized model (the CLI calls `emit`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from .report import rounding_words as _rounding
from .report import verdict_line

if TYPE_CHECKING:
    from ..context import Options
    from .cost import QuantCost


def emit(result, as_json: bool) -> None:
    from ..console import out, shown

    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    out.print(f"verdict: {verdict_line(result)}")
    for p in result.reference_problems:
        out.print(f"  {shown(p)}")
    if result.plan:
        _emit_layers(result)
    if result.fp32_nodes:
        _emit_fp32_nodes(result)
    if result.before is not None:
        _emit_outputs(result)
    c = result.cost
    if c is not None and result.verdict != "reference_invalid":
        _emit_cost(result, c)
    _emit_findings(result)
    _emit_files(result)


def _emit_layers(result) -> None:
    """The quantized layers of the plan, why each, and the fixes judged for them."""
    from rich.table import Table

    from ..console import out, shown

    t = Table(title="Layers to run un-quantized", title_justify="left")
    for col in ("layer", "op", "quantized inputs", "why"):
        t.add_column(col, overflow="fold")
    for name in result.plan:
        layer = result.layer(name)
        edges = ", ".join(f"{e.source} ({e.format}{', weight' if e.weight else ''}"
                          f"{', per-channel' if e.per_channel else ''})" for e in layer.edges)
        why = ("; ".join(f.text for f in result.findings.get(name, []))
               if result.needed.get(name, True) else _faster(result, name))
        t.add_row(shown(name), shown(layer.op), shown(edges), shown(why))
    out.print(t)
    k = 0
    for name in result.plan:
        for f in result.findings.get(name, []):
            k += 1
            out.print(f"{k}. {shown(f.kind)}: {shown(name)}: fix: {shown(f.fix)}")
        for fx in result.fixes.get(name, []):
            rel = fx.max_rel
            said = f" (max relative error {rel:.3g})" if rel is not None else ""
            out.print(f"   {'[green]verified[/]' if fx.passed else '[yellow]tried[/]'}: "
                      f"{shown(fx.fix)} {'lets' if fx.passed else 'does not let'} "
                      f"{shown(name)} stay quantized{said}")


def _emit_fp32_nodes(result) -> None:
    """The file's FP16 nodes the plan keeps in FP32, and why."""
    from rich.table import Table

    from ..console import out, shown

    ops = result.fp32_ops
    t = Table(title="FP16 nodes to keep in FP32 (the file's float side)", title_justify="left")
    for col in ("node", "op", "why"):
        t.add_column(col, overflow="fold")
    units = {n: u for u, n, _ in result._culprits()}
    for name in result.fp32_nodes:
        u = units.get(name, name)
        t.add_row(shown(name), shown(ops.get(name, "")),
                  shown(result.fp32_reasons.get(name, "") if result.needed.get(u, True)
                        else _faster(result, u)))
    out.print(t)


def _emit_outputs(result) -> None:
    """Each output's error, as given and with the plan."""
    from rich.table import Table

    from ..console import error_cell, out, shown

    t = Table(title="Outputs", title_justify="left")
    t.add_column("output", overflow="fold")
    t.add_column("quantized as given")
    t.add_column("with the plan")
    for name, before in result.before.errors.items():
        after = result.after.errors.get(name) if result.after is not None else None
        t.add_row(shown(name), error_cell(before), error_cell(after))
    out.print(t)


def _emit_cost(result, c: QuantCost) -> None:
    """The estimated engine times (quant/cost.py), what the file keeps in FP32 said first."""
    from ..console import out

    def us(x: float) -> str:
        return f"{x * 1e6:.4g} us"
    vs = c.plan_vs_all_quantized
    if c.file_fp32_nodes:
        out.print(f"the file keeps {c.file_fp32_nodes} float nodes in FP32 outside its "
                  "quantized layers (its quantizer left them so): priced as FP32 in the "
                  "file's figures below" + _float_words(c, us))
    out.print(f"estimated engine time on {c.title}: all FP16 {us(c.all_fp16_s)}, "
              f"all quantized ({c.format.upper()}) {us(c.all_quantized_s)}, the plan "
              f"{us(c.plan_s)}" + (f" ({100 * vs:+.1f}% against all quantized)"
                                       if vs is not None and result.units else "")
              + _boundary_words(c))


def _emit_findings(result) -> None:
    """Why even all-float fails, the margins, the validation, the judge and the search."""
    from ..console import out, shown
    from ..judge.validation import line as validation_line
    from ..stages.spread import certificate_lines

    for line in result.reasons:
        out.print(f"  why: {shown(line)}")
    for line in certificate_lines(result.certified):
        out.print(f"  {shown(line)}")
    told = validation_line(result.validation)
    if told:
        out.print(f"  {shown(told)}")
    out.print(f"reference: {shown(result.reference)}; judged by "
              f"{shown(result.criteria.describe())} on ONNX Runtime CPU (Q/DQ run as written"
              + (f"; FP16 stores emulated, {_rounding(result)})" if result.emulated else ")"))
    if result.evaluations:
        out.print(f"{result.evaluations} evaluations, {result.minimality}, "
                  f"{result.seconds:.1f}s")


def _emit_files(result) -> None:
    """What the run wrote, and what ModelOpt made of the rendered exclusions."""
    from ..console import out, shown

    if not result.files:
        return
    if "mixed_qdq_model" in result.files:
        out.print(f"the plan's Q/DQ ONNX (TensorRT 10 and 11): "
                  f"{shown(result.files['mixed_qdq_model'])}")
    if "commands" in result.files:
        out.print(f"commands (ModelOpt nodes_to_exclude, trtexec, Polygraphy): "
                  f"{shown(result.files['commands'])}")
    rep = result.reproduction
    if rep is not None and rep.ran:
        where = shown(result.files.get("modelopt_model"))
        out.print(f"ModelOpt given these exclusions ({where}): "
                  + ("the plan's quantized layers exactly" if rep.exact else
                     "not the plan exactly (also un-quantized: "
                     f"{shown(', '.join(rep.also_unquantized) or 'none')}; also "
                     f"quantized: {shown(', '.join(rep.also_quantized) or 'none')})")
                  + f", {'passes' if rep.passed else 'fails'} the criteria")
    if "report_html" in result.files:
        out.print(f"report: {shown(result.files['report_html'])}")
    out.print(f"plan: {shown(result.files.get('plan'))}")


def _faster(result, unit: str) -> str:
    """A unit the plan keeps for estimated engine time, not accuracy (quant/run.py `_honest`):
    it passes quantized too."""
    x = result.faster.get(unit)
    return ("not needed for accuracy: faster un-quantized"
            + (f" (est. -{100 * x:.1f}%)" if x is not None else ""))


def _float_words(c: QuantCost, us) -> str:
    """In a file FP32 outside its quantized layers, what all-quantized would cost with FP16
    there (quant/cost.py `float_side`)."""
    x = c.float_side.all_quantized_fp16_elsewhere_s
    return ("" if x is None else f"; with FP16 there (ModelOpt's high_precision_dtype='fp16') "
            f"all quantized would take {us(x)}")


def _boundary_words(c: QuantCost) -> str:
    """The plan's Q/DQ reformat kernels (quant/cost.py `Boundary`), as the cost line ends."""
    b = c.qdq_plan
    return f"; Q/DQ reformats {b.kernels} kernel(s), {b.s * 1e6:.4g} us"


def run_and_emit(model: str, opts: Options, out_dir, reference: str | None, backend: str,
                 as_json: bool, calibration: tuple[str, ...] = ()) -> int:
    """`trtbisect run` for a quantized model (or --precision int8|fp8): run, print, and
    return the exit code."""
    import tempfile
    from pathlib import Path

    from ..console import Progress, quiet_level, terminate_as_interrupt
    from ..errors import TrtBisectError
    from ..outputs.outdir import OutputDir
    from .run import is_quantized_file, run

    if opts.judge.precision in ("bf16", "both"):
        raise TrtBisectError(f"--precision {opts.judge.precision}: {model} is quantized (Q/DQ); "
                             "its "
                             "float side computes in the type the file gives it: drop "
                             "--precision (docs/quantization.md)")
    # the flags this road cannot honour were refused already (roads.py, cli.refuse_flags)
    if backend == "trt":
        raise TrtBisectError("--backend trt builds FP16 engines; a quantized model's plan is "
                             "judged on ONNX Runtime CPU: build the written "
                             "<model>.unquantized.onnx with trtexec --stronglyTyped")
    report = None
    if opts.output.report:  # before a long search, not after it
        from functools import partial

        from ..reports.report import require_matplotlib
        from .pages import write_report
        require_matplotlib()
        report = partial(write_report, rtol=opts.judge.tolerance.rtol,
                         default=opts.judge.criteria.default)
    if opts.judge.precision in ("int8", "fp8"):
        from ..search.cost import quantized_peak
        quantized_peak(opts.search.gpu, opts.judge.precision)  # fp8 on an A100: one-line refusal
    out_dir = Path(out_dir)
    click.get_current_context().meta["resume_hint"] = (
        f"run the same command again to resume from {out_dir / 'journal.jsonl'} "
        "(--no-resume starts afresh)")
    with terminate_as_interrupt(), OutputDir(out_dir).locked(), \
            Progress(quiet_level()) as progress, tempfile.TemporaryDirectory(
                prefix="trtbisect-ptq-") as scratch:
        owned = not is_quantized_file(model)
        if owned:  # --precision int8|fp8 on a float model: ModelOpt's file is trtbisect's
            from .ptq import quantize_samples
            reference, model = model, str(quantize_samples(
                model, opts.sample, opts.judge.precision, Path(scratch), progress.stage,
                calibration))
        result = run(model, opts, out_dir, reference, progress.trial, progress.stage,
                     report, owned)
    emit(result, as_json)
    return result.exit_code


def check_and_emit(mixed: str, reference: str, opts: Options, as_json: bool) -> int:
    """`trtbisect check` of a quantized (Q/DQ) file: pass or fail, per output; exit 0 or 4."""
    from ..console import error_cell, out, shown
    from ..errors import EXIT_NO_PLAN, EXIT_OK
    from .run import check_file

    v = check_file(mixed, reference, opts)
    if as_json:
        click.echo(json.dumps({"passed": v.passed, "mode": "quantized",
                               "errors": {k: e.to_json() for k, e in v.errors.items()},
                               "judged": v.to_json()}, indent=2))
    else:
        out.print(f"{'[green]pass[/]' if v.passed else '[red]fail[/]'}: {shown(mixed)} "
                  f"(quantized, {len(v.samples)} sample(s))", soft_wrap=True)
        for name, e in v.errors.items():
            out.print(f"  {shown(name)}: {error_cell(e)}", soft_wrap=True)
    return EXIT_OK if v.passed else EXIT_NO_PLAN
