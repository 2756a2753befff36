"""Command line: thin commands that parse, call the library, and format. Errors become exit
codes here and nowhere else."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Callable

import click
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.table import Table

from . import __version__
from .compare import OutputError, Tolerance
from .errors import TrtBisectError
from .inputs import parse_shapes

log = logging.getLogger("trtbisect")
err = Console(stderr=True)
out = Console()

EXIT_CODES_HELP = """\b
Exit codes:
  0  FP16 already passes, or a plan was found and verified
  2  usage or input error (missing file, malformed ONNX, mismatched inputs)
  3  the FP32 reference is already non-finite (FP16 is not to blame)
  4  no precision plan meets the tolerance
"""


class Group(click.Group):
    """Turns TrtBisectError into one line on stderr and its exit code."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TrtBisectError as exc:
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            sys.exit(exc.exit_code)


@click.group(cls=Group, epilog=EXIT_CODES_HELP,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="trtbisect")
@click.option("-v", "--verbose", count=True, help="More detail on stderr (-vv for every evaluation).")
@click.option("-q", "--quiet", count=True, help="Less on stderr (-q: no progress, -qq: errors only).")
def main(verbose: int, quiet: int) -> None:
    """Find why an FP16 model disagrees with FP32, and the smallest FP32 fallback that fixes it.

    trtbisect runs an FP32 reference and an FP16 candidate, compares every output and
    intermediate tensor, bisects by forcing nodes to FP32, and writes a precision plan for
    TensorRT 10 and 11, Polygraphy and ModelOpt AutoCast. The default backend is a faithful
    FP16 emulator on ONNX Runtime's CPU provider: no GPU needed.

    \b
    Example:
      trtbisect run models/demo.onnx --inputs models/demo_inputs.npz --out runs/demo
    """
    level = logging.WARNING + 10 * (quiet - verbose)
    logging.basicConfig(level=max(level, logging.DEBUG), format="%(message)s", force=True,
                        handlers=[RichHandler(console=err, show_time=False, show_path=False)])
    click.get_current_context().meta["quiet"] = quiet


def input_options(f: Callable) -> Callable:
    """Options every command that runs a model shares."""
    opts = [
        click.option("--inputs", "inputs", multiple=True, type=click.Path(dir_okay=False),
                     help="An .npz keyed by graph input name; repeat for more samples, or stack "
                          "samples on a leading axis. Default: seeded random data."),
        click.option("--shape", "shapes", multiple=True, metavar="NAME:DIMS",
                     help="Shape for an input with dynamic dimensions, e.g. x:1x3x224x224."),
        click.option("--seed", default=0, show_default=True, help="Seed for random inputs."),
        click.option("--samples", default=1, show_default=True,
                     help="Number of random samples when no --inputs are given."),
        click.option("--rtol", default=Tolerance.rtol, show_default=True,
                     help="Relative tolerance: max|fp16-fp32| <= rtol*max|fp32| + atol."),
        click.option("--atol", default=Tolerance.atol, show_default=True, help="Absolute tolerance."),
        click.option("--output-tol", "output_tols", multiple=True, metavar="NAME:RTOL[:ATOL]",
                     help="Tolerance for one output, e.g. logits:0.05:0.001."),
        click.option("--threads", type=int, default=None, help="ONNX Runtime intra-op threads."),
        click.option("--semantics", type=click.Choice(["trt", "strict"]), default="trt",
                     show_default=True,
                     help="trt: round where TensorRT rounds (constants and BatchNorms folded "
                          "in FP32, fused layers rounded once); strict: every node rounds its "
                          "inputs and outputs, the pessimistic bound. See docs/semantics.md."),
        click.option("--trt-version", "trt_version", type=click.Choice(["10", "11"]),
                     default="10", show_default=True,
                     help="TensorRT version the plan targets (weight conversion, renderings)."),
        click.option("--tf32/--no-tf32", "tf32", default=False, show_default=True,
                     help="Judge FP32 MatMul/Conv/Gemm with TF32-rounded operands, as TensorRT "
                          "runs them on Ampere+ unless --noTF32 (off: the renderings carry "
                          "--noTF32)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def make_options(kw: dict):
    from .pipeline import Options

    per_output = {}
    for spec in kw.pop("output_tols", ()):
        parts = spec.rsplit(":", 2) if spec.count(":") >= 2 else spec.rsplit(":", 1)
        try:
            per_output[parts[0]] = (float(parts[1]), float(parts[2]) if len(parts) > 2 else 0.0)
        except (IndexError, ValueError):
            raise TrtBisectError(f"bad --output-tol {spec!r}: expected NAME:RTOL[:ATOL]")
    tol = Tolerance(kw.pop("rtol"), kw.pop("atol"), per_output)
    return Options(inputs=kw.pop("inputs"), shapes=parse_shapes(kw.pop("shapes")),
                   seed=kw.pop("seed"), samples=kw.pop("samples"), tolerance=tol,
                   threads=kw.pop("threads"), trt_version=int(kw.pop("trt_version")), **kw)


@main.command(epilog=EXIT_CODES_HELP)
@click.argument("model")
@input_options
@click.option("--input", "torch_inputs", multiple=True, metavar="NAME:DIMS[:DTYPE]",
              help="For a PyTorch MODEL given as FILE.py:FACTORY (exported to --out first): "
                   "a forward input, e.g. x:1x3x224x224. See `trtbisect export --help`.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Folder for the plan and its renderings. Default: runs/<model name>.")
@click.option("--strict", is_flag=True,
              help="Also reject plans that leave an intermediate tensor NaN/inf where FP32 is finite.")
@click.option("--max-evals", "max_evaluations", type=int, default=None,
              help="Stop the search after this many evaluations (the plan is then not certified).")
@click.option("--no-resume", "no_resume", is_flag=True,
              help="Ignore the journal of an earlier, interrupted run in --out.")
@click.option("--backend", type=click.Choice(["ort", "trt"]), default="ort", show_default=True,
              help="ort: the CPU FP16 emulator. trt: TensorRT engines on a CUDA GPU.")
@click.option("--report", is_flag=True,
              help="Also write report.html (self-contained) and report.md to --out. "
                   "Needs matplotlib: pip install 'trtbisect[report]'.")
@click.option("--stability", type=click.IntRange(min=0), default=0, metavar="N",
              help="Rerun the plan and all-FP16 on N copies of each sample jittered at FP16 "
                   "rounding level (N >= 2; the sample itself counts as one); report the "
                   "error's noise floor and flag plans within it. E.g. --stability 8. "
                   "Default: off.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def run(model: str, out_dir: str | None, backend: str, report: bool, as_json: bool,
        no_resume: bool, stability: int, **kw) -> None:
    """Find the minimal set of nodes to keep in FP32, and write the plan.

    Runs the FP32 reference, compares all-FP16 layer by layer, searches for a 1-minimal FP32
    set (every node in it is needed), verifies it, and writes precision.json, the trtexec /
    Polygraphy / AutoCast renderings and a strongly typed mixed ONNX model to --out.
    An interrupted run started again with the same arguments resumes from its journal.

    \b
    Examples:
      trtbisect run model.onnx --inputs inputs.npz --out runs/model
      trtbisect run model.onnx --shape x:1x3x224x224 --samples 4 --strict --json
    """
    from . import pipeline
    from .export import resolve_model_arg

    out = Path(out_dir) if out_dir else Path("runs") / Path(model).stem
    onnx_path, saved = resolve_model_arg(model, kw.pop("torch_inputs"), out)  # FILE.py:FACTORY
    kw["inputs"] = kw["inputs"] or ((str(saved),) if saved else ())
    model = str(onnx_path)
    opts = make_options(kw)
    opts.resume = not no_resume
    opts.report, opts.stability = report, stability
    if backend == "trt":
        from .backends.trt import trt_available
        usable, why = trt_available()
        if not usable:
            raise TrtBisectError(f"--backend trt needs TensorRT and a CUDA GPU: {why} "
                                 "(see `trtbisect env`)")
    quiet = click.get_current_context().find_root().meta.get("quiet", 0)
    with Progress(quiet) as progress:
        result = pipeline.run(model, opts, out, progress.trial, progress.stage)
        if backend == "trt" and result.verdict in ("fixed", "fp16_ok"):
            progress.stage("verifying the emulator's plan with TensorRT engines")
            pipeline.verify_on_tensorrt(result, opts, out)
    emit_run(result, as_json)
    sys.exit(result.exit_code)


class Progress:
    """Search progress on stderr, in Polygraphy's style: `Evaluation 3 | ... | ~4 remaining`."""

    def __init__(self, quiet: int) -> None:
        self.quiet = quiet
        self.status = None

    def __enter__(self) -> "Progress":
        if not self.quiet:
            self.status = err.status("starting")
            self.status.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.status is not None:
            self.status.__exit__(*exc)

    def stage(self, msg: str) -> None:
        if self.status is not None:
            self.status.update(msg)
        log.info(msg)

    def trial(self, trial, remaining: int) -> None:
        msg = (f"Evaluation {trial.index} | {trial.phase} | {len(trial.fp32)} nodes FP32 | "
               f"{'pass' if trial.passed else 'fail'} | ~{remaining} remaining")
        if self.status is not None:
            self.status.update(msg)
        log.debug(msg)


def fmt(x: float) -> str:
    return f"{x:.3g}"


def error_cell(e: OutputError | None) -> str:
    if e is None:
        return "-"
    mark = "[green]ok[/]" if e.passed else "[red]FAIL[/]"
    extra = f", {e.nonfinite} non-finite" if e.nonfinite else ""
    return f"{mark} max|d| {fmt(e.max_abs)} (bound {fmt(e.bound)}){extra}"


def emit_run(result, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    verdicts = {"fp16_ok": "[green]FP16 already meets the tolerance[/]",
                "fixed": f"[green]fixed[/] by keeping {len(result.fp32_nodes)} of "
                         f"{result.candidates} nodes in FP32",
                "reference_invalid": "[red]the FP32 reference is already non-finite[/]",
                "no_plan": "[red]no plan meets the tolerance[/]"}
    out.print(f"verdict: {verdicts[result.verdict]}")
    for p in result.reference_problems:
        out.print(f"  {p}")
    if result.culprits:
        t = Table(title="Nodes to keep in FP32", title_justify="left")
        t.add_column("node")
        t.add_column("op")
        modules = any(c.module for c in result.culprits)
        if modules:
            t.add_column("module", overflow="fold")
        layers = any(c.layer for c in result.culprits)
        if layers:
            t.add_column("TensorRT layer", overflow="fold")
        t.add_column("why")
        for c in result.culprits:
            t.add_row(c.node, c.op, *([c.module or ""] if modules else []),
                      *([escape(c.layer or c.node)] if layers else []), escape(c.why))
        out.print(t)
    emit_diagnosis(result)
    if result.errors_before:
        t = Table(title="Outputs", title_justify="left")
        t.add_column("output")
        t.add_column("all FP16")
        t.add_column("with the plan")
        for name, before in result.errors_before.items():
            t.add_row(name, error_cell(before), error_cell(result.errors_after.get(name)))
        out.print(t)
        strict = result.extra.get("errors_before_strict") or {}
        for name, e in strict.items():  # both all-FP16 verdicts (docs/semantics.md)
            out.print(f"  all FP16 per node (--semantics strict), {name}: "
                      f"{'ok' if e['passed'] else 'FAIL'} max|d| {fmt(float(e['max_abs']))}")
    if result.search is not None:
        minimal = "certified 1-minimal" if result.one_minimal else "not certified minimal"
        out.print(f"{result.evaluations} evaluations ({result.inferences} inferences), "
                  f"{minimal}, {result.seconds:.1f}s")
    if result.files:
        out.print(f"plan: {result.files.get('plan')}")
        if "mixed_model" in result.files:
            out.print(f"mixed ONNX (TensorRT 11): {result.files['mixed_model']}")
        if "commands" in result.files:
            out.print(f"commands: {result.files['commands']}")
        if "annotated_model" in result.files:
            out.print(f"annotated ONNX (open in Netron): {result.files['annotated_model']}")
        if "report_html" in result.files:
            out.print(f"report: {result.files['report_html']}")


def emit_diagnosis(result) -> None:
    """One sentence per culprit group (cause, numbers, fix), then any stability flags."""
    for k, g in enumerate(result.extra.get("culprit_groups") or [], 1):
        pattern = f", {g['pattern']}" if g.get("pattern") else ""
        out.print(f"[bold]{k}. {g['cause']}{escape(pattern)}[/]: {escape(g['summary'])}")
    stab = result.extra.get("stability")
    if stab:
        flags = stab["flags"] or ["no plan flips or sits within the noise"]
        out.print(f"stability ({stab['runs']} runs x {stab['samples']} sample(s)): "
                  + escape("; ".join(flags)))


@main.command(epilog=EXIT_CODES_HELP)
@click.argument("model")
@input_options
@click.option("--top", default=15, show_default=True, help="Rows to show (sorted by graph order).")
@click.option("--json", "as_json", is_flag=True, help="Print every tensor's statistics as JSON.")
def compare(model: str, top: int, as_json: bool, **kw) -> None:
    """Compare FP32 and all-FP16 tensor by tensor, without searching.

    Shows where values leave the FP16 range, the first tensors that turn non-finite, and where
    the error first jumps.

    \b
    Example:
      trtbisect compare models/demo.onnx --inputs models/demo_inputs.npz
    """
    from . import pipeline

    opts = make_options(kw)
    ctx = pipeline.prepare(model, opts)
    problems = pipeline.reference_problems(ctx)
    if problems:
        raise TrtBisectError(f"the FP32 reference is already broken: {problems[0]}", 3)
    stats = pipeline.layerwise(ctx, opts)
    summary = pipeline.summarize_layerwise(ctx.graph, stats)
    if as_json:
        click.echo(json.dumps({"summary": summary, "tensors": [s.to_json() for s in stats.values()]},
                              indent=2))
        return
    t = Table(title=f"FP32 vs all-FP16: {len(stats)} tensors", title_justify="left")
    for col in ("tensor", "producer", "FP32 max|x|", "rel err", "non-finite", "overflow", "flushed"):
        t.add_column(col)
    flagged = [s for s in stats.values() if s.overflow or s.new_nonfinite or s.flushed
               or s.fp32_absmax > 65504]
    rows = flagged[:top] if flagged else sorted(stats.values(), key=lambda s: -s.rel_err)[:top]
    for s in rows:
        t.add_row(s.name, s.producer or "(input)", fmt(s.fp32_absmax), fmt(s.rel_err),
                  str(s.fp16_nonfinite), str(s.overflow), str(s.flushed))
    out.print(t)
    for key, label in (("first_nonfinite", "first non-finite in FP16"),
                       ("first_overflow", "first value beyond 65504"),
                       ("first_jump", "error first jumps at")):
        if summary.get(key):
            out.print(f"{label}: {summary[key]}")


@main.command(epilog=EXIT_CODES_HELP)
@click.argument("mixed")
@click.option("--reference", required=True, help="The FP32 ONNX model to compare against.")
@input_options
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def check(mixed: str, reference: str, as_json: bool, **kw) -> None:
    """Judge any mixed-precision ONNX model faithfully against its FP32 original.

    Each float16 op is computed in FP32 on FP16-exact inputs and its output rounded to FP16,
    so overflow is seen (running FP16 on ORT CPU would hide it). Works on trtbisect's mixed
    model, on AutoCast output, or on a hand-made FP16 model. Exits 0 when it passes, 4 if not.

    \b
    Example:
      trtbisect check runs/demo/demo.mixed.onnx --reference models/demo.onnx \\
          --inputs models/demo_inputs.npz
    """
    from . import pipeline

    result = pipeline.check_mixed(mixed, reference, make_options(kw))
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        out.print(f"{'[green]pass[/]' if result.passed else '[red]fail[/]'}: {mixed} "
                  f"({result.half_tensors} float16 tensors, {result.samples} sample(s))")
        for name, e in result.errors.items():
            out.print(f"  {name}: {error_cell(e)}")
    sys.exit(0 if result.passed else 4)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def env(as_json: bool) -> None:
    """List which backends are usable on this machine, and why not.

    \b
    Example:
      trtbisect env
    """
    from .backends.trt import backend_status

    rows = backend_status()
    if as_json:
        click.echo(json.dumps([{"component": c, "usable": u, "detail": d} for c, u, d in rows],
                              indent=2))
        return
    t = Table(title="Backends and components", title_justify="left")
    for col in ("component", "usable", "detail"):
        t.add_column(col)
    for component, usable, detail in rows:
        t.add_row(component, "[green]yes[/]" if usable else "[red]no[/]", escape(detail))
    out.print(t)


def entry() -> None:  # pragma: no cover - console script shim
    main()


if __name__ == "__main__":  # pragma: no cover
    main()


from . import cli_torch  # noqa: E402,F401  (registers export and torch)
