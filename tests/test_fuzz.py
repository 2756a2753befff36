"""The fuzz corpus (tests/fuzz/make_cases.py) through the command line, in-process.

Each case must end with a documented exit code, never a traceback or a hang; an error is one
line on stderr; the files the user handed over are byte-identical afterwards. CI runs a
fixed-seed sample; `pytest --runslow -m slow tests/test_fuzz.py` runs the whole corpus.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import random
import signal
import traceback
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.fuzz.make_cases import DOCUMENTED, INPUT_CLASSES, Case, cases
from trtbisect.cli import main

CORPUS = cases()
SAMPLE = random.Random(14).sample(CORPUS, 60)
HANG_SECONDS = 900  # a guard against a hung case, never a bound on speed


class Hang(Exception):
    pass


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args[0]) if args else None)


def apply_patch(name: str | None, monkeypatch: pytest.MonkeyPatch, args: list[str]) -> list[int]:
    """Faults the file system would inject: a full disk, another run holding the lock.
    Returns descriptors to close afterwards."""
    if name == "enospc-write":
        monkeypatch.setattr("trtbisect.base.files.tempfile.mkdtemp", _enospc)
    elif name == "enospc-replace":
        monkeypatch.setattr("trtbisect.base.files.os.replace", _enospc)
    elif name == "enospc-journal":
        monkeypatch.setattr("trtbisect.search.journal.Journal._write", _enospc)
    elif name == "locked":
        out = Path(args[args.index("--out") + 1])
        fd = os.open(out / ".trtbisect.lock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a second open file: another run
        return [fd]
    return []


def snapshot(folder: Path) -> dict[str, str]:
    """sha256 of every file the case handed over (not what the run wrote to out/)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and "out" not in p.parts}


def run_case(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "case"
    folder.mkdir()
    args = case.build(folder)
    before = snapshot(folder)
    held = apply_patch(case.patch, monkeypatch, args)

    def hang(signum, frame):
        raise Hang(f"no answer within {HANG_SECONDS}s")
    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(HANG_SECONDS)
    try:
        result = CliRunner().invoke(main, ["-q", *args])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        for fd in held:
            os.close(fd)
    monkeypatch.undo()
    exc = result.exception
    if exc is not None and not isinstance(exc, SystemExit):
        detail = "".join(traceback.format_exception(exc))
        pytest.fail(f"{case.name}: {' '.join(args)}\n{detail}")
    assert result.exit_code in DOCUMENTED, (case.name, result.exit_code, result.output)
    assert result.exit_code in case.codes, (case.name, result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if result.exit_code == 2 or any(line.startswith("error:") for line in lines):
        assert len(lines) == 1 and lines[0].startswith("error:"), (case.name, result.stderr)
    assert snapshot(folder) == before, f"{case.name} changed its input files"


def _param(case: Case, *marks):
    if case.xfail:
        marks = (*marks, pytest.mark.xfail(reason=case.xfail, strict=True))
    return pytest.param(case, id=case.name, marks=marks)


# Every cause #14 names, always run (the rest of the corpus is sampled).
ISSUE_CASES = ["model-elem_type_0-run", "model-elem_type_999-compare", "option-samples_0-run",
               "npz-npy_not_npz-run", "npz-text_member-run", "npz-header_1e12-run",
               "model-dim_2_40-run", "option-shape_negative-run", "model-utf8_bad_node_name-run",
               "npz-empty_npz-run", "npz-zero_length_file-compare", "option-threads_100000-run",
               "out-read-only", "out-disk-full-replace", "out-journal_garbage",
               "out-journal_foreign", "out-plan_folder", "option-rtol_negative-run",
               "option-rtol_nan-run", "option-atol_nan-check", "option-max_evals_0-run",
               "option-stability_1-run", "option-output_tol_typo-run",
               "option-shape_names_output-run", "option-shape_unknown_name-compare",
               "stacked-scalar-inputs", "out-locked-by-another-run", "out-stale_generation",
               # #25: links planted in --out, the user's files, degenerate models, bounds
               "out-lock_symlink", "out-lock_hardlink", "out-lock_fifo", "out-cache_symlink",
               "out-cache_fifo", "out-journal_symlink", "out-journal_fifo", "out-inputs_symlink",
               "out-plan_symlink", "out-commands_symlink", "out-manifest_symlink",
               "out-staging_symlink", "out-previous_symlink", "out-user_files",
               "out-user_report", "out-user_previous", "out-manifest_lists_outside",
               "model-int64_compute-run", "model-bool_compute-run", "model-double_compute-run",
               "model-no_nodes-run", "model-hostile_names-run", "model-hostile_names-compare",
               "option-samples_1e9-run", "option-samples_total_bytes-run",
               "option-stability_1000-run",
               # #35: hooks, loaders and files written to break the run
               "hook-score_1e400-run", "hook-prints-run", "hook-vandal-run",
               "loader-reused_buffer-run", "loader-never_ends-run", "loader-prints-run",
               "npz-billion_empty_samples-run", "model-loop_forever-run",
               "model-loop_stuck_in_fp16-run", "model-initializer_raw_longer-run",
               "model-node_name_100k-run", "npz-header_negative_dim-run",
               "npz-duplicate_member-run", "npz-duplicate_member-check",
               "option-eval_timeout_0-run", "option-eval_timeout_nan-run",
               "option-eval_timeout_inf-run", "option-max_input_bytes_tiny-run",
               # #34: every class of input model, run on random samples and on an .npz
               *(f"model-class_{n}-run{s}" for n in INPUT_CLASSES for s in ("", "-inputs"))]
BY_NAME = {c.name: c for c in CORPUS}


@pytest.mark.parametrize("case", [_param(c) for c in SAMPLE
                                  + [BY_NAME[n] for n in ISSUE_CASES if BY_NAME[n] not in SAMPLE]])
def test_fuzz_sample(case, tmp_path, monkeypatch):
    run_case(case, tmp_path, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("case", [_param(c) for c in CORPUS])
def test_fuzz_corpus(case, tmp_path, monkeypatch):
    run_case(case, tmp_path, monkeypatch)


def test_corpus_has_the_breadth_of_the_issue():
    names = [c.name for c in CORPUS]
    assert len(names) == len(set(names)) and len(names) >= 628 + 24
    assert all(n in BY_NAME for n in ISSUE_CASES)
