"""One benchmark's marked section of a docs page, replaced in place on every rerun.

Each benchmark script writes its results between its own `<!-- name: begin -->` and
`<!-- name: end -->` markers, so several scripts share one page (docs/search_benchmark.md) and
a rerun of one never drops another's section.
"""

from __future__ import annotations

from pathlib import Path


def replace_section(doc: Path, text: str, begin: str, end: str, empty: str = "") -> None:
    """Put `text` (which starts with `begin` and ends with `end`) where the page has its
    markers, or append it; `empty`: the page to start from when `doc` does not exist."""
    old = doc.read_text(encoding="utf-8") if doc.exists() else empty
    text = text.rstrip("\n")
    if begin in old and end in old:
        new = old[:old.index(begin)] + text + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n" if old.strip() else text + "\n"
    doc.write_text(new, encoding="utf-8")
