"""Detection is data: cause and pattern names, graph names and numbers, never a sentence
(wording.py owns the sentences). Checked on the planted-fault zoo, where the numbers are known."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trtbisect.backends.ort import Reference
from trtbisect.context import Context, Options
from trtbisect.diagnosis.detect import CAUSES, detect, flushed_at, group_culprits, node_numbers
from trtbisect.diagnosis.facts import Facts
from trtbisect.graph import Graph
from trtbisect.judge.compare import FP16_MAX
from trtbisect.search.prior import constant_stats
from trtbisect.stages.layerwise import layerwise

IDENT = re.compile(r"^[a-z][a-z0-9_]*$")


def _facts(z) -> Facts:
    g = Graph(z.model)
    ctx = Context(Path("m.onnx"), z.model, g, [dict(z.inputs)], [Reference(g).run(dict(z.inputs))],
                  "0" * 64)
    strict = Options.of(semantics="strict")
    return Facts(g, layerwise(ctx, strict.judge, strict.search), constant_stats(g))


def _names(g: Graph) -> set[str]:
    nodes = list(g.model.graph.node)
    return {*g.names, *g.initializers, *(n.op_type for n in nodes),
            *(t for n in nodes for t in [*n.input, *n.output])}


@pytest.mark.parametrize("name", ["layernorm_overflow", "reducesum_overflow", "attention_logits",
                                  "eps_underflow", "constant_out_of_range", "precision_loss"])
def test_detection_returns_names_and_numbers_only(zoo, name):
    z = zoo[name]
    f = _facts(z)
    names = _names(f.g)
    for group in group_culprits(f.g, sorted(z.expected_fp32)):
        cause, pattern, ev = detect(f, group)
        assert cause in CAUSES
        assert pattern is None or IDENT.match(pattern)
        for key, value in ev.items():
            assert IDENT.match(key), key
            if isinstance(value, str):
                assert value in names or value in ("inf", "-inf"), (key, value)
            else:
                assert value is None or isinstance(value, (int, float)), (key, value)


def test_detected_numbers_are_the_planted_ones(zoo):
    f = _facts(zoo["layernorm_overflow"])
    [group] = group_culprits(f.g, sorted(zoo["layernorm_overflow"].expected_fp32))
    cause, pattern, ev = detect(f, group)
    assert (cause, pattern) == ("overflow", "layernorm_decomposed")
    assert ev["fp32_absmax"] == f.stats[str(ev["tensor"])].fp32_absmax > FP16_MAX
    assert ev["factor"] == pytest.approx(float(ev["fp32_absmax"]) / FP16_MAX)  # type: ignore[arg-type]
    nn = node_numbers(f, str(ev["node"]))
    assert nn.op == ev["op"] and nn.output_absmax == ev["fp32_absmax"]


def test_flushed_epsilon_is_found_as_data(zoo):
    f = _facts(zoo["eps_underflow"])
    hits = [h for n in sorted(zoo["eps_underflow"].expected_fp32) if (h := flushed_at(f, n))]
    assert hits and all(isinstance(v, (int, float, str)) for h in hits for v in h.values())
    const = next(h for h in hits if "constant" in h)
    assert 0 < float(const["value"]) < 6e-8  # type: ignore[arg-type]
