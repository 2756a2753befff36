"""A spawned child process that does one job beside the run (judge/loadable.py's load check,
backends/ort.py's certificate references): ending it on every way out."""

from __future__ import annotations

from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

# A graph of this many nodes builds an ONNX Runtime session for seconds (a 20k-node FP16 file:
# 27 s), more than a spawned child costs to start (importing onnxruntime: about a second):
# from here on a written file's load check and the certificate's FP32 references run in one.
CHILD_NODES = 4000


def worth_a_child(nodes: int) -> bool:
    """Whether a graph of `nodes` nodes pays for a child process beside the judge."""
    return nodes >= CHILD_NODES


def end(proc: BaseProcess | None, conn: Connection | None) -> None:
    """Close the pipe, end the child if it still runs, and wait for it (nothing left behind)."""
    if conn is not None:
        conn.close()
    if proc is not None:
        if proc.is_alive():
            proc.terminate()
        proc.join()
        proc.close()
