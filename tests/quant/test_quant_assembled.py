"""The quantized road's result is assembled once (#43): its steps return frozen records,
quant/run.py `assemble` builds the QuantResult from them in one call, the verdict decided
there over every finding at once (judge/verdict.decide), and nothing assigns a field after."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest

from tests.models import quant_models as qm
from trtbisect.context import Options
from trtbisect.judge.compare import Tolerance
from trtbisect.judge.criteria import Criteria, Verdict
from trtbisect.judge.validation import Validation
from trtbisect.outputs.quantized import Reproduction
from trtbisect.quant.run import (
    Certification,
    FileJudged,
    Searched,
    Start,
    assemble,
    run,
)
from trtbisect.result import VERDICT_EXIT, CertificateRecord

START = Start("m.onnx", [], "the model with its Q/DQ removed", False, "trt", 1,
              Tolerance(0.03, 0.0), Criteria(), [])


def _verdict(passed: bool) -> Verdict:
    return Verdict(passed, {}, (), (passed,), (0.0 if passed else 2.0,), 1)


def _cert(certified: bool, validated: bool | None) -> Certification:
    validation = (Validation("none", "validation turned off") if validated is None else
                  Validation("held_out", "1 held-out sample(s) (#1)", verdict=_verdict(validated),
                             indices=[1]))
    return Certification(CertificateRecord(certified, 0, {}, {}), validation,
                         () if certified else ("y",))


# (proposed, the written file passes, its certificate, its validation) -> the verdict, in
# judge/verdict.py's order: a failing file is never called fixed, then the margin, then the
# samples never searched; the file as given is held to the same certificate and validation
@pytest.mark.parametrize("proposed, file_passed, certified, validated, verdict", [
    ("fixed", False, None, None, "no_plan"),
    ("fixed", True, False, False, "fragile"),
    ("fixed", True, True, False, "unvalidated"),
    ("fixed", True, True, True, "fixed"),
    ("fixed", True, True, None, "fixed"),
    ("quantized_ok", None, False, True, "fragile"),
    ("quantized_ok", None, True, False, "unvalidated"),
    ("quantized_ok", None, True, None, "quantized_ok"),
    ("no_plan", None, None, None, "no_plan"),
    ("reference_invalid", None, None, None, "reference_invalid"),
])
def test_one_decision_over_every_finding(proposed, file_passed, certified, validated, verdict):
    cert = _cert(certified, validated) if certified is not None else None
    written = (FileJudged(_verdict(file_passed), cert) if file_passed is not None else None)
    r = assemble(START, Searched(None, 1, None, proposed), {}, written=written,
                 given=cert if written is None else None)
    assert r.verdict == verdict and r.exit_code == VERDICT_EXIT[verdict]
    assert r.verdict_findings is not None and r.verdict_findings.proposed == proposed
    assert r.verdict_findings.file_passed is file_passed
    assert (r.certified, r.validation) == ((cert.certified, cert.validation) if cert
                                           else (None, None))
    assert r.after == (written.after if written is not None else None)


def test_the_result_is_frozen_and_precision_json_is_the_returned_one(tmp_path):
    """No field of the run's result is assigned once it is built (the written paths come by
    dataclasses.replace), and precision.json is the returned result's JSON, files and all."""
    p = qm.outlier()
    model, inputs = tmp_path / "m.onnx", tmp_path / "m.npz"
    onnx.save(p.model, model)
    np.savez(inputs, **p.inputs)
    r = run(model, Options.of(inputs=[str(inputs)], tolerance=Tolerance(p.rtol, 0.0),
                              threads=1, validation_share=0), tmp_path / "out")
    assert r.plan == ["mm1"] and r.files["mixed_qdq_model"] and r.files["plan"]
    assert json.loads((tmp_path / "out" / "precision.json").read_text()) == json.loads(
        json.dumps(r.to_json()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.verdict = "fixed"
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.after = None
    with pytest.raises(ValueError):  # Found's errors after are those of `after`, always
        dataclasses.replace(r, after=r.before)
    again = dataclasses.replace(r, seconds=0.0)
    assert again.seconds == 0.0 and again.verdict == r.verdict
    assert r.verdict in ("fixed", "fragile")  # fragile under ORT's own QDQ fusions


def test_modelopts_file_is_kept_in_out_and_recorded_where_it_lies(tmp_path, monkeypatch,
                                                                    capsys):
    """A file trtbisect quantized (owned): ModelOpt's file of the rendered exclusions
    (quant/ptq.py `reproduce`, faked here: ModelOpt is optional) is copied into --out, and
    the result, precision.json and the console all name it there."""
    from trtbisect.quant import ptq
    from trtbisect.quant.console import emit
    from trtbisect.quant.qdq import analyse, unquantize

    p = qm.outlier()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    model, inputs, fp32 = scratch / "m.onnx", tmp_path / "m.npz", tmp_path / "fp32.onnx"
    onnx.save(p.model, model)
    onnx.save(unquantize(p.model, analyse(p.model)), fp32)
    np.savez(inputs, **p.inputs)

    def reproduce(given, judge, fp32_path, source):
        out = source.parent / f"{fp32_path.stem}.modelopt.onnx"
        onnx.save(onnx.load(str(fp32_path)), str(out))
        return Reproduction(True, path=str(out), exact=True, passed=True)
    monkeypatch.setattr(ptq, "reproduce", reproduce)
    r = run(model, Options.of(inputs=[str(inputs)], tolerance=Tolerance(p.rtol, 0.0),
                              threads=1, validation_share=0), tmp_path / "out",
            reference_path=fp32, owned=True)
    kept = str(tmp_path / "out" / "fp32.modelopt.onnx")
    assert r.reproduction is not None
    assert r.files["modelopt_model"] == kept == r.reproduction.path
    assert r.renderings["modelopt_reproduction"]["path"] == kept
    assert onnx.load(kept).graph.output[0].name == "y"
    written = json.loads((tmp_path / "out" / "precision.json").read_text())
    assert written["files"]["modelopt_model"] == kept
    assert written["renderings"]["modelopt_reproduction"]["path"] == kept
    capsys.readouterr()
    emit(r, as_json=False)
    said = "".join(capsys.readouterr().out.split())  # the console wraps long paths
    assert f"ModelOptgiventheseexclusions({kept}):theplan'squantizedlayersexactly" in said
