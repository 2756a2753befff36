"""Criteria as data (judge/criteria.py): without a criterion flag the judge is today's, bit for
bit; each criterion's numbers are, bit for bit, what `check` says of the written file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import save_zoo_model
from trtbisect import pipeline
from trtbisect.context import Options
from trtbisect.judge.compare import Tolerance, compare_outputs
from trtbisect.judge.criteria import Criteria, Judgement, Verdict
from trtbisect.pipeline import run

ROOT = Path(__file__).parents[2]
VOLATILE = ("seconds", "stages", "files", "renderings", "workdir", "criteria", "judged")


def _scrub(d):
    if isinstance(d, dict):
        return {k: _scrub(v) for k, v in d.items() if k not in VOLATILE}
    if isinstance(d, list):
        return [_scrub(v) for v in d]
    return d


def _legacy_judge(monkeypatch) -> None:
    """The judge as it was before criteria existed: compare_outputs per sample, the plan
    passes when every output of every sample does (compare.py, unchanged)."""
    def judge(self, ref, got, sample, tol):
        return Judgement(compare_outputs(ref, got, tol))

    def verdict(self, judged):
        from trtbisect.judge.compare import worst
        ok = all(e.passed for j in judged for e in j.errors.values())
        return Verdict(ok, worst(j.errors for j in judged), (), tuple(j.passed for j in judged),
                       tuple(0.0 for _ in judged), len(judged))

    def hopeless(self, judged, total):
        return not all(e.passed for e in judged[-1].errors.values())

    monkeypatch.setattr(Criteria, "judge", judge)
    monkeypatch.setattr(Criteria, "verdict", verdict)
    monkeypatch.setattr(Criteria, "hopeless", hopeless)


def _cases(zoo, tmp_path):
    for name in ("layernorm_overflow", "two_outputs", "attention_logits", "healthy",
                 "precision_loss"):
        model, inputs = save_zoo_model(zoo[name], tmp_path / name)
        yield name, model, dict(inputs=[str(inputs)])
    yield "zoo_random", save_zoo_model(zoo["eps_underflow"], tmp_path / "r")[0], dict(samples=3)
    yield "demo", ROOT / "models" / "demo.onnx", dict(
        inputs=[str(ROOT / "models" / "demo_inputs.npz")])


def test_no_criterion_flag_is_todays_judge_bit_for_bit(zoo, tmp_path, monkeypatch):
    """Plans, evaluations and every number of precision.json (and `check` of the written
    file) equal those of the judge before criteria, computed here by that judge."""
    for name, model, kw in _cases(zoo, tmp_path):
        for semantics in ("trt", "strict"):
            outs = {}
            for which in ("criteria", "legacy"):
                with monkeypatch.context() as m:
                    if which == "legacy":
                        _legacy_judge(m)
                    out = tmp_path / f"{name}-{semantics}-{which}"
                    r = run(model, Options.of(semantics=semantics, **kw), out)
                    plan = json.loads((out / "precision.json").read_text())
                    checked = None
                    if "mixed_model" in r.files:
                        checked = pipeline.check_mixed(r.files["mixed_model"], model,
                                                       Options.of(semantics=semantics, **kw))
                        checked = {k: e.to_json() for k, e in checked.errors.items()}
                    outs[which] = (_scrub(plan), checked)
            assert outs["criteria"] == outs["legacy"], (name, semantics)
            assert outs["criteria"][0]["evaluations"] >= 0


def test_default_criteria_judge_is_compare_outputs(zoo):
    """Per sample and output, the default judge's OutputError is compare_outputs' (no scores
    attached, JSON unchanged)."""
    from trtbisect.backends.ort import Emulator, Reference
    from trtbisect.graph import Graph
    crit, tol = Criteria(), Tolerance(rtol=3e-3, atol=1e-6)
    for z in zoo.values():
        if z.expected_verdict == "reference_invalid":
            continue
        g = Graph(z.model)
        ref = Reference(g).run(z.inputs)
        got = Emulator(g).run(frozenset(), z.inputs)
        j = crit.judge(ref, got, z.inputs, tol)
        legacy = compare_outputs(ref, got, tol)
        assert repr(j.errors) == repr(legacy)  # nan-safe equality, field by field
        assert not any(e.scores for e in j.errors.values())
        assert {k: e.to_json() for k, e in j.errors.items()} == \
            {k: e.to_json() for k, e in legacy.items()}
        assert j.passed == all(e.passed for e in legacy.values())


@pytest.mark.parametrize("rate, passes", [(1.0, False), (0.75, True), (0.8, False)])
def test_pass_rate_counts_samples(rate, passes):
    """A plan passes when at least ceil(rate * samples) samples pass."""
    crit = Criteria(pass_rate=rate)
    ok = {"y": np.ones(4, np.float32)}
    bad = {"y": np.array([1, 1, 1, 2], np.float32)}
    judged = [crit.judge(ok, g, {}, Tolerance()) for g in (ok, ok, ok, bad)]
    v = crit.verdict(judged)
    assert v.passed is passes and v.samples == (True, True, True, False)
    assert v.required == {1.0: 4, 0.75: 3, 0.8: 4}[rate]
    assert crit.hopeless(judged, 4) is not passes


HOOK = ("import numpy as np\n"
        "def check(fp32, fp16, sample):\n"
        "    ok = all(np.isfinite(fp16[k]).all() for k in fp16)\n"
        "    d = max(float(np.abs(fp32[k] - fp16[k]).max()) for k in fp16) if ok else 1e9\n"
        "    return bool(ok and d < 5.0), d\n")

KINDS = {
    "max": ["--check-error-stat", "max", "--atol", "1e-3"],
    "quantile": ["--check-error-stat", "quantile", "--error-quantile", "0.9"],
    "elemwise+mean": ["--check-error-stat", "elemwise", "--check-error-stat", "out_a:mean",
                      "--rtol", "0.1", "--atol", "0.05"],
    "median": ["--check-error-stat", "median"],
    "cosine": ["--metric", "cosine:0.9999"],
    "snr": ["--metric", "snr:50"],
    "topk": ["--metric", "out_a:topk:1", "--metric", "out_b:topk:2:1:0.9"],
    "iou": ["--metric", "iou:0.5:0.99"],
    "check": ["--check", "HOOK"],
    "pass-rate": ["--samples", "4", "--pass-rate", "0.5", "--check-error-stat", "quantile"],
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_number_the_run_reports_is_what_check_says_of_its_file(zoo, tmp_path, kind):
    """For each kind of criterion: the run's numbers for its plan (per output and per sample,
    the hooks' scores included) are, bit for bit through JSON, `check`'s of the written file
    given the same flags; and the search measured the same on its own emulator."""
    from tests.test_cli import invoke
    model, inputs = save_zoo_model(zoo["two_outputs"], tmp_path)
    (tmp_path / "hook.py").write_text(HOOK)
    flags = [str(tmp_path / "hook.py") if f == "HOOK" else f for f in KINDS[kind]]
    data = [] if "--samples" in flags else ["--inputs", str(inputs)]
    r = invoke("-q", "run", model, *data, *flags, "--out", tmp_path / "o", "--json")
    assert r.exit_code in (0, 4), r.output
    plan = json.loads(r.output)
    assert plan["verdict"] in ("fixed", "fp16_ok"), plan["verdict"]
    assert plan["one_judge"]["search_equals_check"]
    c = invoke("check", plan["files"]["mixed_model"], "--reference", model, *data, *flags,
               "--json")
    checked = json.loads(c.output)
    assert c.exit_code == 0 and checked["passed"]
    assert plan["errors_after"] == checked["errors"]
    assert plan["judged"]["after"] == checked["judged"]
    if kind != "pass-rate":
        assert all(e["scores"] for e in plan["errors_after"].values())
