"""scripts/page_image.py and scripts/bench_constants.py: the benchmark input is deterministic and
the benchmark's section of docs/search_benchmark.md survives bench_search.py rewriting the page."""

from __future__ import annotations

import numpy as np

from tests.conftest import script_module


def test_the_page_is_the_same_every_time_and_holds_text():
    page = script_module("page_image")
    a, b = page.page_input(640, 640), page.page_input(640, 640)
    assert a.shape == (1, 3, 640, 640) and a.dtype == np.float32
    assert np.array_equal(a, b)
    pixels = page.page_pixels(640, 640)
    ink = np.count_nonzero(pixels[..., 0] < 128)
    assert 0.01 < ink / pixels[..., 0].size < 0.2  # text, on a mostly white page
    white = (1.0 - page.MEAN) / page.STD
    np.testing.assert_allclose(a[0, :, 0, 0], white, rtol=1e-6)


def test_bench_search_keeps_the_constants_section(tmp_path):
    search, constants = script_module("bench_search"), script_module("bench_constants")
    doc = tmp_path / "page.md"
    doc.write_text("# old page\n\nold table\n")
    section = "\n".join([constants.BEGIN, "## measured", "| a |", constants.END])
    constants.write_doc(section, doc)
    constants.write_doc(section.replace("| a |", "| b |"), doc)  # replaced, not appended
    assert doc.read_text().count(constants.BEGIN) == 1 and "| b |" in doc.read_text()
    doc.write_text(doc.read_text() + "\n<!-- bench_cost: begin -->\ncost\n<!-- bench_cost: end -->\n")
    search.write_page(doc, "# new page\n\nnew table\n")
    text = doc.read_text()
    assert text.startswith("# new page") and "old table" not in text and "| b |" in text
    assert text.count("<!-- bench_cost: begin -->\ncost\n<!-- bench_cost: end -->") == 1
