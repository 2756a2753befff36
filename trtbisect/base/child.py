"""A spawned child process that does one job beside the run (judge/loadable.py's load check,
backends/ort.py's certificate references): ending it on every way out."""

from __future__ import annotations

from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess


def end(proc: BaseProcess | None, conn: Connection | None) -> None:
    """Close the pipe, end the child if it still runs, and wait for it (nothing left behind)."""
    if conn is not None:
        conn.close()
    if proc is not None:
        if proc.is_alive():
            proc.terminate()
        proc.join()
        proc.close()
