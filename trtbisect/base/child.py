"""A spawned child process that does one job beside the run (judge/loadable.py's load check,
backends/ort.py's certificate references): ending it on every way out."""

from __future__ import annotations

import logging
import multiprocessing as mp
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

log = logging.getLogger(__name__)

# A graph of this many nodes builds an ONNX Runtime session for seconds (a 20k-node FP16 file:
# 27 s), more than a spawned child costs to start (importing onnxruntime: about a second):
# from here on a written file's load check and the certificate's FP32 references run in one.
CHILD_NODES = 4000


def worth_a_child(nodes: int) -> bool:
    """Whether a graph of `nodes` nodes pays for a child process beside the judge."""
    return nodes >= CHILD_NODES


def start(target: Callable[..., None], args: tuple, name: str, duplex: bool = False,
          why: str = "") -> tuple[BaseProcess, Connection] | None:
    """A spawned daemonic child running `target(conn, *args)` and this side's end of the pipe
    (`duplex`: both ways; else the child only sends). Never forked: a fork copies ONNX
    Runtime's threads and memory. None where no child can be had (a daemonic process may have
    none, or the system refuses one): the caller does the work here; `why` names it in the
    log then."""
    if mp.current_process().daemon:
        return None
    spawn = mp.get_context("spawn")
    mine, theirs = spawn.Pipe(duplex=duplex)
    try:
        proc = spawn.Process(target=target, args=(theirs, *args), name=name, daemon=True)
        proc.start()
    except OSError as exc:
        log.info("%s runs in this process: %s", why or name, exc)
        mine.close()
        return None
    finally:
        theirs.close()
    return proc, mine


def end(proc: BaseProcess | None, conn: Connection | None) -> None:
    """Close the pipe, end the child if it still runs, and wait for it (nothing left behind)."""
    if conn is not None:
        conn.close()
    if proc is not None:
        if proc.is_alive():
            proc.terminate()
        proc.join()
        proc.close()
