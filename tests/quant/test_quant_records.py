"""The quantized road's typed records (#43): QuantResult's `cost`, `certificate` and `fixes`
are frozen records written by `to_json`; each comes back from precision.json's JSON by
`from_json` equal to the run's, and writes the JSON precision.json holds, key for key and in
its order."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest

from tests.models import quant_models as qm
from trtbisect.context import Options
from trtbisect.judge.compare import Tolerance
from trtbisect.quant import run
from trtbisect.quant.cost import (
    CostCertificate,
    CostRow,
    FloatSide,
    QdqKernels,
    QuantCost,
)
from trtbisect.quant.fixes import FixJudged
from trtbisect.search.minimal import CheaperStep

STEP = CheaperStep(({"added": ["mm2"], "removed": []},), 3, 1, 2, 6, False)
CERT = CostCertificate("cost", 2.0e-8, "units adjacent", 2, 1, None, ["mm1"], 2.1e-8, STEP)
COST = QuantCost("l4", "NVIDIA L4", "int8", 3.0e-8, 1.5e-8, 2.0e-8, 0.33, -0.33,
                 QdqKernels(1, 1e-9), QdqKernels(2, 2e-9),
                 [CostRow("mm1", "quantized", 4e-9, 0.26), CostRow("Q/DQ boundaries", "qdq",
                                                                   1e-9, None)],
                 "cost", FloatSide("fp32", 1.2e-8), "this file's float side in FP16", 2.9e-8,
                 1, ["n1"], CERT)


def _back(record):
    """The record through precision.json's text and back."""
    return type(record).from_json(json.loads(json.dumps(record.to_json())))


@pytest.mark.parametrize("record", [
    STEP, CERT, COST, COST.qdq_plan, COST.rows[1], COST.float_side,
    FloatSide("fp16"),  # a file FP16 elsewhere: no FP16-elsewhere figure
    dataclasses.replace(COST, certificate=None),  # --objective count: no certificate
    CostCertificate("cost", 1e-8, "within", 3, 0, limit_s=2e-8),  # priced within a limit
    FixJudged("SmoothQuant", True, {"y": {"max_abs": 0.1, "rel": 0.01}}),
    FixJudged("max calibration", False, error="ONNX Runtime refused the variant"),
], ids=lambda r: type(r).__name__)
def test_each_record_comes_back_from_its_json(record):
    back = _back(record)
    assert back == record
    assert list(back.to_json()) == list(record.to_json())  # the keys in the written order


def test_a_record_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        COST.plan_s = 0.0  # type: ignore[misc]


def test_the_written_json_is_the_records_json(tmp_path):
    """fp16_side(fused=True) under --objective cost: the cheaper step moves the 1-minimal
    plan {mm1} to {mm1, mm2}, so the certificate has every part; the fixes of each plan
    layer are judged. precision.json's "cost" and "fixes_judged" are the records' JSON, and
    read back they are the run's records."""
    p = qm.fp16_side(fused=True)
    model, inputs = tmp_path / "m.onnx", tmp_path / "m.npz"
    onnx.save(p.model, model)
    np.savez(inputs, **p.inputs)
    r = run(model, Options.of(inputs=[str(inputs)], tolerance=Tolerance(p.rtol, 0.0),
                              threads=1, validation_share=0), tmp_path / "out")
    written = json.loads((tmp_path / "out" / "precision.json").read_text())
    assert isinstance(r.cost, QuantCost) and isinstance(r.certificate, CostCertificate)
    assert r.certificate.cheaper is not None and r.certificate.cheaper.moves
    assert r.cost.certificate == r.certificate
    assert QuantCost.from_json(written["cost"]) == r.cost
    assert written["cost"] == r.cost.to_json()
    # precision.json's "cost" as the quantized road has always laid it out
    assert list(written["cost"]) == [
        "gpu", "title", "format", "all_fp16_s", "all_quantized_s", "plan_s",
        "plan_vs_all_quantized", "plan_vs_all_fp16", "qdq_boundaries", "rows", "objective",
        "float_side", "certificate", "all_fp16_from", "file_all_float_s", "file_fp32_nodes",
        "file_fp32_examples"]
    assert list(written["cost"]["certificate"]) == [
        "objective", "price_s", "neighbourhood", "minimal_plan", "minimal_price_s", "cheaper",
        "removals_failed", "swaps_failed"]
    assert r.certificate.removals_failed == len(r.certificate.minimal_plan or ())  # one each
    fixes = {la["name"]: la["fixes_judged"] for la in written["plan"]}
    assert set(fixes) == set(r.plan) and any(fixes.values())
    for name, judged in fixes.items():
        assert [FixJudged.from_json(f) for f in judged] == r.fixes.get(name, [])
        assert judged == [f.to_json() for f in r.fixes.get(name, [])]
    assert [t.to_json() for t in r.trials] == written["trials"]
