"""The plan's files are written atomically: a temporary file in a private folder beside it,
renamed into place, with the user's umask, never through a link (outputs/files.py). (The plan
itself is `RunResult.fp32_nodes`; its renderings live in render.py, the strongly typed mixed
ONNX in mixed.py.)
"""

from __future__ import annotations

import json
import os  # noqa: F401 - tests inject faults through plan.os / plan.tempfile
import tempfile  # noqa: F401
from pathlib import Path
from typing import Callable

import onnx

from .outputs import files

__all__ = ["atomic_write", "atomic_write_json", "atomic_write_records", "atomic_write_text",
           "save_model"]


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Write through a temporary file in a private folder beside `path`, then rename: never a
    half file, never through a planted link (outputs/files.py); `write` gets the temporary
    file's path."""
    files.atomic_write(path, write)


current_umask = files.current_umask


def atomic_write_text(path: Path, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
    atomic_write(path, write)


def atomic_write_json(path: Path, data: object) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def atomic_write_records(path: Path, rows: list[dict]) -> None:
    """A JSON list of flat records, one a line: as readable as `indent=2` for a table, and
    encoded by json's C encoder (`indent` makes json pure Python: 2.7 s for the statistics of
    20k tensors, written twice)."""
    atomic_write_text(path, "[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n"
                      if rows else "[]\n")


def save_model(path: Path, model: onnx.ModelProto) -> None:
    atomic_write(path, lambda tmp: onnx.save(model, tmp))
