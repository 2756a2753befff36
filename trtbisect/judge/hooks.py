"""`--check FILE.py:FUNCTION`: the user's own judgement of a sample.

The function is loaded in this process (it is trusted code, like Polygraphy's
`--data-loader-script`) and called once per sample and plan as
`FUNCTION(fp32, candidate, sample)`: three dicts of numpy arrays (the FP32 reference outputs,
the candidate's outputs, the sample's inputs), each a read-only copy: a hook that sets the
`writeable` flag back changes only its own copy, never what the next plan is judged on. It returns a bool, or a
(bool, number) pair whose number is a score the report shows. Anything else, or an exception,
is bad input: one line, exit 2, and no verdict is recorded for the plan it was judging.

Whatever the user's code prints goes to stderr (`user_code`): stdout is the results' (`--json`
is one JSON document), in this process and on every worker.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import math
import numbers
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TrtBisectError
from .criteria import Score

HOOK_HELP = ("Your own judgement of a sample: FILE.py:FUNCTION (default function: check), "
             "called per sample as FUNCTION(fp32, candidate, sample) with dicts of numpy "
             "arrays (FP32 outputs, the candidate's outputs, the inputs); it returns a bool or "
             "(bool, score). Runs in this process: trusted code only. See docs/criteria.md.")
DEFAULT_FUNCTION = "check"


class HookError(TrtBisectError):
    """The user's --check function could not be loaded, raised, or returned garbage."""


@dataclass(frozen=True)
class Hook:
    spec: str  # as given: FILE.py[:FUNCTION]
    path: str
    function: str
    sha256: str  # of the file: a resumed run must judge with the same code
    fn: Callable[..., Any] = field(compare=False, repr=False)

    def score(self, ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray],
              sample: Mapping[str, np.ndarray]) -> Score:
        try:
            with user_code():
                out = self.fn(_frozen(ref), _frozen(got), _frozen(sample))
        except (Exception, SystemExit) as exc:  # the user's code: anything may come out
            raise HookError(f"--check {self.spec} raised {type(exc).__name__}: "
                            f"{_one_line(exc)}") from None
        passed, value = self._verdict(out)
        return Score("check", None, value, math.nan, passed)

    def _verdict(self, out: Any) -> tuple[bool, float]:
        if isinstance(out, (bool, np.bool_)):
            return bool(out), math.nan
        if (isinstance(out, (tuple, list)) and len(out) == 2
                and isinstance(out[0], (bool, np.bool_)) and _real(out[1])):
            return bool(out[0]), _float(out[1])
        raise HookError(f"--check {self.spec} returned {_shown(out)}; it must return a bool "
                        "or a (bool, number) pair")

    def fingerprint(self) -> dict:
        return {"function": self.function, "sha256": self.sha256}


def _real(x: Any) -> bool:
    return isinstance(x, (numbers.Real, np.integer, np.floating)) and not isinstance(
        x, (bool, np.bool_))


def _float(x: Any) -> float:
    """A score as a float; one beyond float's range (an int of 10**400) is +-inf, as a float
    computation would have made it."""
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def _shown(x: Any) -> str:
    text = repr(x)
    return f"{type(x).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or "(no message)"


def _frozen(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Read-only copies in a fresh dict. Not views: a view's `writeable` flag can be set back
    (through it or its `.base`) and the array under it written; a copy is the hook's alone.
    Read-only still, so that an accidental write is the one-line error it always was."""
    out = {}
    for k, v in arrays.items():
        copy = np.array(v, copy=True)
        copy.flags.writeable = False
        out[k] = copy
    return out


@contextlib.contextmanager
def user_code() -> Iterator[None]:
    """Around a user's hook or data loader: what it prints goes to stderr, never into the
    results on stdout."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def split_spec(spec: str, default: str) -> tuple[str, str]:
    """`FILE.py[:FUNCTION]` (a ':' inside the path stays the path's when nothing follows the
    last one that looks like a Python name)."""
    drive, rest = os.path.splitdrive(spec)
    path, sep, func = rest.rpartition(":")
    if sep and func.isidentifier():
        return drive + path, func
    return spec, default


def load_function(spec: str, flag: str, default: str) -> tuple[Callable[..., Any], str, str, str]:
    """Import FILE.py as a fresh module and return (function, path, name, sha256)."""
    path, name = split_spec(spec, default)
    file = Path(path)
    if not file.is_file():
        raise HookError(f"{flag} {spec}: no such file {path!r}")
    data = file.read_bytes()
    module_name = f"_trtbisect_user_{hashlib.sha256(str(file.resolve()).encode()).hexdigest()[:12]}"
    where = str(file.resolve().parent)
    sys.path.insert(0, where)  # the file may import its neighbours, as a script would
    try:
        loader = importlib.util.spec_from_file_location(module_name, file)
        if loader is None or loader.loader is None:
            raise HookError(f"{flag} {spec}: {path} is not a Python file")
        module = importlib.util.module_from_spec(loader)
        with user_code():
            loader.loader.exec_module(module)
    except HookError:
        raise
    except (Exception, SystemExit) as exc:
        raise HookError(f"{flag} {spec}: importing {path} failed with {type(exc).__name__}: "
                        f"{_one_line(exc)}") from None
    finally:
        if where in sys.path:
            sys.path.remove(where)
    fn = getattr(module, name, None)
    if fn is None:
        raise HookError(f"{flag} {spec}: {path} defines no {name!r}")
    if not callable(fn):
        raise HookError(f"{flag} {spec}: {name!r} in {path} is not a function")
    return fn, path, name, hashlib.sha256(data).hexdigest()


def load_hook(spec: str) -> Hook:
    fn, path, name, sha = load_function(spec, "--check", DEFAULT_FUNCTION)
    return Hook(spec, path, name, sha, fn)
