"""A model's names are hostile input (#25): names full of terminal escapes, bidi overrides,
HTML, Markdown, shell syntax and every line break `str.splitlines()` knows go through every
output, and each output keeps the plan's names exactly while nothing is injected:

- stdout and stderr (at -vv, where the search logs its plans) hold no control character;
- precision.json names the very nodes; report.md, rendered by a CommonMark + GFM-table parser,
  and report.html have the same structure as with plain names (no extra heading, tag, row or
  link), and show each name as text;
- commands.sh passes `bash -n`, and run with stand-ins for trtexec, polygraphy, python and
  trtbisect that record their argv, hands every tool exactly the plan's names (trtexec's
  `--layerPrecisions` parsed with trtexec's grammar, Polygraphy's words split at the last `:`,
  AutoCast's regexes matching their own node alone), with no extra command run.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from tests.fuzz.make_cases import HOSTILE, overflow_model
from trtbisect.base.escape import md_code, md_text, visible
from trtbisect.cli import main
from trtbisect.outputs.render import parse_trtexec_spec

pytest.importorskip("matplotlib")  # --report
markdown_it = pytest.importorskip("markdown_it")

HOSTILE_IN = "in $(touch pwned)\n`touch pwned`\x1b[5m"
HOSTILE_OUT = "out\u202e|x|\n## Fake\r<b onmouseover=alert(1)>"
HOSTILE_TENSORS = ("t\x1b]0;title\x07<i>a", "t\u2028#b")
PLAIN = ("up1", "up2", "down")


def hostile_model(names=HOSTILE, io=(HOSTILE_IN, HOSTILE_OUT), tensors=HOSTILE_TENSORS):
    m = overflow_model(names)
    rename = {"x": io[0], "y": io[1], "a": tensors[0], "b": tensors[1]}
    for v in [*m.graph.input, *m.graph.output]:
        v.name = rename.get(v.name, v.name)
    for n in m.graph.node:
        n.input[:] = [rename.get(t, t) for t in n.input]
        n.output[:] = [rename.get(t, t) for t in n.output]
    return m


def run(folder: Path, model: onnx.ModelProto, input_name: str):
    folder.mkdir(parents=True)
    onnx.save(model, folder / "m.onnx")
    np.savez(folder / "in.npz", **{input_name: np.linspace(-2, 2, 8, dtype=np.float32)
                                   .reshape(2, 4)})
    result = CliRunner(env={"COLUMNS": "2000"}).invoke(
        main, ["-vv", "run", str(folder / "m.onnx"), "--inputs", str(folder / "in.npz"),
               "--out", str(folder / "out"), "--report", "--all"])  # --all: every name shown
    assert result.exit_code == 0, (result.output, result.exception)
    return result, folder / "out"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    plain = run(base / "plain", hostile_model(PLAIN, ("x", "y"), ("a", "b")), "x")
    hostile = run(base / "hostile", hostile_model(), HOSTILE_IN)
    return plain, hostile


def controls(text: str) -> list[str]:
    return sorted({repr(c) for c in text if not (c.isprintable() or c in "\n ")})


def test_the_console_shows_names_escaped(runs):
    _, (result, out) = runs
    assert controls(result.stdout) == [] and controls(result.stderr) == []
    assert result.stderr.count("\n") > 5  # -vv logged the search, names and all
    for name in HOSTILE:
        assert visible(name) in result.stdout  # shown escaped, one line, never obeyed
    assert not (out / "pwned").exists() and not Path("pwned").exists()


def test_precision_json_names_the_very_nodes(runs):
    _, (_, out) = runs
    plan = json.loads((out / "precision.json").read_text(encoding="utf-8"))
    assert plan["verdict"] == "fixed" and plan["fp32_nodes"] == list(HOSTILE)
    for name, pattern in zip(HOSTILE, plan["renderings"]["autocast_nodes_to_exclude"]):
        assert [n for n in HOSTILE if re.fullmatch(pattern, n)] == [name]


def _markdown_tokens(path: Path):
    md = markdown_it.MarkdownIt("commonmark").enable("table")
    return md.parse(path.read_text(encoding="utf-8"))


def _structure(tokens) -> list[str]:
    return [t.type for t in tokens]


def test_report_md_has_the_plain_structure_and_no_html(runs):
    (_, plain_out), (_, out) = runs
    hostile, plain = _markdown_tokens(out / "report.md"), _markdown_tokens(plain_out / "report.md")
    assert _structure(hostile) == _structure(plain)  # no heading, row, list or block injected
    inline = [c for t in hostile if t.children for c in t.children]
    assert not [t for t in hostile + inline if t.type in ("html_block", "html_inline")]
    assert [c.attrGet("src") for c in inline if c.type == "image"] == ["report_plot.png", "report_tradeoff.png"]
    assert not [c for c in inline if c.type == "link_open"]
    rendered = markdown_it.MarkdownIt("commonmark").enable("table").render(
        (out / "report.md").read_text(encoding="utf-8"))
    for name in HOSTILE:  # each name shown as its own (escaped-for-HTML) text in a code span
        assert f"<code>{html.escape(visible(name), quote=False)}</code>" in rendered, name


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += attrs

    def handle_data(self, data):
        self.text.append(data)


def test_report_html_has_the_plain_structure(runs):
    (_, plain_out), (_, out) = runs
    hostile, plain = Tags(), Tags()
    page = (out / "report.html").read_text(encoding="utf-8")
    hostile.feed(page)
    plain.feed((plain_out / "report.html").read_text(encoding="utf-8"))
    assert hostile.tags == plain.tags
    assert not [a for a, _ in hostile.attrs if a.startswith("on")]
    assert controls(page) == []  # no bidi override reorders what the page shows
    text = "".join(hostile.text)
    for name in HOSTILE:
        assert visible(name) in text  # the name, as text


STUB = """#!{python}
import json, os, sys
with open(os.environ["ARGV_LOG"], "a", encoding="utf-8") as fh:
    fh.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_commands_sh_hands_every_tool_exactly_the_plan(runs, tmp_path):
    _, (_, out) = runs
    script = out / "commands.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for tool in ("trtexec", "polygraphy", "python", "trtbisect"):
        (stubs / tool).write_text(STUB.format(python=sys.executable))
        (stubs / tool).chmod(0o755)
    log = tmp_path / "argv.jsonl"
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "ARGV_LOG": str(log), "HOME": str(tmp_path)}
    subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, check=True, timeout=600)
    assert not list(tmp_path.rglob("pwned")) and not list(out.rglob("pwned"))  # nothing ran
    calls = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert sorted(c[0] for c in calls) == sorted(
        ["trtexec", "trtexec", "polygraphy", "polygraphy", "polygraphy", "python", "trtbisect"])
    plan = list(HOSTILE)
    weak = next(c for c in calls if c[0] == "trtexec" and "--fp16" in c)
    spec = next(a for a in weak if a.startswith("--layerPrecisions="))
    assert parse_trtexec_spec(spec.split("=", 1)[1]) == [(n, "fp32") for n in plan]
    poly = next(c for c in calls if c[0] == "polygraphy" and "--layer-precisions" in c)
    words = poly[poly.index("--layer-precisions") + 1:]
    words = words[:next(k for k, w in enumerate(words) if w.startswith("--"))]
    assert [w.rsplit(":", 1) for w in words] == [[n, "float32"] for n in plan]
    atol = poly[poly.index("--atol") + 1]
    assert atol.rsplit(":", 1)[0] == HOSTILE_OUT  # the output's name, whole
    autocast = next(c for c in calls if c[0] == "python")
    patterns = autocast[autocast.index("--nodes_to_exclude") + 1:]
    assert [[n for n in plan if re.fullmatch(p, n)] for p in patterns] == [[n] for n in plan]


def test_compare_table_shows_names_escaped(tmp_path):
    onnx.save(hostile_model(), tmp_path / "m.onnx")
    result = CliRunner(env={"COLUMNS": "2000"}).invoke(main, ["compare", str(tmp_path / "m.onnx")])
    assert result.exit_code == 0, result.output
    assert controls(result.stdout) == [] and controls(result.stderr) == []
    assert visible(HOSTILE_TENSORS[1]) in result.stdout  # the overflowing tensor, flagged
    assert visible(HOSTILE[1]) in result.stdout  # its producer


def test_markdown_helpers_cannot_be_broken_out_of():
    md = markdown_it.MarkdownIt("commonmark").enable("table")
    for name in [*HOSTILE, "``x``", "`", " ", "a|b\\|c", "1. item", "- item", "# h", "<!--"]:
        cell = md.render(f"| a |\n|---|\n| {md_code(name).replace('|', chr(92) + '|')} |\n")
        assert cell.count("<td>") == 1 and "<code>" in cell, (name, cell)
        prose = md.render("x " + md_text(name) + "\n\n" + md_text(name) + "\n")
        assert prose.count("<p>") == 1 + bool(name.strip()), (name, prose)  # no other block
        assert "<script" not in prose and "<img" not in prose and "<a " not in prose
    assert os.linesep not in visible("a\nb")
