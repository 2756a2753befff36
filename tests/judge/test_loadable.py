"""What a written file is held to (judge/loadable.py): the checker's full check and an ONNX
Runtime load, except for a copy of an input model that fails the checker itself. That fact is
the run's own (`Context.input_check`), handed to the writers: two runs in one process, in either
order, each hold their copies to their own input, never to the other's."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest

from tests.models import input_models as im
from trtbisect.context import Options, prepare
from trtbisect.errors import TrtBisectError
from trtbisect.judge.loadable import (
    InputCheck,
    checker_problem,
    require_written_valid,
    runtime_problem,
)
from trtbisect.judge.mixed import graph_model
from trtbisect.pipeline import run
from trtbisect.stages.written import judge_mixed

FORGIVEN = "as the model given does"
MODELS = {"fails": im.loop_body_wrong_rank, "passes": im.overflow}


def _inputs(tmp_path):
    np.savez(tmp_path / "in.npz", x=im.X)
    paths = {}
    for name, build in MODELS.items():
        paths[name] = tmp_path / f"{name}.onnx"
        onnx.save(build(), paths[name])
    return paths, Options.of(inputs=[str(tmp_path / "in.npz")])


def _forgiven(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if FORGIVEN in r.getMessage()]


@pytest.mark.parametrize("first", sorted(MODELS))
def test_two_prepared_runs_hold_their_copies_to_their_own_input(tmp_path, caplog, first):
    """Both runs prepared before either writes (the library's Contexts live side by side): a
    copy of the model that fails the checker is forgiven in its own run and refused as
    trtbisect's bug in the other's, whichever was prepared last."""
    paths, opts = _inputs(tmp_path)
    order = [first, *(n for n in MODELS if n != first)]
    ctx = {name: prepare(paths[name], opts) for name in order}
    assert ctx["fails"].input_check.problem is not None
    assert ctx["passes"].input_check.problem is None
    copy = tmp_path / "copy.onnx"
    with caplog.at_level(logging.WARNING):
        graph_model(ctx["fails"].graph).save(copy, held=ctx["fails"].input_check)
        checked = judge_mixed(copy, ctx["fails"], opts.judge, ours=True)
    assert checked.passed and len(_forgiven(caplog)) == 2  # the save's and the judge's check
    with pytest.raises(TrtBisectError, match="a bug in trtbisect"):
        judge_mixed(copy, ctx["passes"], opts.judge, ours=True)
    with pytest.raises(TrtBisectError, match="a bug in trtbisect"):
        graph_model(ctx["fails"].graph).save(tmp_path / "other.onnx",
                                            held=ctx["passes"].input_check)


@pytest.mark.parametrize("first", sorted(MODELS))
def test_two_runs_in_one_process_each_get_their_own_treatment(tmp_path, caplog, first):
    paths, opts = _inputs(tmp_path)
    for name in [first, *(n for n in MODELS if n != first)]:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            result = run(paths[name], opts, tmp_path / f"out_{name}")
        holder = "loop[body]/" if name == "fails" else ""
        assert result.verdict == "fixed"
        assert set(result.fp32_nodes) == {f"{holder}up2", f"{holder}down"}
        forgiven = _forgiven(caplog)
        assert bool(forgiven) == (name == "fails"), forgiven
        written = sorted((tmp_path / f"out_{name}").glob("*.onnx"))
        assert len(written) >= 2
        for f in written:  # the one that passes: the full check; the other: ORT loads them
            if name == "passes":
                require_written_valid(f)
            else:
                assert checker_problem(f) is not None and runtime_problem(f) is None


def test_without_a_record_a_written_file_is_held_to_the_full_check(tmp_path):
    paths, _ = _inputs(tmp_path)
    with pytest.raises(TrtBisectError, match="a bug in trtbisect"):
        require_written_valid(paths["fails"])
    with pytest.raises(TrtBisectError, match="a bug in trtbisect"):
        require_written_valid(paths["fails"], held=InputCheck(paths["passes"]))
    require_written_valid(paths["fails"], held=InputCheck(paths["fails"]))
    require_written_valid(paths["passes"])


import pytest  # noqa: E402


@pytest.mark.parametrize("opset", [12, 15])
def test_a_bf16_file_no_onnx_tool_loads_is_said_so_never_claimed_loaded(opset, tmp_path):
    """A BF16 Conv at opset 12 (copied at 13) or 15: onnx lists bfloat16 for Conv from opset
    22 only and ONNX Runtime refuses the file. The run and `check` say plainly that no ONNX tool
    loads it and what was judged instead (its emulation, which loads); neither says ONNX Runtime
    loads it."""
    import numpy as np
    import onnxruntime as ort
    from click.testing import CliRunner
    from onnx import TensorProto, helper, numpy_helper

    from trtbisect.cli import main
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv",
                                            pads=[1, 1, 1, 1])], "c",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [w])
    path = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                                ir_version=7), path)
    np.savez(tmp_path / "x.npz", x=rng.standard_normal((1, 3, 8, 8)).astype(np.float32))
    run = CliRunner().invoke(main, ["run", str(path), "--inputs", str(tmp_path / "x.npz"),
                                    "--precision", "bf16", "--rtol", "0.1",
                                    "--out", str(tmp_path / "o")])
    assert run.exit_code == 0, run.output
    said = " ".join(run.output.split())  # rich wraps the warning on the terminal
    assert "no ONNX tool loads it as written" in said and "ONNX Runtime loads it" not in said
    mixed = tmp_path / "o" / "conv.mixed.onnx"
    # the words are true: ORT refuses the file as written, for BF16 on its Conv
    with pytest.raises(Exception, match=r"INVALID_GRAPH.*tensor\(bfloat16\).*Conv"):
        ort.InferenceSession(str(mixed), providers=["CPUExecutionProvider"])
    emulated = tmp_path / "o" / "conv.mixed.emulated.onnx"  # what was judged: it loads
    ort.InferenceSession(str(emulated), providers=["CPUExecutionProvider"])
    check = CliRunner().invoke(main, ["check", str(mixed), "--reference", str(path),
                                      "--inputs", str(tmp_path / "x.npz"), "--precision",
                                      "bf16", "--rtol", "0.1"])
    assert check.exit_code == 0, check.output
    said = " ".join(check.output.split())
    assert "no ONNX tool loads it as written" in said and "ONNX Runtime loads it" not in said


# ------------------------------------------- ONNX Runtime's load in a child process (#45 item 4)

def _unloadable(tmp_path):
    """A file the checker passes and ONNX Runtime refuses: an op of a domain it does not know."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="example.custom", name="frob")
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid("example.custom", 1)])
    path = tmp_path / "model.mixed.onnx"
    onnx.save(model, path)
    assert checker_problem(path) is None and runtime_problem(path) is not None
    return path


def _children():
    import multiprocessing as mp

    return [p for p in mp.active_children() if p.name == "trtbisect-load-check"]


def test_a_load_checked_in_a_child_fails_in_the_same_words(tmp_path):
    """The written file's load runs in a child process beside the judge (WrittenCheck): a file
    ONNX Runtime refuses is reported in require_written_valid's very words, and an error met
    meanwhile (the judge tripping on the same file) gives way to the file's own; the child is
    gone afterwards."""
    from trtbisect.judge.loadable import WrittenCheck

    path = _unloadable(tmp_path)
    with pytest.raises(TrtBisectError) as inline:
        require_written_valid(path)
    assert "fails onnxruntime:" in str(inline.value) and "a bug in trtbisect" in str(inline.value)
    with WrittenCheck(path) as check:
        with pytest.raises(TrtBisectError) as child:
            check.require()
    assert str(child.value) == str(inline.value)
    with WrittenCheck(path) as check:
        with pytest.raises(TrtBisectError) as first:
            with check.guard():
                raise ValueError("the judge's own session fails on the file")
    assert str(first.value) == str(inline.value) and first.value.__cause__ is None
    assert not _children()


def test_a_file_that_loads_lets_the_callers_error_through(tmp_path):
    from trtbisect.judge.loadable import WrittenCheck

    path = tmp_path / "passes.onnx"
    onnx.save(MODELS["passes"](), path)
    with WrittenCheck(path) as check:
        with pytest.raises(ValueError, match="its own"):
            with check.guard():
                raise ValueError("its own")
    with WrittenCheck(path) as check:
        check.require()
    assert not _children()


def test_a_checker_error_is_said_at_once_before_any_load_is_waited_for(tmp_path):
    from trtbisect.judge.loadable import WrittenCheck

    paths, _ = _inputs(tmp_path)
    with pytest.raises(TrtBisectError, match="fails onnx.checker") as inline:
        require_written_valid(paths["fails"])
    with pytest.raises(TrtBisectError) as early:
        WrittenCheck(paths["fails"])
    assert str(early.value) == str(inline.value)
    WrittenCheck(paths["fails"], held=InputCheck(paths["fails"])).require()  # forgiven: loads
    assert not _children()


def test_a_load_check_whose_process_dies_is_a_failed_load_on_one_line(tmp_path, monkeypatch):
    from trtbisect.judge import loadable

    path = tmp_path / "passes.onnx"
    onnx.save(MODELS["passes"](), path)
    monkeypatch.setenv(loadable.DIE_ENV, "9")
    with pytest.raises(TrtBisectError) as died:
        with loadable.WrittenCheck(path) as check:
            check.require()
    message = str(died.value)
    assert "\n" not in message and "Traceback" not in message
    assert message == (f"trtbisect wrote {path.name}, which fails onnxruntime: the process "
                       "loading it ended without an answer (exit code 9) (a bug in trtbisect: "
                       "please report it with the model)")
    assert not _children()


def test_closing_a_load_check_ends_its_child(tmp_path):
    from trtbisect.judge.loadable import LoadCheck

    path = _unloadable(tmp_path)
    check = LoadCheck(path)
    check.close()
    assert not _children()
    assert check.answer() == runtime_problem(path)  # asked after close: loaded here


def test_a_small_file_is_loaded_here_and_a_big_graph_in_a_child(tmp_path):
    """A child costs about a second to start: only a graph of base/child.py's CHILD_NODES
    nodes or more pays for one; a small file's load runs here, with the same answer."""
    from trtbisect.base.child import CHILD_NODES, worth_a_child
    from trtbisect.judge.loadable import LoadCheck

    path = _unloadable(tmp_path)
    check = LoadCheck(path, in_child=False)
    assert check._proc is None and not _children()
    assert check.answer() == runtime_problem(path)
    assert worth_a_child(CHILD_NODES) and not worth_a_child(CHILD_NODES - 1)


def _never_starts(conn, path, weight_bytes) -> None:
    """A child that ends before it says it started (as spawn's own failure to import a main
    module read from stdin does)."""
    import os

    os._exit(3)


def test_a_load_check_whose_child_never_starts_loads_here_with_the_same_answer(tmp_path,
                                                                              monkeypatch):
    """A child that never reached the load is no verdict on the file: the load runs here, and
    says what it says (a file that loads passes, one that does not fails in the same words)."""
    from trtbisect.judge import loadable

    monkeypatch.setattr(loadable, "_load_in_child", _never_starts)
    bad = _unloadable(tmp_path)
    with pytest.raises(TrtBisectError) as inline:
        require_written_valid(bad)
    with pytest.raises(TrtBisectError) as here:
        loadable.WrittenCheck(bad).require()
    assert str(here.value) == str(inline.value) and "without an answer" not in str(here.value)
    good = tmp_path / "passes.onnx"
    onnx.save(MODELS["passes"](), good)
    loadable.WrittenCheck(good).require()
    assert not _children()
