#!/usr/bin/env python3
"""A refactoring changes no behaviour: the same runs at two commits give the same files.

Runs `trtbisect run` on the shipped demo, magika and all-MiniLM-L3 (with `--report`, so the
report pages are compared too) once with the code of a base commit and once with the working
tree, each in a child process, and compares what they wrote:

* precision.json, with what must differ taken out: absolute paths (the run folder and the
  checkout appear in them), wall times (`seconds`, `stages`' times) and the tool's version line;
* every other file byte for byte, except the report pages and the journal, whose timings and
  paths are normalized the same way before comparing;
* the console's stdout.

    python scripts/same_behaviour.py --base 5dcd431            # the three models
    python scripts/same_behaviour.py --base HEAD~3 --only demo

Exit 0 when everything matches, 1 with the differences listed otherwise. The models come from
`scripts/fetch_models.py`'s cache (.bench_cache); a model that is not there is skipped, said so.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("demo", "magika", "minilm_l3")
TIMING_KEYS = {"seconds", "wall_seconds", "elapsed", "started", "finished", "duration"}


def _inputs(name: str, work: Path) -> tuple[Path, list[str]] | None:
    """The model file and the run's input flags; None when the model is not cached."""
    if name == "demo":
        return ROOT / "models" / "demo.onnx", []
    sys.path.insert(0, str(ROOT / "scripts"))
    from fetch_models import MODELS as SPECS  # the script beside this one
    from fetch_models import FetchError, fetch

    try:
        path = fetch(name, quiet=True)
    except (FetchError, OSError) as exc:
        print(f"{name}: skipped ({str(exc).splitlines()[0]})", file=sys.stderr)
        return None
    import numpy as np

    npz = work / f"{name}.npz"
    np.savez(npz, **SPECS[name].make_inputs(seed=0))
    return Path(path), ["--inputs", str(npz)]


def _run(tree: Path, model: Path, flags: list[str], out: Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
    proc = subprocess.run([sys.executable, "-m", "trtbisect", "run", str(model), *flags,
                           "--out", str(out), "--report", "--workers", "1"],
                          cwd=tree, env=env, capture_output=True, text=True)
    return f"exit {proc.returncode}\n{proc.stdout}"


def _normal(value, roots: list[str]):
    """`value` with paths and timings taken out."""
    if isinstance(value, dict):
        return {k: ("<t>" if k in TIMING_KEYS else _normal(v, roots)) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v, roots) for v in value]
    if isinstance(value, str):
        return _text(value, roots)
    return value


def _text(s: str, roots: list[str]) -> str:
    for r in roots:
        s = s.replace(r, "<root>")
    s = re.sub(r"\b\d+(\.\d+)?\s?(s|ms|min)\b", "<t>", s)  # timings written into prose
    return s


def _compare(a: Path, b: Path, roots: list[str]) -> list[str]:
    diffs = []
    names = sorted({p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()}
                   | {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file()})
    for rel in names:
        pa, pb = a / rel, b / rel
        if not (pa.exists() and pb.exists()):
            diffs.append(f"{rel}: only in {'base' if pa.exists() else 'working tree'}")
            continue
        if rel.startswith(".cache/") or rel.endswith((".png", ".svg", ".lock")):
            continue  # the reference cache (keyed by paths), plots (timings drawn), the lock
        if rel.endswith(".json"):
            ja = _normal(json.loads(pa.read_text()), roots)
            jb = _normal(json.loads(pb.read_text()), roots)
            if ja != jb:
                ta = json.dumps(ja, indent=1, sort_keys=True).splitlines()
                tb = json.dumps(jb, indent=1, sort_keys=True).splitlines()
                diffs.append(f"{rel}:\n" + "\n".join(list(difflib.unified_diff(
                    ta, tb, "base", "tree", lineterm="", n=1))[:40]))
        elif rel.endswith((".md", ".html", ".jsonl", ".sh", ".txt", ".py")):
            ta, tb = _text(pa.read_text(), roots), _text(pb.read_text(), roots)
            if ta != tb:
                diffs.append(f"{rel}:\n" + "\n".join(list(difflib.unified_diff(
                    ta.splitlines(), tb.splitlines(), "base", "tree", lineterm="", n=1))[:40]))
        elif pa.read_bytes() != pb.read_bytes():
            diffs.append(f"{rel}: bytes differ")
    return diffs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit before the change")
    ap.add_argument("--only", action="append", choices=MODELS)
    args = ap.parse_args()
    failed = False
    with tempfile.TemporaryDirectory(prefix="same_behaviour_") as tmp:
        work = Path(tmp)
        base_tree = work / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q",
                        str(base_tree), args.base], check=True)
        try:
            for name in args.only or MODELS:
                found = _inputs(name, work)
                if found is None:
                    continue
                model, flags = found
                runs = {}
                for label, tree in (("base", base_tree), ("tree", ROOT)):
                    out = work / "out" / name
                    if out.exists():
                        subprocess.run(["rm", "-rf", str(out)], check=True)
                    console = _run(tree, model, flags, out)
                    kept = work / label / name
                    kept.parent.mkdir(parents=True, exist_ok=True)
                    if out.exists():
                        out.rename(kept)
                    else:
                        kept.mkdir()
                    runs[label] = (console, kept)
                roots = [str(work / "out" / name), str(base_tree), str(ROOT), str(work)]
                diffs = _compare(runs["base"][1], runs["tree"][1], roots)
                if _text(runs["base"][0], roots) != _text(runs["tree"][0], roots):
                    diffs.append("console output differs:\n" + "\n".join(difflib.unified_diff(
                        runs["base"][0].splitlines(), runs["tree"][0].splitlines(), lineterm="")))
                files = sum(1 for p in runs["tree"][1].rglob("*") if p.is_file())
                print(f"{name}: {'same' if not diffs else 'DIFFERENT'} "
                      f"({files} files; {runs['tree'][0].splitlines()[0]})")
                for d in diffs:
                    print("  " + d.replace("\n", "\n  "))
                failed |= bool(diffs)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(base_tree)], check=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
