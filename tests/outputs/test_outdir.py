"""Nothing lost, nothing overwritten, nothing followed (#25): the --out folder.

- the lock, the cache, the journal and every file a run writes are never written through a
  link planted in --out (the victim keeps its bytes); the cache is checked against its hash;
- a run moves or deletes only files a trtbisect manifest lists, file by file: never the
  run's inputs, never the user's files (report.md, inputs/, a .previous of theirs);
- the last complete generation survives any number of failed runs.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from tests.fuzz.make_cases import overflow_model
from trtbisect.base import cache as result_cache
from trtbisect.cli import main
from trtbisect.outputs import outdir as outdir_mod

X = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)


@pytest.fixture
def model(tmp_path):
    path, inputs = tmp_path / "m.onnx", tmp_path / "in.npz"
    onnx.save(overflow_model(), path)
    np.savez(inputs, x=X)
    return path, inputs


def invoke(*args):
    return CliRunner().invoke(main, ["-q", *map(str, args)])


def run_ok(model, out, *extra):
    path, inputs = model
    r = invoke("run", path, "--inputs", inputs, "--out", out, *extra)
    assert r.exit_code == 0, (r.output, r.exception)
    return json.loads((out / "precision.json").read_text())


def one_error_line(r) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.output
    return lines[0]


def tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


# ---------------------------------------------------------------- links planted in --out

@pytest.mark.parametrize("plant", ["symlink", "hardlink", "fifo"])
def test_a_planted_lock_is_refused_and_its_target_untouched(model, tmp_path, plant):
    victim, out = tmp_path / "victim", tmp_path / "out"
    victim.write_text("precious\n")
    out.mkdir()
    lock = out / ".trtbisect.lock"
    {"symlink": lambda: lock.symlink_to(victim), "hardlink": lambda: lock.hardlink_to(victim),
     "fifo": lambda: os.mkfifo(lock)}[plant]()
    path, inputs = model
    line = one_error_line(invoke("run", path, "--inputs", inputs, "--out", out))
    assert ".trtbisect.lock" in line
    assert victim.read_text() == "precious\n"
    assert not (out / "precision.json").exists()


@pytest.mark.parametrize("name", ["precision.json", "commands.sh", "m.mixed.onnx",
                                  ".trtbisect-manifest.json", "inputs"])
def test_a_link_where_a_file_goes_is_refused_before_the_search(model, tmp_path, name):
    victim, out = tmp_path / "victim", tmp_path / "out"
    victim.mkdir() if name == "inputs" else victim.write_text("precious\n")
    out.mkdir()
    (out / name).symlink_to(victim)
    path, inputs = model
    r = invoke("run", path, "--inputs", inputs, "--out", out)
    line = one_error_line(r)
    assert "symbolic link" in line or "no trtbisect run wrote" in line, line
    assert (victim.read_text() == "precious\n") if victim.is_file() else not list(victim.iterdir())


def test_a_linked_cache_or_staging_folder_is_left_alone(model, tmp_path):
    elsewhere, out = tmp_path / "elsewhere", tmp_path / "out"
    elsewhere.mkdir()
    out.mkdir()
    (out / ".cache").symlink_to(elsewhere)
    (out / ".staging").symlink_to(elsewhere)
    assert run_ok(model, out)["verdict"] == "fixed"
    assert list(elsewhere.iterdir()) == []  # nothing landed outside --out
    assert (out / ".cache").is_symlink() and (out / ".staging").is_symlink()


def test_a_tampered_cache_is_recomputed(model, tmp_path, caplog):
    out = tmp_path / "out"
    first = run_ok(model, out)
    cached = glob.glob(str(out / ".cache" / "references" / "*.npz"))  # one per sample
    assert len(cached) == 1
    arrays = dict(np.load(cached[0]))
    key = next(k for k in arrays if not k.startswith("__"))  # an output, not the hash
    arrays[key] = arrays[key] * 100  # a healthy plan would turn into "no plan"
    np.savez(cached[0], **arrays)
    rows = glob.glob(str(out / ".cache" / "layerwise-*.json"))[0]
    Path(rows).write_text(Path(rows).read_text().replace('"overflow": ', '"overflow": 1'))
    (out / "journal.jsonl").unlink()  # re-run the search, from the (checked) cache
    again = run_ok(model, out)
    assert again["fp32_nodes"] == first["fp32_nodes"] and again["verdict"] == "fixed"
    assert again["errors_before"] == first["errors_before"]
    assert result_cache.load_arrays(Path(cached[0])) is not None  # rewritten, sound
    assert result_cache.load_records(Path(rows)) is not None


def test_the_journal_is_appended_in_place_only(model, tmp_path):
    victim, out = tmp_path / "victim", tmp_path / "out"
    victim.write_text("precious\n")
    out.mkdir()
    (out / "journal.jsonl").symlink_to(victim)
    run_ok(model, out)
    assert victim.read_text() == "precious\n"
    assert (out / "journal.jsonl").is_file() and not (out / "journal.jsonl").is_symlink()


# ---------------------------------------------------------------- the user's files

def test_the_users_files_and_inputs_are_never_moved(model, tmp_path):
    """The issue's case: --out . with --inputs inputs/data.npz, three runs."""
    work = tmp_path / "work"
    (work / "inputs").mkdir(parents=True)
    path, _ = model
    np.savez(work / "inputs" / "data.npz", x=X)
    (work / "report.md").write_text("mine")
    (work / "notes.txt").write_text("mine too")
    mine = {k: v for k, v in tree(work).items()}
    cwd = os.getcwd()
    os.chdir(work)
    try:
        for _ in range(3):
            r = CliRunner().invoke(main, ["run", str(path), "--inputs", "inputs/data.npz",
                                          "--out", "."])
            assert r.exit_code == 0, r.output
            assert "stay untouched" in r.stderr  # a warning about the user's files
    finally:
        os.chdir(cwd)
    after = tree(work)
    assert {k: after.get(k) for k in mine} == mine  # every file of the user's, byte for byte
    manifest = json.loads((work / ".trtbisect-manifest.json").read_text())
    assert manifest["tool"] == "trtbisect" and manifest["complete"] is True
    assert "inputs/sample_000.npz" in manifest["files"] and "inputs" not in manifest["files"]
    previous = json.loads((work / ".previous" / ".trtbisect-manifest.json").read_text())
    assert "inputs/data.npz" not in previous["files"] and previous["complete"] is True
    assert (work / ".previous" / "precision.json").is_file()


@pytest.mark.parametrize("name,extra", [("data_loader.py", ()), ("report.md", ("--report",)),
                                        ("m.mixed.onnx", ())])
def test_a_users_file_where_an_output_goes_is_refused_up_front(model, tmp_path, name, extra):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("mine")
    path, inputs = model
    line = one_error_line(invoke("run", path, "--inputs", inputs, "--out", out, *extra))
    assert name in line and "no trtbisect run wrote" in line
    assert (out / name).read_text() == "mine" and not (out / "journal.jsonl").exists()


def test_a_users_report_md_stays_when_no_report_is_asked_for(model, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").write_text("mine")
    run_ok(model, out)
    run_ok(model, out)
    assert (out / "report.md").read_text() == "mine"


def test_a_users_previous_folder_is_never_touched(model, tmp_path):
    out = tmp_path / "out"
    run_ok(model, out)
    for f in (out / ".previous").iterdir() if (out / ".previous").exists() else []:
        f.unlink()
    (out / ".previous").mkdir(exist_ok=True)
    (out / ".previous" / "notes.txt").write_text("mine")
    path, inputs = model
    line = one_error_line(invoke("run", path, "--inputs", inputs, "--out", out))
    assert ".previous" in line and "not made by trtbisect" in line
    assert (out / ".previous" / "notes.txt").read_text() == "mine"
    assert json.loads((out / "precision.json").read_text())["verdict"] == "fixed"  # unmoved


def test_a_manifest_never_reaches_outside_the_folder(model, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (out / ".trtbisect-manifest.json").write_text(json.dumps(
        {"tool": "trtbisect", "format": 2, "complete": False,
         "files": ["../victim", str(victim), "inputs/../../victim"], "folders": [".."]}))
    run_ok(model, out)
    assert victim.read_text() == "precious\n"


def test_the_run_on_its_own_output_keeps_its_model(model, tmp_path):
    """`run OUT/m.mixed.onnx --out OUT`: one answer, the model stays where it is, no scratch
    is left behind, and the earlier plan's journal is kept (not called damaged)."""
    out = tmp_path / "out"
    run_ok(model, out)
    mixed = (out / "m.mixed.onnx").read_bytes()
    _, inputs = model
    r = invoke("run", out / "m.mixed.onnx", "--inputs", inputs, "--out", out)
    assert r.exit_code == 0, r.output
    assert (out / "m.mixed.onnx").read_bytes() == mixed
    assert (out / "m.mixed.mixed.onnx").is_file() and not (out / ".staging").exists()
    assert (out / "journal.previous.jsonl").is_file()
    assert not (out / "journal.rejected.jsonl").exists()


def test_an_older_trtbisects_folder_is_taken_over(model, tmp_path):
    """A manifest from before this format ({"files": [...]}, "inputs" as a folder): its own
    files are retired, file by file; the user's file in inputs/ stays."""
    out = tmp_path / "out"
    run_ok(model, out)
    files = [n for n in json.loads((out / ".trtbisect-manifest.json").read_text())["files"]
             if not n.startswith("inputs/")]
    (out / ".trtbisect-manifest.json").write_text(json.dumps({"files": [*files, "inputs"]}))
    (out / "inputs" / "mine.npz").write_bytes(b"mine")
    run_ok(model, out)
    assert (out / "inputs" / "mine.npz").read_bytes() == b"mine"
    assert (out / ".previous" / "inputs" / "sample_000.npz").is_file()


# ---------------------------------------------------------------- failed runs

def _fail_writing(monkeypatch, name: str):
    """The write of `name` fails as a full disk would (after the generation began)."""
    from trtbisect.base import files

    real = files.atomic_write

    def failing(path, write):
        if Path(path).name == name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, write)
    monkeypatch.setattr(files, "atomic_write", failing)


def test_the_last_good_plan_survives_failed_runs(model, tmp_path, monkeypatch):
    out = tmp_path / "out"
    good = run_ok(model, out)
    good_bytes = (out / "precision.json").read_bytes()
    before = tree(out)
    path, inputs = model
    for _ in range(3):
        with monkeypatch.context() as m:
            _fail_writing(m, "commands.sh")
            r = invoke("run", path, "--inputs", inputs, "--out", out, "--no-resume")
        assert "No space left" in one_error_line(r)
        assert (out / "precision.json").read_bytes() == good_bytes  # rolled back in place
    after = tree(out)
    generation = json.loads((out / ".trtbisect-manifest.json").read_text())["files"]
    assert all(after[n] == before[n] for n in generation)
    assert run_ok(model, out)["fp32_nodes"] == good["fp32_nodes"]
    assert (out / ".previous" / "precision.json").read_bytes() == good_bytes


def test_the_last_good_plan_survives_runs_killed_while_writing(model, tmp_path, monkeypatch):
    """No rollback (the process died): the failed generation is debris the next run deletes,
    and `.previous/` keeps the last complete one however many runs die in a row."""
    out = tmp_path / "out"
    run_ok(model, out)
    good = (out / "precision.json").read_bytes()
    path, inputs = model
    for _ in range(2):
        with monkeypatch.context() as m:
            _fail_writing(m, "trace.json")
            m.setattr(outdir_mod.Generation, "rollback", lambda self: None)
            one_error_line(invoke("run", path, "--inputs", inputs, "--out", out, "--no-resume"))
        assert not (out / "precision.json").exists()
        assert (out / ".previous" / "precision.json").read_bytes() == good
        state = json.loads((out / ".trtbisect-manifest.json").read_text())
        assert state["complete"] is False and "commands.sh" in state["files"]
    run_ok(model, out)
    assert (out / ".previous" / "precision.json").read_bytes() == good
    listed = json.loads((out / ".trtbisect-manifest.json").read_text())["files"]
    assert sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.startswith(".")
                  and p.name != "journal.jsonl") == sorted(n for n in listed if "/" not in n)


# ---------------------------------------------------------------- the model's hash

def test_model_sha256_is_the_files_as_sha256sum_prints_it(model, tmp_path):
    path, _ = model
    plan = run_ok(model, tmp_path / "out")
    assert plan["model"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert "external_data_sha256" not in plan["model"]


def test_external_data_has_its_own_hash(tmp_path):
    m = overflow_model()
    big = onnx.numpy_helper.from_array(np.full((64, 64), 1.0, np.float32), "k_big")
    m.graph.initializer.append(big)
    m.graph.node.append(onnx.helper.make_node("MatMul", ["x", "k_big"], ["unused"], name="mm"))
    del m.graph.node[-1]  # only the initializer matters: stored as external data
    path = tmp_path / "ext.onnx"
    onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.data", size_threshold=0)
    np.savez(tmp_path / "in.npz", x=X)
    plan = run_ok((path, tmp_path / "in.npz"), tmp_path / "out")
    assert plan["model"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert len(plan["model"]["external_data_sha256"]) == 64
