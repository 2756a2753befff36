"""The judge's settings in one object (judge/settings.py, issue #33): every setting a verdict
depends on changes the journal's fingerprint, so a resumed run under another setting never
replays verdicts it did not judge."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest

from trtbisect.context import JudgeOptions, Options, prepare
from trtbisect.judge.compare import Tolerance
from trtbisect.judge.flags import parse_criteria
from trtbisect.judge.settings import JudgeSettings
from trtbisect.pipeline import _fingerprint, run

ROOT = Path(__file__).resolve().parents[2]
DEMO, INPUTS = ROOT / "models" / "demo.onnx", ROOT / "models" / "demo_inputs.npz"

CHANGES = {
    "threads": dict(threads=2),
    "semantics": dict(semantics="strict"),
    "trt_version": dict(trt_version=10),
    "tf32": dict(tf32=True),
    "fp16_accumulate": dict(fp16_accumulate=True),
    "strict": dict(strict=True),
    "tolerance": dict(tolerance=Tolerance(rtol=2e-2)),
    "precision": dict(precision="bf16"),
    "criteria": dict(criteria=parse_criteria(metrics=["cosine:0.999"])),
    "eval_timeout": dict(eval_timeout=5.0),
}


def test_every_field_of_the_settings_is_covered_here():
    fields = {f.name for f in dataclasses.fields(JudgeSettings)}
    covered = {"threads", "semantics", "trt_version", "tf32", "accumulate", "strict",
               "tolerance", "precision", "criteria_flags", "criteria_fingerprint",
               "eval_timeout"}
    assert fields == covered  # a new setting needs a row in CHANGES


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_each_setting_changes_the_journal_fingerprint(name):
    opts = Options.of(inputs=[str(INPUTS)], threads=1)
    ctx = prepare(DEMO, opts, search=False)
    changed = opts.but(**CHANGES[name])
    assert _fingerprint(ctx, changed.judge, changed.search) != \
        _fingerprint(ctx, opts.judge, opts.search)
    same = dataclasses.replace(opts)
    assert _fingerprint(ctx, same.judge, same.search) == _fingerprint(ctx, opts.judge, opts.search)
    assert changed.judge.settings != opts.judge.settings


def test_every_judge_option_reaches_the_settings():
    """A field of the judge's group left out of JudgeSettings would judge without reaching
    the journal's fingerprint: each one changes the settings, and nothing else does."""
    judge_fields = {f.name for f in dataclasses.fields(JudgeOptions) if f.init}
    assert judge_fields == set(CHANGES)
    base = Options.of(threads=1)
    for name, change in {"seed": 3, "samples": 2, "max_evaluations": 5, "workers": 2,
                         "report": True, "resume": False, "rewrite": True}.items():
        assert base.but(**{name: change}).judge.settings == base.judge.settings, name


def test_the_settings_are_built_once_and_kept_by_other_changes():
    opts = Options.of(threads=1, criteria=parse_criteria(metrics=["cosine:0.999"]))
    assert opts.judge.settings is opts.judge.settings
    assert opts.but(seed=4, workers=2).judge.settings is opts.judge.settings
    moved = opts.but(tolerance=Tolerance(rtol=0.5)).judge.settings
    assert moved.tolerance == Tolerance(rtol=0.5) and moved.criteria_flags
    with pytest.raises(TypeError, match="no field rtol"):
        Options.of(rtol=0.5)


def test_the_options_and_each_group_are_frozen():
    """Built once by the command, read by every stage: nothing may change them in place (a
    stage that changed a group would judge the rest of the run under other settings than its
    fingerprint says); a change is a new object (`but`, `aimed`)."""
    opts = Options.of(threads=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.judge = JudgeOptions()  # type: ignore[misc]
    for group, name in (("sample", "seed"), ("judge", "threads"), ("search", "workers"),
                        ("output", "resume")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(getattr(opts, group), name, None)


def test_an_aimed_round_changes_the_judge_bound_only():
    """stages/spread.aimed: the judge group under another tolerance, its settings built again
    (the aimed round's journal scope differs), everything else as the run's."""
    from trtbisect.stages.spread import aimed

    opts = Options.of(threads=1, strict=True, criteria=parse_criteria(metrics=["cosine:0.999"]))
    tighter = Tolerance(rtol=1e-3)
    judge = aimed(opts.judge, tighter)
    assert judge.tolerance == tighter and judge.settings.tolerance == tighter
    assert judge.settings != opts.judge.settings
    assert dataclasses.replace(judge.settings, tolerance=opts.judge.tolerance) == \
        opts.judge.settings
    assert opts.judge.tolerance == Tolerance()  # the run's own is untouched


def test_the_settings_travel_to_workers_whole():
    opts = Options.of(inputs=[str(INPUTS)], threads=2, semantics="strict",
                      criteria=parse_criteria(metrics=["cosine:0.999"]))
    s = opts.judge.settings
    back = pickle.loads(pickle.dumps(s))
    assert back == s and back.digest() == s.digest()
    assert back.criteria().fingerprint() == opts.judge.criteria.fingerprint()


def test_a_finished_run_rerun_with_other_threads_sets_its_journal_aside(tmp_path):
    """Before, --threads was part of the judge but not of the journal's fingerprint: a
    `--threads 1` run's folder rerun with `--threads 2` replayed the old verdicts."""
    out = tmp_path / "out"
    first = run(DEMO, Options.of(inputs=[str(INPUTS)], threads=1), out)
    same = run(DEMO, Options.of(inputs=[str(INPUTS)], threads=1), out)
    assert same.inferences < first.inferences  # the same settings replay the journal
    other = run(DEMO, Options.of(inputs=[str(INPUTS)], threads=2), out)
    assert other.inferences == first.inferences  # judged afresh
    assert (out / "journal.previous.jsonl").exists()
    assert other.fp32_nodes == first.fp32_nodes
