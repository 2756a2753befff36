"""The aimed rounds (stages/search.py `aim`) start from what the first search learned and share
an allowance of its evaluations; a round that runs out decides `fragile` at once (#45 item 3).
On the planted detector of test_aimed_resume.py: the first search finds {conv1}, which passes
its bound by less than the spread, and one aimed round keeps conv1 and the head."""

from __future__ import annotations

import json

from tests.search.test_aimed_resume import _planted
from trtbisect.stages import search as stage
from trtbisect.stages.search import aim_allowance


def _run(tmp_path, name: str):
    from trtbisect.context import Options
    from trtbisect.pipeline import run

    path, inputs, tol = _planted(tmp_path)
    # the aim is the subject: no validation (tests/judge/test_validation.py has it)
    return run(path, Options.of(inputs=[str(inputs)], tolerance=tol, semantics="strict",
                                validation_share=0), tmp_path / name)


def _first_search(tmp_path, monkeypatch) -> int:
    """The first search's evaluations alone: the same run with no aimed round."""
    with monkeypatch.context() as m:
        m.setattr(stage, "AIM_ROUNDS", 0)
        r = _run(tmp_path, "first")
    assert r.verdict == "fragile" and r.fp32_nodes == ["conv1"] and not r.aimed_searches
    return r.evaluations


def test_an_aimed_round_grows_from_the_last_plan_within_its_allowance(tmp_path, monkeypatch):
    first = _first_search(tmp_path, monkeypatch)
    r = _run(tmp_path, "out")
    assert r.verdict == "fixed" and r.fp32_nodes == ["conv1", "head"]
    (aim,) = r.aimed_searches
    assert aim.found and r.evaluations == first + aim.evaluations
    assert aim.evaluations <= aim_allowance(first)
    # all-FP16 failed the looser bound: known to fail the tighter one, judged by nothing
    assert aim.known_failing >= 1
    # after the empty plan, the aimed search tries the last plan first: grown, not searched anew
    assert r.search.trials[1].fp32 == ("conv1",)


def test_an_aimed_round_that_uses_its_allowance_is_fragile_at_once(tmp_path, monkeypatch):
    """An allowance of 2 evaluations (the planted round needs more): no plan within it, so
    the verdict is `fragile` with the first plan written, and the run stops there (the
    evaluations are the first search's and the 2)."""
    first = _first_search(tmp_path, monkeypatch)
    monkeypatch.setattr(stage, "AIM_FLOOR", 2)
    monkeypatch.setattr(stage, "AIM_SHARE", 0.0)
    r = _run(tmp_path, "out")
    assert r.verdict == "fragile" and r.exit_code == 7 and r.fp32_nodes == ["conv1"]
    (aim,) = r.aimed_searches
    assert not aim.found and aim.evaluations == 2
    assert r.evaluations == first + 2  # what the aimed round spent is counted
    assert "used its allowance of 2 evaluations" in r.certificate.decided
    written = json.loads((tmp_path / "out" / "precision.json").read_text())
    assert written["verdict"] == "fragile" and written["certificate"]["decided"]
    assert (tmp_path / "out" / "det.mixed.onnx").exists()  # the plan is still written


def _share_bound(tmp_path, monkeypatch, share: float) -> tuple[int, list[int]]:
    """The first search's evaluations, with the allowance's floor 0 and its share `share` (so
    the share binds), and the list each written plan's validation adds its inferences to."""
    from trtbisect.stages import written

    first = _first_search(tmp_path, monkeypatch)
    monkeypatch.setattr(stage, "AIM_FLOOR", 0)
    monkeypatch.setattr(stage, "AIM_SHARE", share)
    validated: list[int] = []
    real = written.validate

    def validate(judge, ctx, opts):
        out = real(judge, ctx, opts)
        validated.append(len(out.judgements))
        return out
    monkeypatch.setattr(written, "validate", validate)
    return first, validated


def test_the_aimed_rounds_and_the_validation_share_one_allowance(tmp_path, monkeypatch):
    """With validation on (the planted sample's two perturbed copies: 2 evaluations per written
    plan), the aimed rounds and the validation of every plan written together take at most
    AIM_SHARE of the first search's evaluations (the floor set to 0, so the share binds; the
    share set to 1 so that a round runs at all on this 6-evaluation search). Before #45's
    accounting the round took the whole share and the validation came on top: 6 + 4 > 6."""
    from trtbisect.context import Options
    from trtbisect.pipeline import run

    first, validated = _share_bound(tmp_path, monkeypatch, 1.0)
    path, inputs, tol = _planted(tmp_path)
    r = run(path, Options.of(inputs=[str(inputs)], tolerance=tol, semantics="strict"),
            tmp_path / "validated")
    aimed = sum(a.evaluations for a in r.aimed_searches or ())
    assert r.aimed_searches and validated and all(n == 2 for n in validated)
    assert aimed + sum(validated) <= 1.0 * first  # one sample searched: an inference each
    assert r.verdict in ("fragile", "unvalidated") and r.fp32_nodes  # the plan is written


def test_held_out_samples_count_every_file_they_judge(tmp_path, monkeypatch):
    """Held-out samples judge every file the run writes, the all-FP16 file's too: the
    allowance reserves theirs. Two copies of the planted sample, one held out (its validation:
    1 evaluation per file), the share set to 1.5 (9 of the first search's 6): the round would
    find its plan in 7 evaluations and, with three files validated, 7 + 3 > 9."""
    import numpy as np

    from trtbisect.context import Options
    from trtbisect.pipeline import run

    first, validated = _share_bound(tmp_path, monkeypatch, 1.5)
    path, inputs, tol = _planted(tmp_path)
    twin = tmp_path / "twin.npz"
    np.savez(twin, **dict(np.load(inputs)))
    r = run(path, Options.of(inputs=[str(inputs), str(twin)], tolerance=tol, semantics="strict"),
            tmp_path / "held")
    aimed = sum(a.evaluations for a in r.aimed_searches or ())
    assert r.validation.kind == "held_out" and validated and all(n == 1 for n in validated)
    assert r.aimed_searches and aimed + sum(validated) <= int(1.5 * first)
    assert r.fp32_nodes  # a plan is written
