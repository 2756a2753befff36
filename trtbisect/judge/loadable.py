"""A written ONNX file holds outside the run: it passes the ONNX checker's full check (shape and
type inference through every subgraph) and ONNX Runtime loads it.

The emulator judges a graph it derives from a file, and that derivation forgives what no
runtime does (an If whose branches disagree on a type, a value with no type). So every file
trtbisect writes is checked here after it is written, and `check` refuses a file that fails
before judging it: a file no runtime loads is never judged `pass`.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import onnx

from ..base import child
from ..errors import TrtBisectError

log = logging.getLogger(__name__)

# ONNX Runtime loads a copy of the weights; above this many bytes of them only the checker runs
# (a second copy of gigabytes of weights for a load test would break the memory promise)
ORT_LOAD_LIMIT = 2 << 30


_MARK = re.compile(r"\[(?:Type|Shape)InferenceError\]|\[ValidationError\]")
_NODE = re.compile(r"node name: ([^)]*)\)")


def first_error(exc: BaseException) -> str:
    """The first error of a checker or ORT message, at its innermost node, on one line (the
    checker nests a subgraph's errors in its holder's, and lists consequences after them)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    for m in _MARK.finditer(text):
        rest = text[m.end():].strip(" :")
        if rest.startswith("Inference error(s)"):
            continue  # a holder: its first own error is further in
        rest = re.split(r" \(op_type:", rest, maxsplit=1)[0].strip()
        nodes = _NODE.findall(text[:m.start()])
        text = f"{nodes[-1]}: {rest}" if nodes else rest
        break
    return text[:400] + ("..." if len(text) > 400 else "")


def checker_problem(path: str | Path) -> str | None:
    """The first error of the ONNX checker's full check of `path`, or None."""
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:  # the checker raises several types (ValidationError, InferenceError)
        return f"onnx.checker: {first_error(exc)}"
    return None


def runtime_problem(path: str | Path, weight_bytes: int | None = None) -> str | None:
    """ONNX Runtime's refusal to load `path` with its optimizations off, or None (also when
    the weights are too large to load a second copy of)."""
    if weight_bytes is not None and weight_bytes > ORT_LOAD_LIMIT:
        return None
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises several unrelated types for unloadable models
        if "Could not find an implementation" in str(exc) and _holds_bfloat16(path):
            # the graph resolved (types and shapes check out); the CPU provider only lacks a
            # bfloat16 kernel (TensorRT has them): it is still not a load
            return f"onnxruntime: no CPU kernel for bfloat16: {first_error(exc)}"
        return f"onnxruntime: {first_error(exc)}"
    return None


def _holds_bfloat16(path: str | Path) -> bool:
    m = onnx.load(str(path), load_external_data=False)
    return any(t.data_type == onnx.TensorProto.BFLOAT16 for t in m.graph.initializer) or any(
        n.op_type == "Cast" and any(a.name == "to" and a.i == onnx.TensorProto.BFLOAT16
                                    for a in n.attribute) for n in m.graph.node)


def bfloat16_gap(why: str | None) -> bool:
    """The checker's or ONNX Runtime's refusal is only that this opset's schema of an op does
    not list bfloat16 (Conv lists it from opset 22 only, Pow from 15). A BF16 file for
    TensorRT is then still the graph TensorRT builds; no ONNX tool at that opset takes it."""
    return why is not None and ("unsupported type: tensor(bfloat16)" in why
                                or ("Type 'tensor(bfloat16)'" in why and "is invalid" in why)
                                or "no CPU kernel for bfloat16" in why)


BF16_GAP = ("no ONNX tool loads it as written: this opset's schemas (or ONNX Runtime's CPU "
            "kernels) predate bfloat16 for that op, and nothing here has built it with "
            "TensorRT; what trtbisect judges is its emulation (float32 compute, every bfloat16 "
            "rounding made explicit), which loads")


@dataclass(frozen=True)
class InputCheck:
    """What a run's written copies are held to, found where the run reads its model
    (context.prepare: `Context.input_check`) and handed to every writer as data: a copy of a
    model that itself fails the checker's full check, which ONNX Runtime runs, is held to
    loading in ONNX Runtime instead. `path`: the input model (None: no input, the full check).

    The input's own check runs at most once per record, and only when a written file fails
    (a full check costs a shape inference over the whole model); one run's record is never
    another's.
    """

    path: Path | None = None

    @functools.cached_property
    def problem(self) -> str | None:
        """The input model's own first checker error, or None (it passes)."""
        return None if self.path is None else checker_problem(self.path)


def require_written_valid(path: str | Path, weight_bytes: int | None = None,
                          held: InputCheck | None = None, load: bool = True) -> None:
    """A file trtbisect wrote passes the checker's full check and loads in ONNX Runtime;
    else a one-line TrtBisectError that says the fault is trtbisect's.

    Two exceptions, warned about: a BF16 file at an opset whose schema of some op does not
    list bfloat16 (`bfloat16_gap`); and a copy of an input model that fails the
    checker itself (`held`: the run's record of its input; None: no input to forgive),
    which ONNX Runtime runs: the copy must then load in ONNX Runtime.

    `load=False`: the checker's full check alone, for a file judged before it is known to be
    kept (the all-FP16 file that fails is never an output; loading a 20k-node FP16 file in ONNX
    Runtime costs about as much as judging it: its CPU provider wraps every FP16 node in Casts
    and then removes the duplicates); the caller loads it once it is kept.

    `WrittenCheck` is the same check with ONNX Runtime's load in a child process beside the
    caller's own work."""
    why = checker_problem(path)
    if not load and (why is None or bfloat16_gap(why)):
        return
    _settle(path, why, held, functools.partial(runtime_problem, path, weight_bytes))


def _settle(path: str | Path, why: str | None, held: InputCheck | None,
            runtime: Callable[[], str | None]) -> None:
    """`require_written_valid` once the checker said `why`; `runtime`: ONNX Runtime's answer,
    asked only where it decides."""
    if why is not None and not bfloat16_gap(why) and held is not None \
            and held.problem is not None:
        loaded = runtime()  # the load is tried before it is said
        if loaded is None:
            log.warning("%s fails %s, as the model given does (%s); ONNX Runtime loads it",
                        Path(path).name, why, held.problem)
            return
        why = loaded
    why = why or runtime()
    if bfloat16_gap(why):
        log.warning("%s: %s: %s", Path(path).name, why, BF16_GAP)
        return
    if why is not None:
        raise TrtBisectError(f"trtbisect wrote {Path(path).name}, which fails {why} (a bug in "
                             "trtbisect: please report it with the model)")


def _decided_by_checker(why: str | None, held: InputCheck | None) -> bool:
    """The checker's refusal alone decides (`_settle` asks ONNX Runtime nothing)."""
    return why is not None and not bfloat16_gap(why) and (held is None or held.problem is None)


# Test hook: set, the child that loads a written file exits at once with this code, without an
# answer (tests/judge/test_loadable.py: a child that dies is a failed load). Never set in use.
DIE_ENV = "TRTBISECT_TEST_LOAD_CHECK_DIES"


def _load_in_child(conn, path: str, weight_bytes: int | None) -> None:
    """The child's side of `LoadCheck`: `STARTED`, then `runtime_problem`'s answer, sent down
    `conn`. Whatever ends it otherwise (an import that fails) is an answer too, on one line."""
    import os

    conn.send(STARTED)  # the process runs: from here a death is the load's
    code = os.environ.get(DIE_ENV)
    if code:
        os._exit(int(code))
    try:
        answer = runtime_problem(path, weight_bytes)
    except BaseException as exc:  # noqa: BLE001 - the parent reports it as the load's failure
        answer = f"onnxruntime: {first_error(exc)}"
    try:
        conn.send(answer)
    finally:
        conn.close()


_PENDING = object()
# the child's first word: it runs this module's code. A child that ends before it never
# reached the load (spawn could not start it: a main module it cannot import again, such as a
# script read from stdin), and the load runs here instead, with the same answer
STARTED = "started"


class LoadCheck:
    """`runtime_problem(path, weight_bytes)`, asked of a spawned child process from the moment
    this is made, so that ONNX Runtime's load of a written file (27 s for a 20k-node FP16
    transformer: ORT wraps every FP16 node in Casts) runs on another core beside the judge's
    own sessions (a thread would not: a session build holds the GIL). `answer()` waits for it:
    the same string, or None, as `runtime_problem` returns; a child that dies without one is a
    failed load, said on one line (one that dies before it starts, as spawn's own failure to
    import a main module read from stdin, is not: the load then runs here). `close()` (or
    leaving `with`) ends the child whatever happened: nothing is left running. Where no child
    can be started (a daemonic worker, or the system refuses one), the load runs here when its
    answer is asked."""

    def __init__(self, path: str | Path, weight_bytes: int | None = None, in_child: bool = True):
        self.path, self.weight_bytes = str(path), weight_bytes
        self._answer: object = _PENDING
        self._proc = None
        self._conn = None
        if weight_bytes is not None and weight_bytes > ORT_LOAD_LIMIT:
            self._answer = None  # runtime_problem's own rule: no second copy is loaded
            return
        if not in_child:  # a small file (base/child.py CHILD_NODES): the load is quick
            return
        got = child.start(_load_in_child, (self.path, weight_bytes), "trtbisect-load-check",
                          why="the load check")
        if got is not None:  # else no child to be had: the load runs here, when asked
            self._proc, self._conn = got

    def answer(self) -> str | None:
        """ONNX Runtime's refusal to load the file, or None; waits for the child."""
        if self._answer is _PENDING:
            if self._proc is None:
                self._answer = runtime_problem(self.path, self.weight_bytes)
            else:
                started = False
                try:
                    assert self._conn is not None
                    started = self._conn.recv() == STARTED
                    self._answer = self._conn.recv()
                except (EOFError, OSError):
                    self._proc.join()
                    self._answer = ("onnxruntime: the process loading it ended without an "
                                    f"answer (exit code {self._proc.exitcode})")
                finally:
                    self.close()
                if not started:  # the child never ran: the load runs here
                    log.info("the load check ran in this process: its child did not start")
                    self._answer = runtime_problem(self.path, self.weight_bytes)
        return self._answer  # type: ignore[return-value]

    def close(self) -> None:
        """End the child (if it still runs) and wait for it."""
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        child.end(proc, conn)

    def __enter__(self) -> LoadCheck:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class WrittenCheck:
    """`require_written_valid(path, weight_bytes, held)` in two halves, for a file written to
    be judged at once: ONNX Runtime's load starts in a child process (`LoadCheck`) and the
    checker's full check runs here, raising at once where the checker alone decides (as
    `require_written_valid` does, before anything is judged); `require()` waits for the load
    and says what `require_written_valid` says, in the same words. `guard()`: around the
    caller's work meanwhile, an error raised in it is preceded by the file's own (a file that
    does not load is reported as such, as when the load came first). Used as a context
    manager, or closed: the child never outlives it."""

    def __init__(self, path: str | Path, weight_bytes: int | None = None,
                 held: InputCheck | None = None, in_child: bool = True):
        self.path, self.held = Path(path), held
        self.loading = LoadCheck(path, weight_bytes, in_child)
        self._done = False
        try:
            self.why = checker_problem(path)
            if _decided_by_checker(self.why, held):
                self.require()
        except BaseException:
            self.close()
            raise

    def require(self) -> None:
        """The file's verdict: returns, warns, or raises require_written_valid's error."""
        if self._done:
            return
        try:
            _settle(self.path, self.why, self.held, self.loading.answer)
        finally:
            self.close()
        self._done = True

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Run the caller's work beside the load; an Exception in it: the file's own error
        first, if it has one, else the Exception as it was."""
        try:
            yield
        except Exception:
            try:
                self.require()
            except TrtBisectError as own:
                raise own from None
            raise

    def close(self) -> None:
        self.loading.close()

    def __enter__(self) -> WrittenCheck:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def require_loadable(path: str | Path, weight_bytes: int | None = None) -> str | None:
    """A file given to `check`: ONNX Runtime must load it as it is (else a one-line
    TrtBisectError naming the first checker error too). Returns, as the line to warn with,
    what the checker says of a file ONNX Runtime loads all the same (a warning, not a refusal:
    TensorRT's parser and ONNX Runtime are what run it), or, for a file ONNX Runtime refuses
    only for bfloat16 (`bfloat16_gap`), that no ONNX tool loads it and what is judged instead:
    never a load that did not happen. None: it passes both."""
    checker = checker_problem(path)
    runtime = runtime_problem(path, weight_bytes)
    if runtime is not None and not bfloat16_gap(runtime):
        raise TrtBisectError(f"{path} does not load: {checker or runtime}")
    if runtime is not None:
        return f"{path} fails {checker or runtime}: {BF16_GAP}"
    if checker is not None and bfloat16_gap(checker):
        return (f"{path} fails {checker}: the checker's schemas at this opset predate "
                "bfloat16 for that op; ONNX Runtime loads it, so it is judged as it is")
    if checker is not None:
        return f"{path} fails {checker}; ONNX Runtime loads it, so it is judged as it is"
    return None
