"""A run's result is typed (issue #33 item 3): what a verdict records beside the plan (cost,
culprit groups, certificate, margins, ...) are attributes of RunResult, written into
precision.json under their keys, byte for byte as `to_json()` gives them, and read back by
`typed_from_json` as the same attributes. No module reads them back by string."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.models.control_flow_models import all_planted
from trtbisect.context import Options
from trtbisect.pipeline import run
from trtbisect.result import FROM_JSON, JSON_KEY, TYPED, RunResult, as_json

ROOT = Path(__file__).resolve().parents[1]


def _demo(tmp_path):
    return ROOT / "models" / "demo.onnx", ROOT / "models" / "demo_inputs.npz"


def _planted(tmp_path):
    p = all_planted()["if_taken_branch"]
    model, inputs = tmp_path / "if.onnx", tmp_path / "if_inputs.npz"
    onnx.save(p.model, model)
    np.savez(inputs, **p.inputs)
    return model, inputs


@pytest.fixture(scope="module", params=[_demo, _planted], ids=["demo", "if_taken_branch"])
def written(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param.__name__.strip("_"))
    model, inputs = request.param(tmp)
    r = run(str(model), Options.of(inputs=[str(inputs)], workers=1), tmp / "out")
    return r, (tmp / "out" / "precision.json").read_text()


def test_precision_json_is_to_json_byte_for_byte(written):
    r, text = written
    assert r.verdict == "fixed" and r.fp32_nodes  # a plan: every record a plan sets is there
    assert text == json.dumps(r.to_json(), indent=2) + "\n"


def test_the_typed_records_round_trip_through_precision_json(written):
    r, text = written
    data = json.loads(text)
    back = RunResult.typed_from_json(data)
    mine = {a: as_json(getattr(r, a)) for a in TYPED if getattr(r, a) is not None}
    assert set(back) == set(mine)
    for a in ("cost", "culprit_groups", "certificate", "margins", "fragile", "one_judge",
              "judged", "criteria_record", "fp32_layers", "coverage", "precision",
              "semantics"):
        assert a in back, a  # every record a fixed run sets, under its key
    assert json.loads(json.dumps(mine)) == as_json(back)  # the same values, as JSON holds them
    for a, make in FROM_JSON.items():  # a frozen record read back is the record again
        if a in back:
            assert type(back[a]) is type(getattr(r, a)), a
            again, value = make(as_json(getattr(r, a))), getattr(r, a)
            if _nan(value):  # NaN equals no NaN but itself: the same record by its JSON
                assert json.dumps(as_json(again)) == json.dumps(as_json(value)), a
            else:
                assert again == value, a
    assert back["certificate"] == r.certificate  # floats and all, through JSON's text
    # every frozen record comes back as itself, in a list or a dict of them too
    for a in back:
        value = getattr(r, a)
        one = (next(iter(value.values()), None) if isinstance(value, dict)
               else value[0] if isinstance(value, list) and value else value)
        if dataclasses.is_dataclass(one):
            assert a in FROM_JSON, a
    assert {"margins", "aimed_searches", "criterion_hints", "culprit_groups",
            "errors_before_strict", "validation"} <= set(FROM_JSON)  # lists, dicts
    assert back["culprit_groups"] == r.culprit_groups
    assert data["criteria"]["description"] == r.criteria_record.description
    assert data["fragile"] is r.fragile is False
    assert data["margins"] == {k: m.to_json() for k, m in r.margins.items()}


def _nan(value: object) -> bool:
    """A record holding a NaN somewhere (written "nan" in its JSON)."""
    return '"nan"' in json.dumps(as_json(value))


def test_precision_json_keeps_the_order_a_run_sets_its_records_in(written):
    _, text = written
    keys = list(json.loads(text))
    order = [JSON_KEY.get(k, k) for k in TYPED]
    recorded = [k for k in keys if k in order]
    assert recorded == sorted(recorded, key=order.index)
    assert keys[:keys.index("seconds") + 1][-1] == "seconds"  # records follow the plan's fields
    assert keys.index("semantics") == keys.index("seconds") + 1


def test_no_module_reads_a_typed_record_by_string():
    keys = "|".join(sorted({JSON_KEY.get(a, a) for a in TYPED}))
    pattern = re.compile(r"""extra(\[|\.get\(|\.setdefault\(|\.pop\()\s*["'](""" + keys + r""")["']""")
    found = [f"{p.relative_to(ROOT)}:{i}"
             for p in sorted((ROOT / "trtbisect").rglob("*.py"))
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if pattern.search(line)]
    assert found == []
    # and the pattern does find the old way of reading them
    assert pattern.search('result.extra.get("cost")') and pattern.search("r.extra['margins']")


def test_the_records_the_console_and_reports_read_are_frozen_and_read_by_attribute(written):
    """The precision, the semantics, the margins, the one-judge record, the criteria and their verdicts,
    the validation (and `partial`, set on a graph not wholly judged) are frozen records;
    precision.json writes them by their `to_json`; no module reads them as dicts any more."""
    import dataclasses

    from trtbisect.judge.criteria import Verdict
    from trtbisect.judge.precision import FP16
    from trtbisect.judge.semantics import Record as SemanticsRecord
    from trtbisect.judge.validation import Validation
    from trtbisect.result import (
        CertificateRecord,
        CriteriaRecord,
        JudgedRecord,
        Margin,
        OneJudge,
    )
    from trtbisect.search.cost import CostRecord

    r, text = written
    data = json.loads(text)
    assert r.precision is FP16 and data["precision"] == FP16.to_json()
    assert isinstance(r.semantics, SemanticsRecord) and r.semantics.semantics == "trt"
    assert data["semantics"] == r.semantics.to_json() and data["semantics"]["rules"]
    assert isinstance(r.one_judge, OneJudge) and r.one_judge.search_equals_check
    assert data["one_judge"] == {"search_equals_check": True,
                                 "search_errors": r.one_judge.search_errors}
    assert r.margins and all(isinstance(m, Margin) for m in r.margins.values())
    assert isinstance(r.validation, Validation) and data["validation"] == r.validation.to_json()
    assert isinstance(r.criteria_record, CriteriaRecord) and isinstance(r.judged, JudgedRecord)
    assert isinstance(r.judged.after, Verdict) and r.judged.shown is r.judged.after
    assert data["judged"] == {"before": r.judged.before.to_json(),
                              "after": r.judged.after.to_json()}
    assert data["judged"]["after"]["passed_samples"] == sum(r.judged.after.samples) >= 1
    assert r.judged.after.errors == {}  # written beside it: errors_after
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.one_judge.search_equals_check = False  # type: ignore[misc]
    cert = r.certificate
    assert isinstance(cert, CertificateRecord) and data["certificate"] == cert.to_json()
    assert cert.certified is (not r.fragile) and {*cert.outputs, *cert.scores} == set(r.margins)
    assert all(m.margin == r.margins[o].margin for o, m in cert.outputs.items())
    with pytest.raises(dataclasses.FrozenInstanceError):
        cert.decided = "x"  # type: ignore[misc]
    assert isinstance(r.cost, CostRecord) and data["cost"] == r.cost.to_json()
    assert set(r.cost.units) <= set(r.fp32_layers) and r.cost.plan_layers == len(r.cost.units)
    assert data["cost"][f"all_{r.cost.precision}_s"] == r.cost.all_low_s > 0
    as_dict = re.compile(r"""\.(precision|partial|one_judge|margins|validation|judged|"""
                         r"""criteria_record|certificate|certified|cost) or \{\}\)|"""
                         r"""(one_judge|partial|margin|certificate|certified|\.cost)\[["']""")
    found = [f"{p.relative_to(ROOT)}:{i}"
             for p in sorted((ROOT / "trtbisect").rglob("*.py")) if "quant" not in p.parts
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if as_dict.search(line)]
    assert found == []


def test_the_workers_record_writes_either_form_as_it_read_it():
    """stages/batch.summary's two forms: judged in this process (why), or on a pool."""
    from trtbisect.result import WorkersRecord

    note = {"workers": 1, "chosen": "1 CPU core"}
    assert WorkersRecord.from_json(note).to_json() == note
    assert WorkersRecord.from_json(note).backend is None
    pool = {"workers": 2, "backend": "local", "threads": None, "chosen": "asked",
            "inferences_run": 9, "tasks": 4, "seconds_waiting": 0.5, "replaced": 1,
            "peak_rss_mib": [10.5, 11.0], "rounds": 3, "evaluations": 5, "speculative": 1}
    got = WorkersRecord.from_json(pool)
    assert list(got.to_json().items()) == list(pool.items()) and got.replaced == 1
