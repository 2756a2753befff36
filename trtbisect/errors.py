"""One user-facing error type; the CLI turns it into a one-line message and an exit code."""

from __future__ import annotations

import importlib
from types import ModuleType

# Exit codes, documented in `trtbisect --help` and the README.
EXIT_OK = 0
EXIT_INTERNAL = 1  # a bug: the traceback is shown
EXIT_USAGE = 2  # bad arguments or bad input (missing file, malformed model, mismatched inputs)
EXIT_REFERENCE_INVALID = 3  # the FP32 reference itself is non-finite
EXIT_NO_PLAN = 4  # no precision plan meets the tolerance
EXIT_PARTIAL = 5  # the judged part passes, but the emulator could not round every node
EXIT_OVER_BUDGET = 6  # --budget: no plan within the slowdown budget meets the tolerance
EXIT_FRAGILE = 7  # the plan passes, but by less than the spread of what the tools compute
EXIT_REFERENCE_UNSTABLE = 8  # two FP32 runs differ (random ops): nothing can be judged
EXIT_UNVALIDATED = 9  # the plan passes its search samples but fails the unseen ones
EXIT_SIGINT, EXIT_SIGTERM, EXIT_SIGPIPE = 130, 143, 141  # as a Unix tool killed by the signal


class TrtBisectError(Exception):
    """A problem the user can fix; the message says what to do next."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def require(module: str, hint: str) -> ModuleType:
    """Import an optional dependency or fail with an install hint."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise TrtBisectError(f"{module} is not installed ({exc}); {hint}") from exc


def first_line(exc: BaseException) -> str:
    """An exception's first line (onnx and protobuf errors run to pages), or its type's name."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
