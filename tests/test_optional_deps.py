"""The package, every module that does not exist for an optional dependency, and every command's
--help work on a machine without torch, TensorRT, matplotlib or onnxscript."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

BLOCKED = ("torch", "tensorrt", "matplotlib", "onnxscript")
# modules that exist to drive an optional dependency; they may fail to import without it
NEEDS_TORCH = {*(f"trtbisect.torch.{m}" for m in (
    "driver", "emulation", "explain", "layerwise", "outputs", "precision", "prior", "result",
    "runner", "snippet"))}

PROBE = textwrap.dedent("""
    import importlib, json, pkgutil, sys

    BLOCKED = set(sys.argv[1].split(","))

    class Block:
        '''A finder that makes the blocked packages absent, as on a bare machine.'''
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Block())
    import click, click.testing
    import trtbisect
    from trtbisect.cli import main

    failed = {}
    for m in pkgutil.walk_packages(trtbisect.__path__, "trtbisect."):
        if m.name.endswith("__main__"):  # runs the CLI on import
            continue
        try:
            importlib.import_module(m.name)
        except ImportError as exc:
            failed[m.name] = str(exc)

    def commands(group, path=()):
        yield path
        if isinstance(group, click.Group):
            ctx = click.Context(group)
            for name in group.list_commands(ctx):
                yield from commands(group.get_command(ctx, name), (*path, name))

    runner = click.testing.CliRunner()
    helps = {}
    for path in commands(main):
        r = runner.invoke(main, [*path, "--help"])
        helps[" ".join(path)] = [r.exit_code, r.output[:2000], repr(r.exception)]
    env = runner.invoke(main, ["env", "--json"])
    leaked = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)
    print(json.dumps({"failed": failed, "helps": helps, "env": [env.exit_code, env.output],
                      "leaked": leaked}))
""")


def probe() -> dict:
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", PROBE, ",".join(BLOCKED)], capture_output=True,
                         text=True, cwd=root)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_package_and_every_help_work_without_optional_dependencies():
    r = probe()
    assert set(r["failed"]) <= NEEDS_TORCH, r["failed"]
    assert r["leaked"] == []
    helps = r["helps"]
    assert {"", "run", "compare", "check", "env", "export", "torch"} <= set(helps)
    for cmd, (code, text, exc) in helps.items():
        assert code == 0 and "Usage:" in text, (cmd, text, exc)
    code, text = r["env"]
    rows = {row["component"]: row["usable"] for row in json.loads(text)}
    assert code == 0 and not any(usable for c, usable in rows.items() if "tensorrt" in c.lower())
