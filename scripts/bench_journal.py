#!/usr/bin/env python3
"""What journaling an evaluation costs against the evaluation itself (README: "Journaling
costs under a tenth of an evaluation"). Writes docs/journal_benchmark.md.

Both are timed in this one process on the shipped demo (a ratio inside one run, best of
`--repeats`): the emulator running 20 plans, and the journal's lookup, start and record of the
same 20 plans (real file, real flush, fsync grouped as in a run). The test suite checks what
the journal does per evaluation by counting (tests/search/test_journal.py), never by timing.

    python scripts/bench_journal.py                # writes docs/journal_benchmark.md
    python scripts/bench_journal.py --out /tmp/j.md
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trtbisect.backends.ort import Emulator  # noqa: E402
from trtbisect.data.sources import load_samples  # noqa: E402
from trtbisect.graph import Graph, load_model  # noqa: E402
from trtbisect.search.journal import Journal, plan_key  # noqa: E402

FP = {"model": "m" * 64, "samples": "s" * 64, "tolerance": {"rtol": 0.01}, "strict": False}


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def measure(repeats: int) -> dict[str, float]:
    g = Graph(load_model(ROOT / "models" / "demo.onnx"))
    sample = load_samples(g, [str(ROOT / "models" / "demo_inputs.npz")], {}, 0)[0]
    plans = [frozenset(g.candidates()[:k]) for k in range(20)]
    emu = Emulator(g)
    emu.run(plans[0], sample)  # the session is built once, as in a search
    evaluate = best(lambda: [emu.run(p, sample) for p in plans], repeats) / len(plans)
    with tempfile.TemporaryDirectory() as tmp:
        j = Journal(Path(tmp) / "journal.jsonl", FP)

        def journal_all() -> None:
            for p in plans:
                key = plan_key(p)
                j.lookup(key)
                j.start(key)
                j.record(key, True, {"rel": {"y": 0.00123}, "nonfinite_tensors": []})
        cost = best(journal_all, repeats) / len(plans)
        j.close()
    return {"evaluation_s": evaluate, "journal_s": cost, "ratio": cost / evaluate}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "journal_benchmark.md")
    args = ap.parse_args(argv)
    m = measure(args.repeats)
    text = "\n".join([
        "# What journaling costs",
        "",
        f"Written by `python scripts/bench_journal.py` on {datetime.date.today()} "
        f"({platform.machine()}, {platform.python_version()}): the shipped demo, 20 plans, "
        f"best of {args.repeats}, in one process.",
        "",
        "| one evaluation (emulator) | journaling it (lookup, start, record) | ratio |",
        "|---|---|---|",
        f"| {m['evaluation_s'] * 1e3:.3g} ms | {m['journal_s'] * 1e3:.3g} ms | {m['ratio']:.3g} |",
        "",
        "The suite checks the journal's work per evaluation by counting it (one lookup, two "
        "lines written and flushed once each, no fsync within a second: "
        "`tests/search/test_journal.py::test_journal_costs_under_a_tenth_of_an_evaluation`), not by "
        "timing it, so that it passes on a loaded machine.",
        "",
    ])
    args.out.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
