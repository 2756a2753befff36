"""The noise floor: plans whose margin is inside it are flagged, robust ones are not, and a
nondeterministic backend is caught."""

from __future__ import annotations

import json

import numpy as np

from tests.conftest import save_zoo_model
from trtbisect.context import Options
from trtbisect.judge.compare import Tolerance
from trtbisect.pipeline import run
from trtbisect.result import RunResult
from trtbisect.stages.stability import jittered, measure_stability

X = np.linspace(-1.0, 1.0, 64, dtype=np.float32)  # max |ref| = 1, so the bound is rtol
SAMPLE = {"x": X, "ids": np.arange(4, dtype=np.int64)}


def reference(s):
    return {"y": s["x"]}


def candidate(plan, s):
    """'edge' errs at 0.99 of the bound, plus a term that grows with how far the input moved
    (a sensitive computation); 'robust' errs at 0.1 of the bound whatever the input."""
    moved = float(np.abs(s["x"] - X).max())
    err = 0.0099 + 40 * moved if "edge" in plan else 0.001
    return {"y": s["x"] + err}


def test_jitter_moves_floats_only_and_at_rounding_level():
    copies = jittered(SAMPLE, 3, 2.0**-11, seed=0)
    assert len(copies) == 3
    for c in copies:
        assert np.array_equal(c["ids"], SAMPLE["ids"]) and c["x"].dtype == np.float32
        rel = np.abs(c["x"] - X)[X != 0] / np.abs(X[X != 0])
        assert 0 < rel.max() < 2.0**-11 * 6


def test_edge_plan_flips_and_robust_plan_does_not():
    st = measure_stability(reference, candidate,
                           {"edge": frozenset({"edge"}), "robust": frozenset()},
                           [SAMPLE], Tolerance(rtol=0.01), runs=5)
    edge, robust = st.plans
    assert edge.outputs["y"].judged < 1.0  # what the search saw: a pass
    assert edge.flips and edge.fragile  # a copy moved by ~1 rounding step fails
    assert not robust.flips and not robust.fragile
    assert robust.outputs["y"].noise < 1e-3 and robust.outputs["y"].margin > 0.8
    assert st.deterministic
    assert any("edge" in f and "fails" in f for f in st.flags)
    js = st.to_json()
    assert js["plans"][0]["outputs"]["y"]["flips"] is True and js["runs"] == 5


def test_nondeterministic_backend_is_flagged():
    rng = np.random.default_rng(0)

    def noisy(plan, s):
        return {"y": s["x"] + 1e-4 * rng.standard_normal(s["x"].shape).astype(np.float32)}

    st = measure_stability(reference, noisy, {"plan": frozenset()}, [SAMPLE], Tolerance(), runs=2)
    assert not st.deterministic and st.flags[0].startswith("nondeterministic")


def test_pipeline_stability(zoo, tmp_path):
    model, inputs = save_zoo_model(zoo["layernorm_overflow"], tmp_path)
    r = run(model, Options.of(inputs=[str(inputs)], stability=3), tmp_path / "out")
    st = r.stability  # result.StabilityRecord, read by attribute
    assert [p.plan for p in st.plans] == ["plan", "all_fp16"]
    assert st.deterministic is True and st.runs == 3
    plan = st.plans[0].outputs["y"]
    assert not plan.fragile and plan.margin > plan.noise
    assert st.plans[1].outputs["y"].judged_ratio > 1  # all-FP16 fails, steadily
    written = json.loads((tmp_path / "out" / "precision.json").read_text())
    assert written["stability"] == st.to_json()
    assert RunResult.typed_from_json(written)["stability"] == st  # the record again


def test_stability_measures_a_check_hook(zoo, tmp_path):
    """--stability with --check: the hook's verdict is a row of its own. A hook that passes
    only on the user's own sample (never on a jittered copy) makes every plan flip under it,
    while the outputs it alone judges stay steady."""
    from trtbisect.judge.flags import parse_criteria

    z = zoo["layernorm_overflow"]
    model, inputs = save_zoo_model(z, tmp_path)
    name, value = next(iter(z.inputs.items()))
    np.save(tmp_path / "orig.npy", value)
    hook = tmp_path / "hook.py"
    hook.write_text("import numpy as np\n"
                    f"ORIG = np.load({str(tmp_path / 'orig.npy')!r})\n"
                    "def check(fp32, fp16, sample):\n"
                    f"    return bool(np.array_equal(sample[{name!r}], ORIG))\n")
    crit = parse_criteria(checks=[f"{hook}:check"])
    r = run(model, Options.of(inputs=[str(inputs)], stability=3, criteria=crit,
                              validation_share=0), tmp_path / "out")
    st = r.stability
    assert r.verdict == "fp16_ok"  # the hook passes the user's sample, all FP16
    rows = st.plans[0].outputs
    assert rows["--check"].flips is True and rows["--check"].judged_ratio == 0
    assert float(rows["--check"].max_ratio) > 1  # "inf": a failing hook with no score
    assert "all_fp16: --check passes on some runs and fails on others" in st.flags
    assert rows["y"].flips is False  # judged by the hook alone
