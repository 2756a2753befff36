"""`trtbisect export` and `trtbisect torch`: the PyTorch commands (cli.Group registers them).

Thin, like cli.py: parse, call torch/export.py / torch/driver.py, format. torch is imported only
when one of these commands runs, so `trtbisect --help` works without it.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table

from .base.flags import apply_flags
from .console import (
    USAGE,
    Progress,
    error_cell,
    exit_codes,
    finish,
    fmt,
    log,
    out,
    quiet_level,
    rel_cell,
    shown,
    verbosity_options,
)
from .judge.compare import Tolerance
from .judge.flags import criteria_options, pop_criteria

INPUT_HELP = ("Input of forward, in argument order: NAME:DIMS[:DTYPE], e.g. x:1x3x224x224 or "
              "ids:1x128:int64 (seeded random data). Default: the factory's example inputs.")


def torch_input_options(f):
    opts = [
        click.argument("factory", metavar="FILE.py:FACTORY"),
        click.option("--input", "input_specs", multiple=True, metavar="NAME:DIMS[:DTYPE]",
                     help=INPUT_HELP),
        click.option("--seed", default=0, show_default=True, help="Seed for random inputs."),
        click.option("--samples", default=1, show_default=True,
                     help="Random samples to check on (with --input)."),
    ]
    return apply_flags(f, opts)


def _default_out(factory: str) -> Path:
    return Path("runs") / Path(factory.rpartition(":")[0]).stem


EXPORT_EXIT_CODES = exit_codes((0, "exported, and ONNX Runtime agrees with PyTorch in FP32"),
                               (USAGE[0], "usage error, or the export failed or disagrees"))
TORCH_EXIT_CODES = exit_codes(
    (0, "reduced precision already passes, a plan was found, or --no-search"), USAGE,
    (3, "the FP32 forward is already non-finite"), (4, "no set of modules meets the tolerance"))


@click.command("export", epilog=EXPORT_EXIT_CODES)
@torch_input_options
@verbosity_options
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="ONNX file to write; the inputs go beside it as <stem>_inputs.npz. "
                   "Default: runs/<file stem>/<file stem>.onnx.")
@click.option("--exporter", type=click.Choice(["torchscript", "dynamo"]), default="torchscript",
              show_default=True,
              help="torchscript (dynamo=False) names nodes by module scope: /blocks/blocks.3/ln2/Pow. "
                   "dynamo records the module path in node metadata instead.")
@click.option("--opset", type=int, default=17, show_default=True,
              help="ONNX opset. Below 17 LayerNorm is decomposed (an FP16 overflow site); "
                   "the dynamo exporter writes 18 or newer.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def export_cmd(factory: str, input_specs: tuple[str, ...], seed: int, samples: int,
               output: str | None, exporter: str, opset: int, as_json: bool) -> None:
    """Export a PyTorch model to ONNX, check it against PyTorch, save its inputs.

    Imports FILE.py, calls FACTORY() for an nn.Module (or an (nn.Module, example_inputs)
    pair), exports it, runs the ONNX model on ONNX Runtime and PyTorch in FP32 on the same
    inputs, and reports the largest difference. The inputs are saved as an .npz that
    `trtbisect run --inputs` reads. Exits 2 when the ONNX model disagrees with PyTorch.

    \b
    Example:
      trtbisect export model.py:build --input x:1x3x224x224 -o model.onnx
      trtbisect run model.onnx --inputs model_inputs.npz
    """
    from .errors import TrtBisectError
    from .torch.export import ExportOptions, export, export_failure, import_torch

    import_torch()
    path = Path(output) if output else _default_out(factory) / f"{_default_out(factory).name}.onnx"
    result = export(factory, input_specs, path, ExportOptions(exporter, opset, seed, samples))
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        mark = "[green]ok[/]" if result.passed else "[red]FAIL[/]"
        out.print(f"exported {result.onnx_path} ({result.exporter}, opset {result.opset}, IR "
                  f"{result.ir_version}, {result.nodes} nodes, {result.scoped_nodes} named by module)")
        out.print(f"inputs: {result.inputs_path} ({', '.join(result.input_names)})")
        out.print(f"max |ONNX Runtime - PyTorch| in FP32: {fmt(result.max_abs_err)} "
                  f"(relative {fmt(result.max_rel_err)}) {mark}")
        for w in result.warnings:
            out.print(f"[yellow]warning:[/] {w}", highlight=False)
    if not result.passed:
        raise TrtBisectError(export_failure(result))


@click.command("torch", epilog=TORCH_EXIT_CODES)
@torch_input_options
@verbosity_options
@click.option("--mode", type=click.Choice(["autocast", "half"]), default="autocast",
              show_default=True,
              help="autocast: torch.autocast (AMP). half: model.half(), the way TensorRT FP16 "
                   "stores everything.")
@click.option("--precision", "--dtype", "dtype", type=click.Choice(["fp16", "bf16"]),
              default="fp16", show_default=True,
              help="Reduced precision type (--dtype: its earlier name, still accepted).")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto",
              show_default=True, help="auto: cuda when torch sees a GPU, else cpu.")
@click.option("--kernels", type=click.Choice(["auto", "emulated", "native"]), default="auto",
              show_default=True,
              help="auto: native on CUDA; emulated on CPU (FP32 math, every op's result stored in "
                   "the reduced dtype), since CPU half kernels do not behave like GPU ones.")
@click.option("--rtol", default=Tolerance.rtol, show_default=True,
              help="Relative tolerance: max|reduced-fp32| <= rtol*max|fp32| + atol.")
@click.option("--atol", default=Tolerance.atol, show_default=True, help="Absolute tolerance.")
@criteria_options
@click.option("--max-evals", "max_evaluations", type=int, default=None,
              help="Stop the search after this many evaluations (the plan is then not certified).")
@click.option("--no-search", is_flag=True, help="Only the layer-wise comparison.")
@click.option("--top", default=10, show_default=True, help="Layer-wise rows to show.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Folder for torch_plan.json, fp32_plan.py and torch_layerwise.json. "
                   "Default: runs/<file stem>.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def torch_cmd(factory: str, input_specs: tuple[str, ...], seed: int, samples: int, mode: str,
              dtype: str, device: str, kernels: str, rtol: float, atol: float,
              max_evaluations: int | None, no_search: bool, top: int, out_dir: str | None,
              as_json: bool, **criteria) -> None:
    """Find the submodules a PyTorch model must run in FP32 under autocast or half.

    Runs the model in FP32 and in reduced precision, compares every submodule's output through
    forward hooks (first module to overflow or turn inf/NaN), then searches for a 1-minimal set
    of submodules to keep in FP32 and verifies it. Writes torch_plan.json (fp32_modules as
    named_modules() names them) and fp32_plan.py, a helper to paste that applies the plan.

    \b
    Examples:
      trtbisect torch model.py:build --input x:1x3x224x224 --mode half
      trtbisect torch model.py:build --mode autocast --dtype bf16 --device cuda --out runs/amp
    """
    from .torch.export import import_torch, load_torch_model

    import_torch()
    from .torch.driver import diagnose
    from .torch.precision import pick_precision
    from .torch.result import TorchOptions

    precision = pick_precision(mode, dtype, device, kernels)
    tm = load_torch_model(factory, input_specs, seed, samples)
    opts = TorchOptions(precision, Tolerance(rtol, atol), max_evaluations, not no_search,
                        pop_criteria(criteria))
    out_path = Path(out_dir) if out_dir else _default_out(factory)
    with ModuleProgress(quiet_level()) as progress:
        result = diagnose(tm, opts, out_path, progress.trial, progress.stage)
    from .diagnosis.folding import conv_norm_pairs, torch_notes
    notes = torch_notes(conv_norm_pairs(tm.module), result.fp32_modules)
    if as_json:
        click.echo(json.dumps({**result.to_json(), "folded_at_export": notes}, indent=2))
    else:
        emit_torch(result, top)
        for note in notes:  # why `run` on this factory may keep less (folding.py)
            out.print(f"note: {shown(note)}", soft_wrap=True)
    finish(result.exit_code)


class ModuleProgress(Progress):
    def trial(self, trial, remaining: int) -> None:
        msg = (f"Evaluation {trial.index} | {trial.phase} | {len(trial.fp32)} modules FP32 | "
               f"{'pass' if trial.passed else 'fail'} | ~{remaining} remaining")
        if not self.show(msg):
            log.debug(msg)


def emit_torch(result, top: int) -> None:
    p = result.precision
    verdicts = {"fp16_ok": f"[green]{p.dtype.upper()} already meets the tolerance[/]",
                "fixed": f"[green]fixed[/] by keeping {len(result.fp32_modules)} of "
                         f"{result.candidates} candidate modules in FP32",
                "reference_invalid": "[red]the FP32 reference is already non-finite[/]",
                "no_plan": "[red]no plan meets the tolerance[/]",
                "not_searched": "layer-wise comparison only (--no-search)"}
    out.print(f"{p.describe()}")
    out.print(f"verdict: {verdicts[result.verdict]}")
    for problem in result.reference_problems:
        out.print(f"  {problem}")
    _layerwise_table(result, top)
    if result.culprits:
        t = Table(title="Modules to keep in FP32", title_justify="left")
        for col in ("module", "class", "why"):
            t.add_column(col, overflow="fold")
        for c in result.culprits:
            t.add_row(shown(c.module), c.cls, shown(c.why))
        out.print(t)
    if result.errors_before:
        t = Table(title="Outputs", title_justify="left")
        t.add_column("output", overflow="fold")
        t.add_column(f"all {p.mode} {p.dtype}")
        planned = result.verdict == "fixed"  # a column of its own only with a plan
        if planned:
            t.add_column("with the plan")
        for name, before in result.errors_before.items():
            after = [error_cell(result.errors_after.get(name))] if planned else []
            t.add_row(shown(name), error_cell(before), *after)
        out.print(t)
    if result.search is not None:
        from .outputs.plan_groups import plural
        minimal = ("" if not result.fp32_modules else ", certified 1-minimal"
                   if result.one_minimal else ", not certified minimal")
        out.print(f"{plural(result.evaluations, 'evaluation')} "
                  f"({plural(result.inferences, 'inference')}){minimal}, {result.seconds:.1f}s")
    for key, label in (("plan", "plan"), ("snippet", "apply it with"), ("layerwise", "layer-wise")):
        if key in result.files:
            out.print(f"{label}: {result.files[key]}")


def _layerwise_table(result, top: int) -> None:
    s = result.summary
    for key, label in (("first_nonfinite", "first module to turn inf/NaN"),
                       ("first_overflow", "first module whose ops overflow"),
                       ("first_out_of_range", "first output beyond the range"),
                       ("first_jump", "error first exceeds rtol at")):
        if s.get(key):
            out.print(f"{label}: {s[key]}")
    stats = list(result.stats.values())
    if not stats or top <= 0:
        return
    flagged = [m for m in stats if m.overflow_ops or m.out_of_range or m.new_nonfinite]
    rows = (flagged or sorted(stats, key=lambda m: -m.rel_err))[:top]
    p = result.precision
    t = Table(title=f"FP32 vs {p.mode} {p.dtype}, by module ({len(stats)} modules)",
              title_justify="left")
    for col in ("module", "class", "FP32 max|x|", "rel err", "inf/NaN", "overflowing ops"):
        t.add_column(col, overflow="fold")
    for m in rows:
        t.add_row(shown(m.module), m.cls, fmt(m.fp32_absmax), rel_cell(m.rel_err, m.new_nonfinite),
                  str(m.new_nonfinite),
                  ", ".join(f"{op} ({n})" for op, n in m.overflow_ops.items()))
    out.print(t)
