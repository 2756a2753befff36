"""scripts/bench_workers.py: its section of docs/search_benchmark.md renders from saved rows,
replaces itself, and survives bench_search.py rewriting the page."""

from __future__ import annotations

from tests.conftest import script_module as _script


def _rows() -> list[dict]:
    case = {"name": "m", "model": "m.onnx", "args": [], "nodes": 10, "samples": 2}
    base = {"wall_s": 10.0, "search_s": 4.0, "rss_mib": 100.0, "worker_rss_mib": [],
            "evaluations": 12, "speculative": 0, "verdict": "fixed", "fp32": ["a"],
            "trials": [[["a"], True, "prior"]], "error": ""}
    return [{"case": case, "runs": [
        {**base, "workers": 1, "rounds": 12},
        {**base, "workers": 2, "wall_s": 6.0, "rounds": 7, "speculative": 2,
         "worker_rss_mib": [90.0, 91.0]},
        {**base, "workers": 8, "rounds": 4, "speculative": 9}]}]


def test_the_section_says_ratios_rounds_and_the_simulated_gpus(tmp_path):
    bench = _script("bench_workers")
    text = bench.render(_rows(), ["a note"], build_min=5)
    assert text.startswith(bench.BEGIN) and text.endswith(bench.END)
    assert "| m | 10 | 2 | 12 | 10.0 s | 6.0 s | 0.60 |" in text
    assert "| yes | 100 MiB | 90, 91 MiB |" in text
    assert "| m | 12 | 4 | 9 | yes | 1.0 h | 0.3 h | 3.0x |" in text  # 12 x 5 min, 4 x 5 min
    doc = tmp_path / "page.md"
    doc.write_text("# page\n")
    bench.write_doc(text, doc)
    bench.write_doc(text.replace("a note", "another"), doc)
    assert doc.read_text().count(bench.BEGIN) == 1 and "another" in doc.read_text()
    search = _script("bench_search")
    search.write_page(doc, "# rewritten by bench_search\n")
    assert "another" in doc.read_text() and doc.read_text().startswith("# rewritten")
