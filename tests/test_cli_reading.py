"""What a person reads: whole names at any width, progress without a terminal, -v/-q after the
subcommand, folded groups, per-command exit codes, readable relative errors, `env` rows."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
from click.testing import CliRunner
from rich.console import Console

from tests.conftest import save_zoo_model
from trtbisect import cli
from trtbisect.cli import Progress, fold_groups, main, rel_cell
from trtbisect.diagnosis.diagnose import CulpritGroup


def _renamed_zoo(zoo, tmp_path, long: str):
    import onnx
    z = zoo["reducesum_overflow"]
    model, inputs = save_zoo_model(z, tmp_path)
    m = onnx.load(str(model))
    for n in m.graph.node:
        if n.name == "pool/ReduceSum":
            n.name = long
    onnx.save(m, str(model))
    return model, inputs


def test_run_table_keeps_whole_names_at_80_columns_piped(zoo, tmp_path, monkeypatch):
    long = "/encoder/layers.11/self_attn/pool/ReduceSum_with_a_very_long_name_1234567890"
    model, inputs = _renamed_zoo(zoo, tmp_path, long)
    monkeypatch.setattr(cli, "out", Console(file=io.StringIO(), width=80))
    res = CliRunner().invoke(main, ["run", str(model), "--inputs", str(inputs),
                                    "--out", str(tmp_path / "o"), "--all"])  # every node
    assert res.exit_code == 0, res.output
    text = cli.out.file.getvalue()
    assert "…" not in text
    cells = "".join(line.split("│")[1].strip() for line in text.splitlines()
                    if line.startswith("│") and line.count("│") > 2)
    assert long in cells  # folded across lines, never cut


def test_progress_prints_plain_rate_limited_lines_without_a_terminal():
    buf = io.StringIO()
    now = [0.0]
    p = Progress(0, Console(file=buf, force_terminal=False), interval=1.0, clock=lambda: now[0])
    with p:
        p.stage("stage one")
        for k in range(1, 11):
            now[0] += 0.25
            p.layerwise(k, 10)
        p.stage("stage two")
    lines = buf.getvalue().splitlines()
    assert lines[0] == "stage one" and lines[-1] == "stage two"
    counted = [ln for ln in lines if ln.startswith("layer-wise comparison |")]
    # 2.5 s of updates every 0.25 s: at most one a second, plus the final count
    assert counted[-1] == "layer-wise comparison | 10/10 tensors" and 2 <= len(counted) <= 4
    quiet = io.StringIO()
    with Progress(1, Console(file=quiet)) as q:
        q.stage("hidden")
        q.layerwise(1, 1)
    assert quiet.getvalue() == ""


def test_verbosity_after_the_subcommand(zoo, tmp_path):
    model, inputs = save_zoo_model(zoo["healthy"], tmp_path)
    res = CliRunner().invoke(main, ["compare", str(model), "--inputs", str(inputs), "-q", "-q"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["env", "-v"])
    assert res.exit_code == 0, res.output


def test_identical_groups_fold_into_one_with_a_count():
    g = CulpritGroup(["a"], "overflow", "layernorm_decomposed", {}, "same words", [], None)
    other = CulpritGroup(["b"], "overflow", None, {}, "other words", [], None)
    assert fold_groups([g, replace(g, nodes=["c"]), other, replace(g)]) == [(g, 3), (other, 1)]
    # one kind of cause (cause and pattern), whatever its words: the first speaks for the rest
    reworded = replace(g, summary="other words at another place")
    assert fold_groups([g, reworded, other], ("cause", "pattern")) == [(g, 2), (other, 1)]
    assert fold_groups([g, reworded, other]) == [(g, 1), (reworded, 1), (other, 1)]


@pytest.mark.parametrize("command, absent", [("export", "no precision plan meets"),
                                             ("torch", "FP16 already passes, or a plan"),
                                             ("env", "no precision plan meets"),
                                             ("compare", "no precision plan meets")])
def test_each_command_shows_its_own_exit_codes(command, absent):
    res = CliRunner().invoke(main, [command, "--help"])
    assert res.exit_code == 0 and "Exit codes:" in res.output
    assert absent not in res.output


def test_relative_error_cells_say_inf_not_absurd_numbers():
    assert "e+33" not in rel_cell(3.37e33) and rel_cell(3.37e33).startswith(">1e3")
    assert rel_cell(float("inf")) == "inf" and rel_cell(float("nan")) == "inf"
    assert rel_cell(5.0, nonfinite=12) == "inf/NaN (12)"
    assert rel_cell(0.0123) == "0.0123"


def test_env_lists_every_optional_component():
    res = CliRunner().invoke(main, ["env", "--json"])
    names = {row["component"] for row in __import__("json").loads(res.output)}
    assert {"matplotlib", "polygraphy", "nvidia-modelopt", "torch", "onnxscript", "tensorrt",
            "cuda (cuda-python)"} <= names
