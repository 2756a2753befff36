"""The README's demo output, from a real run of the demo (issue #37: it had gone stale).

    python scripts/readme_demo.py --write   # rerun the demo, put its output in README.md
    python scripts/readme_demo.py           # exit 1 when README.md shows what the demo no
                                            # longer prints (tests/outputs/test_readable.py checks it too)

The demo runs in a temporary folder, as the README's command says, on a 100-column console.
The check compares what the block claims, robustly: the command, the verdict line, the order of
the sections and every number the block shows must be what the demo prints now (the seconds
aside); a new line elsewhere (another row, another note) does not fail it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "trtbisect run models/demo.onnx --inputs models/demo_inputs.npz --out runs/demo"
WIDTH = 100
SECTION = re.compile(r"^(verdict:|Nodes to keep|Outputs|\d+\. |estimated engine time|"
                     r"\d+ evaluations?|judged on|plan:|mixed ONNX|commands:|annotated ONNX)")
NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?%?(?![\w])")
SECONDS = re.compile(r"\b\d+(?:\.\d+)?s\b")


def demo_output(python: str = sys.executable) -> str:
    """What `COMMAND` prints on stdout, run from a fresh folder holding models/."""
    with tempfile.TemporaryDirectory(prefix="trtbisect-readme-") as tmp:
        shutil.copytree(ROOT / "models", Path(tmp) / "models")
        env = {**os.environ, "COLUMNS": str(WIDTH), "PYTHONPATH": str(ROOT)}
        done = subprocess.run([python, "-m", "trtbisect", "-q", *COMMAND.split()[1:]],
                              cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"the demo exited {done.returncode}: {done.stderr.strip()}")
    return "".join(line.rstrip() + "\n" for line in done.stdout.splitlines())


def readme_block(readme: str) -> str:
    """The fenced block that starts with `$ COMMAND`, its lines after the command."""
    start = readme.index(f"```\n$ {COMMAND}\n") + len(f"```\n$ {COMMAND}\n")
    return readme[start:readme.index("```", start)]


def write(readme_path: Path, output: str) -> None:
    readme = readme_path.read_text(encoding="utf-8")
    old = readme_block(readme)
    readme_path.write_text(readme.replace(f"$ {COMMAND}\n{old}", f"$ {COMMAND}\n{output}", 1),
                           encoding="utf-8")


def differences(block: str, output: str) -> list[str]:
    """What the README block claims that the demo does not print (empty: it agrees)."""
    shown, real = block.splitlines(), output.splitlines()
    out = []
    if shown[:1] != real[:1]:
        out.append(f"verdict: README {shown[:1]}, demo {real[:1]}")
    sections = [s for s in (SECTION.match(line) for line in shown) if s]
    real_sections = [s for s in (SECTION.match(line) for line in real) if s]
    if [s.group(1) for s in sections] != [s.group(1) for s in real_sections]:
        out.append(f"sections: README {[s.group(1) for s in sections]}, demo "
                   f"{[s.group(1) for s in real_sections]}")
    numbers = set(NUMBER.findall(SECONDS.sub("", output)))
    stale = [n for n in NUMBER.findall(SECONDS.sub("", block)) if n not in numbers]
    if stale:
        out.append(f"numbers the demo no longer prints: {', '.join(dict.fromkeys(stale))}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update README.md")
    args = parser.parse_args()
    output = demo_output()
    readme = ROOT / "README.md"
    if args.write:
        write(readme, output)
        return 0
    problems = differences(readme_block(readme.read_text(encoding="utf-8")), output)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
