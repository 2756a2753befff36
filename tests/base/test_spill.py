"""Derived weights on disk: valid after their pages are handed back, and no leftovers from a
killed run."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from trtbisect.base import spill


def test_a_spilled_array_survives_release_pages():
    a = np.arange(1 << 19, dtype=np.float32)  # 2 MiB: spilled
    s = spill.spill(a)
    assert isinstance(s, np.memmap)
    spill.release_pages([s])
    np.testing.assert_array_equal(s, a)  # the pages come back from the file
    small = np.ones(4, np.float32)
    assert spill.spill(small) is small


def test_the_folder_of_a_killed_run_is_swept(monkeypatch):
    code = ("import os, numpy as np; from trtbisect.base import spill; "
            "spill.spill(np.ones(1 << 19, np.float32)); print(spill._folder, flush=True); "
            "os._exit(0)")  # no exit handlers: as if killed
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    left = Path(out.stdout.strip())
    assert left.is_dir() and left.parent == Path(tempfile.gettempdir())
    monkeypatch.setattr(spill, "_folder", None)
    spill._dir()
    assert not left.exists()
