"""The terminal: stdout for results and stderr for progress and logs, model names shown escaped,
exit with the verdict's code, SIGTERM as an interruption. Shared by every command module
(cli.py, cli_torch.py, quant/console.py), which import it and not one another."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

import click
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.status import Status

from .base.escape import VisibleLog, shown_text
from .errors import EXIT_SIGPIPE
from .judge.compare import OutputError

log = logging.getLogger("trtbisect")


err = Console(stderr=True)


class _Stdout(Console):
    """Results on stdout; a reader that left early (`| head`) ends the run with 141, as a
    Unix tool killed by SIGPIPE (rich would exit 1, our code for bugs)."""

    def on_broken_pipe(self) -> None:
        pipe_closed()


out = _Stdout()


def exit_codes(*rows: tuple[int, str]) -> str:
    """A command's own exit-code table for its --help epilog."""
    return "\b\nExit codes:\n" + "".join(f"  {code}  {text}\n" for code, text in rows)


USAGE = (2, "usage or input error (bad option, missing file, malformed ONNX, mismatched inputs,\n       a --check hook or data loader that fails, an --out that cannot be written or\n       is in use by another run, inputs past --max-samples/--max-input-bytes/\n       --max-spool-bytes, an FP32 reference past --eval-timeout)")


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C but with its own exit code."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def pipe_closed() -> NoReturn:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(EXIT_SIGPIPE)


def finish(code: int) -> NoReturn:
    """Exit with `code` once stdout is delivered; a reader that left early (`| head`) gives
    141, as for a Unix tool killed by SIGPIPE, never an unexplained 1."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        pipe_closed()
    sys.exit(code)


def fail(message: str, code: int) -> NoReturn:
    err.print(f"[bold red]error:[/] {shown(message)}", highlight=False, soft_wrap=True)
    sys.exit(code)


def shown(text: object) -> str:
    """A model-controlled string for a rich console: control characters, escape sequences and
    bidi overrides shown escaped (base/escape.py), rich markup escaped. Every table cell and
    line that shows a name goes through it. A name of absurd length is shortened
    (`shortened`: precision.json keeps it whole)."""
    return escape(shown_text(text))


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises Terminated (exit 143) so that `run` stops the way Ctrl-C does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def usable_streams() -> bool:
    """stdout and stderr that cannot fail the run: a closed one (`>&-`: Python sets it to None)
    writes to /dev/null, and one whose encoding cannot show a character (PYTHONIOENCODING=ascii,
    a C locale without UTF-8) shows it escaped (`\xe9`) instead of raising. True when stdout
    was closed."""
    closed = False
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))
            closed = closed or name == "stdout"
        elif (getattr(stream, "encoding", None) or "utf-8").lower().replace("_", "-") not in (
                "utf-8", "utf8") and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # pragma: no cover - a stream that cannot change
                pass
    return closed


def configure_logging(verbose: int, quiet: int) -> None:
    level = logging.WARNING + 10 * (quiet - verbose)
    handler = RichHandler(console=err, show_time=False, show_path=False)
    handler.addFilter(VisibleLog())  # a name in a log line cannot drive the terminal
    logging.basicConfig(level=max(level, logging.DEBUG), format="%(message)s", force=True,
                        handlers=[handler])


def _more_verbosity(ctx: click.Context, param: click.Parameter, value: int) -> int:
    """-v/-q given after the subcommand add to those given before it."""
    if value:
        meta = ctx.find_root().meta
        meta[param.name] = meta.get(param.name, 0) + value
        configure_logging(meta.get("verbose", 0), meta.get("quiet", 0))
    return value


def verbosity_options(f: Callable) -> Callable:
    """-v/-q accepted after the subcommand too (`trtbisect run m.onnx -v`)."""
    f = click.option("-q", "--quiet", count=True, expose_value=False, callback=_more_verbosity,
                     help="Less on stderr (-q: no progress, -qq: errors only).")(f)
    return click.option("-v", "--verbose", count=True, expose_value=False,
                        callback=_more_verbosity,
                        help="More detail on stderr (-vv for every evaluation).")(f)


def quiet_level() -> int:
    return click.get_current_context().find_root().meta.get("quiet", 0)


class Progress:
    """Progress on stderr, in Polygraphy's style (`Evaluation 3 | ... | ~4 remaining`): a live
    status line on a terminal; without one (CI logs, pipes) plain lines, every stage change and
    at most one other line per `interval` seconds."""

    def __init__(self, quiet: int, console: Console | None = None, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.quiet, self.console, self.interval, self.clock = quiet, console or err, interval, clock
        self.status: Status | None = None
        self.last = float("-inf")

    def __enter__(self) -> Progress:
        if not self.quiet and self.console.is_terminal:
            self.status = self.console.status("starting")
            self.status.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.status is not None:
            self.status.__exit__(*exc)

    def show(self, msg: str, force: bool = False) -> bool:
        """Update the status line, or print a plain line; True when a line was printed."""
        if self.quiet:
            return False
        if self.status is not None:
            self.status.update(shown(msg))
            return False
        now = self.clock()
        if force or now - self.last >= self.interval:
            self.console.print(shown_text(msg), markup=False, highlight=False, soft_wrap=True)
            self.last = now
            return True
        return False

    def stage(self, msg: str) -> None:
        if not self.show(msg, force=True):
            log.info(msg)

    def layerwise(self, done: int, total: int) -> None:
        """Counted progress of the layer-wise comparison (tensors compared so far)."""
        self.show(f"layer-wise comparison | {done}/{total} tensors", force=done >= total)

    def trial(self, trial, remaining: int) -> None:
        msg = (f"Evaluation {trial.index} | {trial.phase} | {len(trial.fp32)} nodes FP32 | "
               f"{'pass' if trial.passed else 'fail'} | ~{remaining} remaining")
        self.show(msg)  # the search logs every evaluation itself at -vv


def fmt(x: float) -> str:
    return f"{x:.3g}"


def error_cell(e: OutputError | None) -> str:
    if e is None:
        return "-"
    mark = "[green]ok[/]" if e.passed else "[red]FAIL[/]"
    extra = f", {e.nonfinite} non-finite" if e.nonfinite else ""
    if e.scores:  # judged by other criteria than the default (judge/criteria.py)
        on = f" (sample {e.sample})" if e.sample is not None else ""
        return f"{mark} " + escape(e.scores_text) + on + extra
    return f"{mark} {escape(e.max_text(fmt))}{extra}"


def rel_cell(rel: float, nonfinite: int = 0) -> str:
    """A relative error a person can read: inf/NaN said as such, absurd ratios capped."""
    if nonfinite:
        return f"inf/NaN ({nonfinite})"
    if rel != rel or rel == float("inf"):
        return "inf"
    return ">1e3 (FP32 ~0 or blown up)" if rel > 1e3 else fmt(rel)
