"""Command line: thin commands that parse, call the library, and format. Errors become exit
codes here and nowhere else."""

from __future__ import annotations

import importlib
import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.markup import escape
from rich.table import Table

from . import __version__
from .base.flags import Number, apply_flags
from .base.limits import limit_options, pop_limits
from .cli_torch import export_cmd, torch_cmd
from .console import (
    USAGE,
    Progress,
    Terminated,
    configure_logging,
    error_cell,
    exit_codes,
    fail,
    finish,
    fmt,
    log,
    out,
    pipe_closed,
    quiet_level,
    rel_cell,
    shown,
    terminate_as_interrupt,
    usable_streams,
    verbosity_options,
)
from .data.inputs import MAX_SAMPLES, parse_shapes
from .errors import EXIT_SIGINT, EXIT_SIGTERM, EXIT_USAGE, TrtBisectError
from .judge.compare import Tolerance
from .judge.flags import criteria_options, pop_criteria
from .judge.precision import FP16, one_precision, precision_option
from .judge.validation import HOLD_OUT_SHARE
from .outputs.outdir import OutputDir
from .outputs.plan_groups import (
    DEFAULT_TOP,
    OPS_WIDTH,
    PlanGroup,
    cause_text,
    has_plan,
    layers_words,
    plan_groups,
    plural,
    rest_text,
    search_words,
)
from .search.cost import (
    DEFAULT_GPU,
    GPUS,
    CostRecord,
    boundary_row,
    cost_cells,
    cost_sentence,
    pct,
)

if TYPE_CHECKING:
    from .diagnosis.diagnose import CulpritGroup

REFERENCE = (3, "the FP32 reference is already non-finite (FP16 is not to blame)")
PARTIAL = (5, "partial: the judged part passes, but the model holds nodes the emulator\n"
           "       cannot round (contrib-domain or unknown ops; listed, with precision.json's\n"
           "       \"coverage\"): FP16 is not called fine for them")
UNSTABLE = (8, "reference_unstable: two FP32 runs differ (the model draws random numbers:\n"
            "       Random*, Multinomial, Bernoulli, Dropout in training mode; named)")
EXIT_CODES_HELP = exit_codes((0, "FP16 already passes, a plan was found and verified, or no node\n"
                                 "       computes in float32/16 (nothing to judge)"), USAGE,
                             REFERENCE, (4, "no precision plan meets the criteria"), PARTIAL)
OVER_BUDGET = (6, "`run --budget PCT`: no plan within the slowdown budget meets the criteria;\n"
               "       the best plan within it is written with its measured error")
FRAGILE = (7, "fragile: a plan meets the criteria, but none by more than the spread of what\n"
           "       the tools compute (ORT optimizations, threads, FP32 noise); the nearest is\n"
           "       written with its margins")
UNVALIDATED = (9, "unvalidated: the plan passes the samples it was searched on but fails the\n"
               "       samples the search never saw (held out, or perturbed copies of one);\n"
               "       it is written with its validation errors, not called fixed")
INTERRUPTED = (130, "interrupted by Ctrl-C (SIGINT); 143: terminated (SIGTERM); `run`\n"
               "       resumes when started again with the same arguments")
RUN_EXIT_CODES = EXIT_CODES_HELP + exit_codes(OVER_BUDGET, FRAGILE, UNSTABLE, UNVALIDATED,
                                               INTERRUPTED).split("\n", 2)[2]
COMPARE_EXIT_CODES = exit_codes((0, "compared (whatever the errors)"), USAGE, REFERENCE,
                                UNSTABLE)
CHECK_EXIT_CODES = exit_codes((0, "the mixed model meets the criteria"), USAGE, REFERENCE,
                              (4, "the mixed model misses the criteria"),
                              (5, "it meets the criteria, but holds nodes the emulator cannot\n"
                                  "       round (listed): judged in part only"), UNSTABLE)
ENV_EXIT_CODES = exit_codes((0, "always (the table says what is missing)"))

MAX_STABILITY = 100  # --stability N: N jittered copies of a sample are held at once
MAX_THREADS = max(64, 4 * (os.cpu_count() or 1))
JUDGE_THREADS = 1  # --threads' default (see its help; docs/workers.md)


class Group(click.Group):
    """Turns TrtBisectError, an interruption and an environment failure into one line on
    stderr and a documented exit code (anything else is a bug and keeps its traceback)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TrtBisectError as exc:
            fail(str(exc), exc.exit_code)
        except click.UsageError as exc:  # bad option values: one line too, exit 2
            where = exc.ctx.command_path if exc.ctx else "trtbisect"
            fail(f"{exc.format_message()} (see `{where} --help`)", exc.exit_code)
        except KeyboardInterrupt as exc:
            how = ctx.meta.get("resume_hint", "")
            fail(f"interrupted{'; ' + how if how else ''}",
                 EXIT_SIGTERM if isinstance(exc, Terminated) else EXIT_SIGINT)
        except BrokenPipeError:  # stdout's reader left (`| head`): as a Unix tool killed by SIGPIPE
            pipe_closed()
        except OSError as exc:  # disk full, read-only folder, a folder where a file should be
            where = f": {exc.filename}" if exc.filename else ""
            fail(f"{exc.strerror or exc}{where}", EXIT_USAGE)
        except UnicodeDecodeError as exc:  # protobuf strings are UTF-8 by spec; a model breaks it
            fail(f"the input holds a string that is not valid UTF-8 ({exc.reason} at byte "
                 f"{exc.start}): a damaged or hand-edited file?", EXIT_USAGE)
        except MemoryError:
            fail("out of memory; give smaller inputs or fewer samples", EXIT_USAGE)


def non_negative() -> Number:
    """A finite float >= 0."""
    return Number("float", lambda x: math.isfinite(x) and x >= 0,
                  "a finite, non-negative number")


def _stability_runs(ctx: click.Context, param: click.Parameter, value: int) -> int:
    if value == 1:
        raise click.BadParameter("N counts the sample itself: give 0 (off) or N >= 2", ctx, param)
    return value


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
    meta = click.get_current_context().meta
    meta["verbose"], meta["quiet"] = verbose, quiet
    closed = usable_streams()
    configure_logging(verbose, quiet)
    if closed:
        log.warning("stdout is closed: nothing is printed there; the exit code still gives the "
                    "verdict, and --out holds the results")


main.add_command(export_cmd, "export")  # the PyTorch commands: cli_torch.py
main.add_command(torch_cmd, "torch")


def input_options(f: Callable, both: bool = False) -> Callable:
    """Options every command that runs a model shares; `both`: --precision takes `both`."""
    opts = [
        click.option("--inputs", "inputs", multiple=True, metavar="NPZ|FOLDER|GLOB|JSON",
                     help="Samples: an .npz keyed by graph input name (samples may be stacked "
                          "on a leading axis), a folder or a quoted glob of them ('data/*.npz'), "
                          "or a JSON of Polygraphy's --save-inputs; repeatable. Read one at a "
                          "time. Default: seeded random data."),
        click.option("--data-loader-script", "data_loader", metavar="FILE.py[:FUNCTION]",
                     default=None,
                     help="Polygraphy's data loader: FUNCTION (default load_data) yields feed "
                          "dicts (input name -> numpy array), one per sample. Trusted code, run "
                          "in this process."),
        click.option("--shape", "shapes", multiple=True, metavar="NAME:DIMS",
                     help="Shape for an input with dynamic dimensions, e.g. x:1x3x224x224."),
        click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Seed for random inputs."),
        click.option("--samples", type=click.IntRange(1, MAX_SAMPLES), default=1,
                     show_default=True,
                     help=f"Number of random samples when no --inputs are given (1 to "
                          f"{MAX_SAMPLES}; all of them must fit in half of the memory). "
                          "For a PyTorch FILE.py:FACTORY, 1 means its own example input."),
        click.option("--rtol", type=non_negative(), default=Tolerance.rtol, show_default=True,
                     help="Relative tolerance: max|fp16-fp32| <= rtol*max|fp32| + atol."),
        click.option("--atol", type=non_negative(), default=Tolerance.atol, show_default=True,
                     help="Absolute tolerance."),
        click.option("--output-tol", "output_tols", multiple=True, metavar="NAME:RTOL[:ATOL]",
                     help="Tolerance for one output, e.g. logits:0.05:0.001."),
        click.option("--threads", type=click.IntRange(1, MAX_THREADS), default=None,
                     help=f"ONNX Runtime intra-op threads of every judging session (1 to "
                          f"{MAX_THREADS}; default {JUDGE_THREADS}). Part of the judge: ORT's "
                          "Conv results depend on it, so a run's workers use it too."),
        click.option("--semantics", type=click.Choice(["trt", "strict"]), default="trt",
                     show_default=True,
                     help="trt: round where TensorRT rounds (constants and BatchNorms folded "
                          "in FP32, fused layers rounded once); strict: every node rounds its "
                          "inputs and outputs, the pessimistic bound. See docs/semantics.md."),
        click.option("--trt-version", "trt_version", type=click.Choice(["10", "11"]),
                     default=None,
                     help="TensorRT version the plan targets (weight conversion, renderings). "
                          "Default: the installed TensorRT's major version, else 11 "
                          "(`trtbisect env` shows which)."),
        click.option("--tf32/--no-tf32", "tf32", default=False, show_default=True,
                     help="Judge FP32 MatMul/Conv/Gemm with TF32-rounded operands, as TensorRT "
                          "runs them on Ampere+ unless --noTF32 (off: the renderings carry "
                          "--noTF32)."),
        click.option("--fp16-accumulate", "fp16_accumulate", is_flag=True, default=False,
                     help="Approximate FP16-accumulating kernels: FP16 MatMul/Gemm/Conv sum "
                          "blocks of 32 along the inner dimension, rounding each partial and "
                          "the running sum to FP16 (pessimistic; see docs/semantics.md)."),
        precision_option(both),  # judge/precision.py: --precision fp16|bf16 (run: also both)
    ]
    f = criteria_options(f)  # judge/flags.py: --check-error-stat, --metric, --check, ...
    f = limit_options(f)  # limits.py: --max-samples, --max-input-bytes, --eval-timeout, ...
    return apply_flags(f, opts)


def make_options(kw: dict, both: bool = False):
    """Options from the shared flags; `both`: the command takes --precision both (run)."""
    from .context import Options

    one_precision(kw.get("precision", "fp16"), both)
    per_output = {}
    for spec in kw.pop("output_tols", ()):
        parts = spec.rsplit(":", 2) if spec.count(":") >= 2 else spec.rsplit(":", 1)
        try:
            per_output[parts[0]] = (float(parts[1]), float(parts[2]) if len(parts) > 2 else 0.0)
        except (IndexError, ValueError):
            raise TrtBisectError(f"bad --output-tol {spec!r}: expected NAME:RTOL[:ATOL]") from None
    tol = Tolerance(kw.pop("rtol"), kw.pop("atol"), per_output)
    return Options.of(inputs=kw.pop("inputs"), data_loader=kw.pop("data_loader"),
                      shapes=parse_shapes(kw.pop("shapes")),
                      seed=kw.pop("seed"), samples=kw.pop("samples"), tolerance=tol,
                      criteria=pop_criteria(kw),
                      limits=pop_limits(kw),
                      threads=kw.pop("threads") or JUDGE_THREADS,
                      trt_version=_trt_version(kw.pop("trt_version")),
                      **kw)


def _trt_version(given: str | None) -> int:
    from .backends.trt import default_trt_version
    return int(given) if given else default_trt_version()


def run_input_options(f: Callable) -> Callable:
    """`run`'s shared options: its --precision also takes `both`."""
    return input_options(f, both=True)


@main.command(epilog=RUN_EXIT_CODES)
@click.argument("model")
@run_input_options
@verbosity_options
@click.option("--input", "torch_inputs", multiple=True, metavar="NAME:DIMS[:DTYPE]",
              help="For a PyTorch MODEL given as FILE.py:FACTORY (exported to --out first): "
                   "a forward input, e.g. x:1x3x224x224. See `trtbisect export --help`.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Folder for the plan and its renderings. Default: runs/<model name>.")
@click.option("--strict", is_flag=True,
              help="Also reject plans that leave an intermediate tensor NaN/inf where FP32 is finite.")
@click.option("--max-evals", "max_evaluations", type=click.IntRange(min=1), default=None,
              help="Stop the search after this many evaluations (the plan is then not certified).")
@click.option("--search-samples", "search_samples", type=click.IntRange(min=0), default=8,
              show_default=True, metavar="N",
              help="With more samples than N, the search judges its plans on the N where "
                   "all-FP16 fails worst, then certifies the plan on every sample (searching "
                   "again with any that fails). 0: judge every sample throughout.")
@click.option("--validation-share", "validation_share", type=click.FloatRange(0, 0.9),
              default=HOLD_OUT_SHARE, show_default=True, metavar="F",
              help="Of two samples or more, hold this share (at least one) out of the search "
                   "and validate the written plan on them; with one sample, validate on "
                   "perturbed copies of it (docs/trust.md). A plan that fails them is "
                   "'unvalidated' (exit 9), not fixed. 0: no validation.")
@click.option("--no-resume", "no_resume", is_flag=True,
              help="Ignore the journal of an earlier, interrupted run in --out.")
@click.option("--backend", type=click.Choice(["ort", "trt"]), default="ort", show_default=True,
              help="ort: the CPU FP16 emulator. trt: then TensorRT engines on a CUDA GPU, "
                   "judged by the same criteria (--metric, --check, ...).")
@click.option("--report", is_flag=True,
              help="Also write report.html (self-contained) and report.md to --out. "
                   "Needs matplotlib: pip install 'trtbisect[report]'.")
@click.option("--stability", type=click.IntRange(0, MAX_STABILITY), default=0, metavar="N",
              callback=_stability_runs,
              help="Rerun the plan and all-FP16 on N copies of each sample jittered at FP16 "
                   "rounding level (2 <= N <= 100; the sample itself counts as one); report the "
                   "error's noise floor and flag plans within it. E.g. --stability 8. "
                   "Default: off.")
@click.option("--rewrite", is_flag=True,
              help="First try verified FP16-safe graph rewrites (clamp an out-of-range mask "
                   "constant, fuse a decomposed LayerNorm, pre-scale attention, ...), each "
                   "judged like a plan; then search the FP32 set for what is left. The "
                   "rewritten model is written as <model>.rewritten.onnx.")
@click.option("--objective", type=click.Choice(["cost", "count"]), default="cost",
              show_default=True,
              help="cost: the plan with the least estimated engine time (docs/cost.md); "
                   "count: the fewest FP32 units (earlier versions' search).")
@click.option("--gpu", type=click.Choice(list(GPUS)), default=DEFAULT_GPU, show_default=True,
              help="GPU class plans are priced on (datasheet peaks; docs/cost.md).")
@click.option("--budget", type=non_negative(), default=None, metavar="PCT",
              help="Accept at most this estimated slowdown against all-FP16, in percent, e.g. "
                   "--budget 5. If no plan within it passes: exit 6, and the best plan within "
                   "it is written with its measured error.")
@click.option("--workers", type=click.IntRange(1, MAX_THREADS), default=None, metavar="N",
              help="Evaluate plans on N worker processes, each with its own judge (1: in this "
                   "process). Default: as many as the cores and memory allow, when the search "
                   "is long enough to pay for starting them; stderr says what was chosen. The "
                   "plan is the same for every N. With --backend trt, N>1 also builds the "
                   "TensorRT search's plans on up to N visible GPUs.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None,
              metavar="[ADDRESS]",
              help="Evaluate plans on Ray actors: on the cluster at ADDRESS (e.g. auto, or "
                   "ray://head:10001), or alone on a local one. Needs: pip install "
                   "'trtbisect[ray]'. --workers then caps the actors.")
@click.option("--top", type=click.IntRange(min=1), default=DEFAULT_TOP, show_default=True,
              metavar="N",
              help="Rows of the plan (grouped by module, else by TensorRT layer, costliest "
                   "first) and kinds of cause shown on the console; precision.json has all.")
@click.option("--all", "show_all", is_flag=True,
              help="Show every group, every diagnosis and every node of the plan.")
@click.option("--calibration", "calibration", multiple=True, metavar="NPZ|FOLDER|GLOB|JSON",
              help="With --precision int8|fp8: the samples ModelOpt calibrates on (as "
                   "--inputs; repeatable). Default: the --inputs samples.")
@click.option("--reference", "quant_reference", default=None, metavar="FP32.onnx",
              help="For a quantized (Q/DQ) MODEL: the FP32 model it was quantized from, to "
                   "judge against. Default: MODEL with its Q/DQ removed (docs/quantization.md).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def run(model: str, out_dir: str | None, backend: str, report: bool, as_json: bool,
        no_resume: bool, stability: int, rewrite: bool, search_samples: int,
        validation_share: float, workers: int | None, ray_address: str | None, top: int, show_all: bool,
        quant_reference: str | None, calibration: tuple[str, ...], **kw) -> None:
    """Find the minimal set of nodes to keep in FP32, and write the plan.

    Runs the FP32 reference, compares all-FP16 layer by layer, searches for a 1-minimal FP32
    set (every node in it is needed), verifies it, and writes precision.json, the trtexec /
    Polygraphy / AutoCast renderings and a strongly typed mixed ONNX model to --out.
    An interrupted run started again with the same arguments resumes from its journal.

    \b
    Examples:
      trtbisect run model.onnx --inputs inputs.npz --out runs/model
      trtbisect run model.onnx --shape x:1x3x224x224 --samples 4 --strict --json
      trtbisect run model_qdq.onnx --inputs val.npz   (INT8/FP8 Q/DQ: layers to un-quantize)
    """
    from . import pipeline
    from .reports.write import PLAN_VERDICTS
    from .torch.export import resolve_model_arg

    out = Path(out_dir) if out_dir else Path("runs") / Path(model).stem
    onnx_path, saved = resolve_model_arg(model, kw.pop("torch_inputs"), out)  # FILE.py:FACTORY
    # a factory's own example input is the sample, unless --samples N asks for N random ones
    kw["inputs"] = kw["inputs"] or ((str(saved),) if saved and kw["samples"] == 1 else ())
    model = str(onnx_path)
    opts = make_options(kw, both=True).but(
        resume=not no_resume, report=report, stability=stability, rewrite=rewrite,
        search_samples=search_samples, validation_share=validation_share, workers=workers,
        ray=ray_address)
    from .quant import wants_quantized  # a Q/DQ model or --precision int8|fp8: trtbisect/quant/
    quantized = wants_quantized(model, opts.judge.precision, quant_reference, calibration)
    refuse_flags(quantized, opts.judge.precision)
    if quantized:
        from .quant.console import run_and_emit
        finish(run_and_emit(model, opts, out, quant_reference, backend, as_json, calibration))
    if ray_address is not None:
        from .parallel.ray_pool import check_address, require_ray
        require_ray()  # before any work: a one-line install hint,
        check_address(ray_address)  # or a head nobody answers at
    if backend == "trt" and opts.judge.precision != "fp16":  # backends/trt.py builds FP16 engines
        raise TrtBisectError("--backend trt verifies FP16 plans only; judge a BF16 plan on the "
                             "emulator and build it with commands.sh (--bf16, the bf16 mixed "
                             "ONNX)")
    if backend == "trt":
        from .backends.trt import trt_available
        usable, why = trt_available()
        if not usable:
            raise TrtBisectError(f"--backend trt needs TensorRT and a CUDA GPU: {why} "
                                 "(see `trtbisect env`)")
    ctx = click.get_current_context()
    ctx.meta["resume_hint"] = (f"run the same command again to resume from {out / 'journal.jsonl'}"
                               " (--no-resume starts afresh)")
    if opts.judge.precision == "both":  # outputs/both.py: one run per precision, side by side
        from .outputs.both import run_both

        with terminate_as_interrupt(), OutputDir(out).locked(), \
                Progress(quiet_level()) as progress:
            def one(model: str, o, folder: Path, name: str):
                progress.stage(f"--precision {name}: {folder}")
                return pipeline.run(model, o, folder, progress.trial, progress.stage,
                                    progress.layerwise)
            both = run_both(model, opts, out, one)
        emit_both(both, as_json)
        finish(both.exit_code)
    with terminate_as_interrupt(), OutputDir(out).locked(), Progress(quiet_level()) as progress:
        result = pipeline.run(model, opts, out, progress.trial, progress.stage, progress.layerwise)
        if backend == "trt" and result.verdict in PLAN_VERDICTS:
            progress.stage("verifying the emulator's plan with TensorRT engines")
            result = pipeline.verify_on_tensorrt(result, opts, out, progress.stage)
    emit_run(result, as_json, None if show_all else top)
    finish(result.exit_code)


def verdict_words(result, low: str) -> str:
    """The verdict line's words (rich markup), in `low` precision's name."""
    meet = result.criteria.standard
    verdicts = {"fp16_ok": f"[green]{low} already meets {meet}[/]",
                "fixed": f"[green]fixed[/] by keeping {len(result.fp32_nodes)} of "
                         f"{result.candidates} nodes{layers_words(result)} in FP32",
                "reference_invalid": "[red]the FP32 reference is already non-finite[/]",
                "reference_unstable": "[red]two FP32 runs of the model differ[/]: nothing can "
                                      "be judged against a reference that moves",
                "no_plan": f"[red]no plan meets {meet}[/]",
                "nothing_to_judge": f"[green]nothing to judge in {low}[/]: "
                                    + shown(result.nothing_to_judge or ""),
                "over_budget": f"[red]no plan within the --budget passes[/]: the best within "
                               f"it keeps {len(result.fp32_nodes)} of {result.candidates} nodes"
                               f"{layers_words(result)} in FP32 and misses {meet}",
                "fragile": f"[yellow]fragile[/]: the plan keeps {len(result.fp32_nodes)} of "
                           f"{result.candidates} nodes{layers_words(result)} in FP32 and meets "
                           f"{meet} by less than the spread of what the tools compute (see the "
                           "margins below); no plan has the margin, so it is not called fixed",
                "unvalidated": "[yellow]unvalidated[/]: "
                               + (f"the plan keeps {len(result.fp32_nodes)} of "
                                  f"{result.candidates} nodes{layers_words(result)} in FP32 and "
                                  if result.fp32_nodes else f"{low} as it is ")
                               + f"meets {meet} on the samples it was searched on, but not "
                               "on the samples it never saw (below): give more samples "
                               "(--inputs, --data-loader-script) or a criterion that fits"}
    if result.certificate is not None and result.certificate.search_noise is not None:
        # the search stopped at once on its own noise (search/noise.py)
        verdicts["fragile"] = (
            f"[yellow]fragile[/]: {meet} cannot tell plans apart near its bound (keeping more "
            "in FP32 made the error worse by as much as a plan's margin: below); the best "
            f"passing plan so far keeps {len(result.fp32_nodes)} of {result.candidates} nodes"
            f"{layers_words(result)} in FP32 and is not called fixed: a criterion that fits "
            "decides")
    if result.verdict == "partial":
        from .stages.coverage import partial_words
        verdicts["partial"] = f"[yellow]partial[/]: {shown(partial_words(result))}"
    return verdicts[result.verdict]


def emit_outputs(result, low: str, top: int | None) -> None:
    """Per output: all-low-precision's error, the plan's, and per-node rounding's."""
    if not result.errors_before:
        return
    t = Table(title="Outputs", title_justify="left")
    t.add_column("output", overflow="fold")
    t.add_column(f"all {low}")
    planned = has_plan(result)
    if planned:
        t.add_column("with the plan")
    names = list(result.errors_before)
    for name in names if top is None else names[:top]:
        t.add_row(shown(name), error_cell(result.errors_before[name]),
                  *([error_cell(result.errors_after.get(name))] if planned else []))
    out.print(t)
    if top is not None and len(names) > top:
        out.print(f"... and {plural(len(names) - top, 'more output')}: --all, or "
                  "precision.json \"errors_after\"")
    strict = result.errors_before_strict or {}
    for name, s in list(strict.items())[:top]:  # both all-FP16 verdicts (docs/semantics.md)
        judged = (escape(str(s.text)) if s.text else
                  f"max|d| {fmt(float(s.error.max_abs))}")
        out.print(f"  all {low} per node (--semantics strict), {shown(name)}: "
                  f"{'ok' if s.error.passed else 'FAIL'} {judged}")


def emit_run(result, as_json: bool, top: int | None = DEFAULT_TOP) -> None:
    """The run on stdout; `top`: rows of the grouped plan and of the diagnosis shown (None:
    all of them, and every node)."""
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return
    low = (result.precision or FP16).name.upper()  # FP16 | BF16
    out.print(f"verdict: {verdict_words(result, low)}")
    for p in result.reference_problems:
        out.print(f"  {shown(p)}")
    emit_rewrites(result, top)
    if result.culprits:
        emit_plan_groups(result, top)
        if top is None:  # --all: every node too
            emit_node_table(result)
    emit_diagnosis(result, top)
    emit_outputs(result, low, top)
    emit_margins(result)
    if result.cost and result.verdict != "reference_invalid":
        out.print(cost_line(result.cost))
    if result.search is not None:
        out.print(f"{search_words(result)}, {result.seconds:.1f}s")
    emit_samples(result)
    if result.files:
        out.print(f"plan: {shown(result.files.get('plan'))}")
        if "mixed_model" in result.files:
            out.print(f"mixed ONNX (TensorRT 11): {shown(result.files['mixed_model'])}")
        if "commands" in result.files:
            out.print(f"commands: {shown(result.files['commands'])}")
        if "annotated_model" in result.files:
            out.print(f"annotated ONNX (open in Netron): {shown(result.files['annotated_model'])}")
        if "report_html" in result.files:
            out.print(f"report: {shown(result.files['report_html'])}")


def refuse_flags(quantized: bool, precision: str) -> None:
    """A flag given on the command line that this run's road cannot honour: refused in one
    line (roads.py: the one table of every `run` flag and road)."""
    from click.core import ParameterSource

    from .roads import refusal
    ctx = click.get_current_context()
    given = [p.name for p in ctx.command.params if p.name and ctx.get_parameter_source(p.name)
             in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)]
    roads = (["quantized"] if quantized else ["fp16", "bf16"] if precision == "both"
             else ["bf16"] if precision == "bf16" else ["fp16"])
    for road in roads:
        why = refusal(road, given)
        if why:
            raise TrtBisectError(why)


def emit_margins(result) -> None:
    """The criteria that may fit better (judge/hints.py) and each output's margin against the
    spread of what the tools compute (stages/spread.py: what `fixed` rests on)."""
    from .judge.hints import hint_lines
    from .stages.spread import certificate_lines

    if result.criterion_hints:
        out.print("[yellow]the default criterion may not be what you mean[/]:")
        for line in hint_lines(result.criterion_hints):
            out.print(f"  {shown(line)}")
    for line in certificate_lines(result.certificate):
        out.print(f"  {shown(line)}")


def emit_plan_groups(result, top: int | None) -> None:
    """The plan by module (else by TensorRT layer), costliest first, `top` rows (None: all);
    outputs/plan_groups.py."""
    groups = plan_groups(result)
    diag = result.culprit_groups or []
    by_module = any(g.by_module for g in groups)
    shown_rows = groups if top is None else groups[:top]
    t = Table(title=f"Nodes to keep in FP32, by {'module' if by_module else 'TensorRT layer'}"
                    f" ({len(groups)} row{'s' if len(groups) != 1 else ''})",
              title_justify="left")
    t.add_column("module" if by_module else "layer (first node)", overflow="fold")
    t.add_column("nodes", overflow="fold")
    t.add_column("ops", overflow="fold")
    costs = any(g.share is not None for g in groups)
    if costs:
        t.add_column("cost", overflow="fold")
    t.add_column("cause", overflow="fold")
    rows: list[tuple[str, str, PlanGroup | None, list[str]]] = [
        (shown(g.label), g.nodes_text, g,
         [*([pct(g.share) if g.share is not None else ""] if costs else []),
          shown(cause_text(g, diag))]) for g in shown_rows]
    casts = boundary_row(result.cost) if costs else None
    if casts is not None:  # with the rows (and the rest line) it adds up to the slowdown
        rows.append(("(Casts)", "", None, [casts[0], ""]))
    cells = [[label, nodes, "", *rest] for label, nodes, _, rest in rows]
    # the ops cell gets what the other cells leave of the line, so that a row is one line
    others = sum(max([len(str(c.header)), *(len(r[j]) for r in cells)])
                 for j, c in enumerate(t.columns) if j != 2)
    width = None if top is None else max(OPS_WIDTH, out.width - 3 * len(t.columns) - 1 - others)
    for label, nodes, g, rest in rows:
        t.add_row(label, nodes, "boundary Casts" if g is None else shown(g.ops_text(width)),
                  *rest)
    out.print(t)
    hidden = groups[len(shown_rows):]
    if hidden:
        out.print(rest_text(hidden) + ": --top N or --all shows them")


def emit_node_table(result) -> None:
    """Every node of the plan with its layer, cost and why (`run --all`)."""
    t = Table(title="Nodes to keep in FP32", title_justify="left")
    t.add_column("node", overflow="fold")
    t.add_column("op", overflow="fold")
    modules = any(c.module for c in result.culprits)
    if modules:
        t.add_column("module", overflow="fold")
    # a fused layer is named once; its other nodes say "same layer" (a layer's name lists
    # every node it fuses, so repeating it would drown the table)
    layers = any(c.layer and c.layer != c.node for c in result.culprits)
    if layers:
        t.add_column("TensorRT layer", overflow="fold")
    price = result.cost
    shares = cost_cells(price, [(c.node, c.layer or "") for c in result.culprits])
    priced = any(shares)
    if priced:
        t.add_column("cost", overflow="fold")
    t.add_column("why", overflow="fold")
    named: set[str] = set()
    for c, share in zip(result.culprits, shares):
        layer = c.layer or c.node
        cell = "[dim]same layer[/]" if layer in named else shown(layer)
        named.add(layer)
        t.add_row(shown(c.node), shown(c.op), *([shown(c.module or "")] if modules else []),
                  *([cell] if layers else []), *([share] if priced else []), shown(c.why))
    casts = boundary_row(price) if priced else None
    if casts is not None:  # the rows add up to the plan's slowdown
        t.add_row("[dim](boundary Casts)[/]", "Cast", *([""] if modules else []),
                  *([""] if layers else []), casts[0], escape(casts[1]))
    out.print(t)


def emit_both(both, as_json: bool) -> None:
    """`run --precision both`: the two runs side by side (outputs/both.py)."""
    from .outputs.both import table

    if as_json:
        click.echo(json.dumps(both.to_json(), indent=2))
        return
    head, *rows = table(both)
    t = Table(title="FP16 and BF16, side by side", title_justify="left")
    for col in head:
        t.add_column(col, overflow="fold")
    for row in rows:
        t.add_row(*(shown(c) for c in row))
    out.print(t)
    for r in both.rows():
        out.print(f"{r.precision.upper()} plan: {shown(r.plan)}", soft_wrap=True)


def cost_line(c: CostRecord) -> str:
    """The plan's price in one line (precision.json "cost"), and what it could not price."""
    line = f"estimated engine time on {escape(c.gpu_title)}: {cost_sentence(c, True)}"
    if c.fallback:
        line += f"\n[yellow]{escape(c.fallback)}[/]"
    return line


def emit_samples(result) -> None:
    """On how many samples the plan was judged, by which criterion, and how it fared; and on
    which samples the search never saw it was validated (judge/validation.py)."""
    from .judge.validation import line as validation_line

    judged = result.judged
    after = judged.shown if judged is not None else None
    if after is None:
        return
    which = "the plan" if judged.after is not None else "all FP16"
    failed = [k for k, ok in enumerate(after.samples) if not ok]
    failing = ", ".join(map(str, failed[:10])) + (", ..." if len(failed) > 10 else "")
    search = judged.search_samples
    crit = result.criteria_record
    out.print(f"judged on {len(after.samples)} sample(s) by "
              f"{escape(crit.description if crit is not None else '')}: "
              f"{which} passes on {sum(after.samples)} (needs {after.required})"
              + (f"; fails on sample(s) {failing}" if failed else "")
              + (f"; the search judged on {len(search)} of them" if search else "")
              + (f"; {shown(said)}" if (said := validation_line(result.validation)) else ""),
              soft_wrap=True)


REFUSALS_SHOWN = 3  # rewrite refusals on the console unless --all


def emit_rewrites(result, top: int | None = DEFAULT_TOP) -> None:
    """The FP16-safe rewrites applied (what, where, FP32 drift), and how many were refused."""
    rw = result.rewrites  # rewrites/driver.RewritesRecord
    for a in rw.applied if rw is not None else []:
        where = a.where[0] if len(a.where) == 1 else f"{a.where[0]} .. {a.where[-1]}"
        out.print(f"rewrite [bold]{shown(a.rewrite)}[/] at {shown(where)}: {shown(a.why)} "
                  f"(FP32 drift {a.drift.rel:.2g} of the output range)", soft_wrap=True)
    refused = rw.refused if rw is not None else []
    shown_refused = refused if top is None else refused[:REFUSALS_SHOWN]
    for r in shown_refused:  # the diagnosis says which of its fixes they are
        where = r.where[0] if r.where else "?"
        out.print(f"rewrite {shown(r.rewrite)} refused at {shown(where)}: "
                  f"{shown(r.reason)}", soft_wrap=True)
    if len(refused) > len(shown_refused):
        out.print(f"... and {plural(len(refused) - len(shown_refused), 'more refusal')}: "
                  "--all, or precision.json \"rewrites\"")


def emit_diagnosis(result, top: int | None = DEFAULT_TOP) -> None:
    """One sentence per kind of culprit group (cause, pattern: numbered as the plan table's
    cause column numbers them; the first group of a kind speaks for the others), at most
    `top` of them (None: every group, identical ones folded), then any stability flags."""
    groups = result.culprit_groups or []
    keys = ("cause", "pattern", "summary") if top is None else ("cause", "pattern")  # kinds
    folded = fold_groups(groups, keys)
    for k, (g, count) in enumerate(folded[:top] if top is not None else folded, 1):
        pattern = f", {g.pattern}" if g.pattern else ""
        times = (f" (x{count} identical groups)" if top is None else
                 f" (x{count} groups; the first of them)") if count > 1 else ""
        out.print(f"[bold]{k}. {shown(g.cause)}{shown(pattern)}{times}[/]: "
                  f"{shown(g.summary)}")
    if top is not None and len(folded) > top:
        out.print(f"... and {len(folded) - top} more kinds of cause: --all, or report.html")
    stab = result.stability
    if stab:
        flags = stab.flags or ["no plan flips or sits within the noise"]
        out.print(f"stability ({stab.runs} runs x {stab.samples} sample(s)): "
                  + shown("; ".join(flags)))


def fold_groups(groups: Sequence[CulpritGroup],
                keys: tuple[str, ...] = ("cause", "pattern", "summary"),
                ) -> list[tuple[CulpritGroup, int]]:
    """Culprit groups alike in `keys` (their attributes), once each (the first) with a count:
    by default those whose paragraph would read the same; ("cause", "pattern"): one per kind
    of cause."""
    folded: dict[tuple, list] = {}
    for g in groups:
        folded.setdefault(tuple(getattr(g, k) for k in keys), [g, 0])[1] += 1
    return [(g, n) for g, n in folded.values()]


@main.command(epilog=COMPARE_EXIT_CODES)
@click.argument("model")
@input_options
@verbosity_options
@click.option("--top", type=click.IntRange(min=0), default=15, show_default=True,
              help="Rows to show (sorted by graph order).")
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
    with Progress(quiet_level() + int(as_json)) as progress:  # --json: stdout is for machines
        found = pipeline.compare(model, opts, progress.stage, progress.layerwise)
    if as_json:
        click.echo(json.dumps(found.to_json(), indent=2))
        return
    if found.nothing:
        out.print(f"nothing to compare: {shown(found.nothing)}")
        return
    low, stats, summary, judged = found.precision, found.stats, found.summary, found.judged
    stored = int(summary["tensors"])  # type: ignore[call-overload]
    t = Table(title=f"FP32 vs all-{low.label}: {stored} stored tensors and "
                    f"{len(stats) - stored} graph input(s)", title_justify="left")
    for col in ("tensor", "producer", "FP32 max|x|", "rel err", "non-finite", "overflow", "flushed"):
        t.add_column(col, overflow="fold")
    flagged = [s for s in stats.values() if s.overflow or s.new_nonfinite or s.flushed
               or s.fp32_absmax > low.max]
    rows = flagged[:top] if flagged else sorted(stats.values(), key=lambda s: -s.rel_err)[:top]
    for s in rows:
        t.add_row(shown(s.name), shown(s.producer or "(input)"), fmt(s.fp32_absmax),
                  rel_cell(s.rel_err, max(s.fp16_nonfinite - s.fp32_nonfinite, 0)),
                  str(s.fp16_nonfinite), str(s.overflow), str(s.flushed))
    out.print(t)
    for key, label in (("first_nonfinite", f"first non-finite in {low.label}"),
                       ("first_overflow", f"first value beyond {low.max_text}"),
                       ("first_jump", "error first jumps at")):
        if summary.get(key):
            out.print(f"{label}: {shown(summary[key])}")
    if judged is not None:  # the run's criteria, on the all-FP16 outputs
        out.print(f"all {low.label} under {shown(opts.judge.criteria.describe())}: "
                  f"{'[green]pass[/]' if judged.passed else '[red]FAIL[/]'} on "
                  f"{sum(judged.samples)} of {len(judged.samples)} sample(s)", soft_wrap=True)
        for name, e in judged.errors.items():
            out.print(f"  {shown(name)}: {error_cell(e)}", soft_wrap=True)


@main.command(epilog=CHECK_EXIT_CODES)
@click.argument("mixed")
@click.option("--reference", required=True, help="The FP32 ONNX model to compare against.")
@input_options
@verbosity_options
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
    from .quant import is_quantized_file

    if is_quantized_file(mixed):  # a Q/DQ file: judged as `run` judges one (trtbisect/quant/)
        from .quant.console import check_and_emit
        finish(check_and_emit(mixed, reference, make_options(kw), as_json))
    if click.get_current_context().get_parameter_source("precision") is \
            click.core.ParameterSource.DEFAULT:  # the file says which (judge/precision.py)
        from .graph import load_model
        from .judge.precision import of_file
        kw["precision"] = of_file(load_model(mixed)) or kw["precision"]
    kw_precision = kw.get("precision")
    result = pipeline.check_mixed(mixed, reference, make_options(kw))
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        out.print(f"{'[green]pass[/]' if result.passed else '[red]fail[/]'}: {shown(mixed)} "
                  f"({result.half_tensors} {'bfloat16' if kw_precision == 'bf16' else 'float16'}"
                  f" tensors, {result.samples} sample(s))",
                  soft_wrap=True)
        for name, e in result.errors.items():
            out.print(f"  {shown(name)}: {error_cell(e)}", soft_wrap=True)
        if result.unjudged:
            out.print("  [yellow]judged in part only[/]: not rounded (run in FP32): " + shown(
                ", ".join(f"{c.op} x{len(c.nodes)}" for c in result.unjudged)), soft_wrap=True)
    finish(result.exit_code)


@main.command(epilog=ENV_EXIT_CODES)
@verbosity_options
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def env(as_json: bool) -> None:
    """List which backends and optional components are usable here, and why not.

    \b
    Example:
      trtbisect env
    """
    from .backends.trt import backend_status

    rows = backend_status() + optional_components()
    if as_json:
        click.echo(json.dumps([{"component": c, "usable": u, "detail": d} for c, u, d in rows],
                              indent=2))
        return
    t = Table(title="Backends and components", title_justify="left")
    for col in ("component", "usable", "detail"):
        t.add_column(col, overflow="fold")
    for component, usable, detail in rows:
        t.add_row(component, "[green]yes[/]" if usable else "[red]no[/]", shown(detail))
    out.print(t)


OPTIONAL = {  # module -> (distribution, what it is for, how to install)
    "matplotlib": ("matplotlib", "run --report", "pip install 'trtbisect[report]'"),
    "polygraphy": ("polygraphy", "the rendered Polygraphy commands",
                   "pip install polygraphy==0.53.6"),
    "modelopt.onnx.autocast": ("nvidia-modelopt", "the rendered AutoCast commands",
                               "pip install --no-deps nvidia-modelopt==0.47.0 && pip install "
                               "'trtbisect[quant]' (docs/quantization.md)"),
    "onnxscript": ("onnxscript", "export with torch's dynamo exporter",
                   "pip install onnxscript"),
}


def optional_components() -> list[tuple[str, bool, str]]:
    """(component, usable, detail) for optional packages torch/tensorrt/cuda rows omit."""
    from importlib import metadata

    from .quant.ptq import status

    rows = [("ModelOpt ONNX PTQ", *status())]
    for module, (dist, purpose, hint) in OPTIONAL.items():
        try:
            importlib.import_module(module)
            rows.append((dist, True, f"{dist} {metadata.version(dist)}, for {purpose}"))
        except Exception as exc:  # an optional import may fail in many ways; say which
            rows.append((dist, False, f"{type(exc).__name__}: {exc}; for {purpose}: {hint}"))
    return rows


def entry() -> None:  # pragma: no cover - console script shim
    usable_streams()  # before click can print anything
    main()


if __name__ == "__main__":  # pragma: no cover
    main()
