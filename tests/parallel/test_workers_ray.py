"""`--ray`: the workers as Ray actors on a local two-CPU cluster give the in-process plan bit for
bit; an actor killed mid-plan is replaced and its plan retried; without Ray or without a
cluster at the address, one line and exit 2 before any work."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.conftest import save_zoo_model
from tests.parallel.test_workers import _run, _same, _stacked
from trtbisect.cli import main
from trtbisect.parallel.pool import DIE_ONCE_ENV


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A local Ray cluster of 2 CPUs whose workers kill themselves once (the first task any
    of them takes): the environment is fixed when Ray starts, so the hook is set here."""
    ray = pytest.importorskip("ray")
    import os

    flag = tmp_path_factory.mktemp("ray") / "died"
    old = os.environ.get(DIE_ONCE_ENV)
    os.environ[DIE_ONCE_ENV] = str(flag)
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    finally:
        if old is None:
            os.environ.pop(DIE_ONCE_ENV)
        else:
            os.environ[DIE_ONCE_ENV] = old
    yield flag
    ray.shutdown()


def test_ray_actors_reach_the_same_plan_and_survive_a_dead_actor(cluster, zoo, tmp_path):
    import numpy as np

    from trtbisect.judge.flags import parse_criteria

    z = zoo["two_outputs"]
    model, inputs = save_zoo_model(z, tmp_path / "in")
    np.savez(inputs, **_stacked(z, 3))
    crit = parse_criteria(pass_rate=0.6)
    reference = _run(model, inputs, tmp_path / "w1", 1, criteria=crit)
    first = _run(model, inputs, tmp_path / "ray", 2, ray="local", criteria=crit)
    assert cluster.exists(), "no actor died: the hook did not reach the cluster"
    _same(reference, first, "Ray, an actor killed")
    stats = first[1]["workers"]
    assert stats["backend"] == "ray" and stats["workers"] == 2 and stats["replaced"] == 1
    done = [json.loads(line).get("done") for line in
            (tmp_path / "ray" / "journal.jsonl").read_text().splitlines()[1:]]
    done = [d for d in done if d is not None]
    assert len(done) == len(set(done)), "a plan journaled twice"
    # more actors than the cluster's CPUs would wait forever: capped, and said
    again = _run(model, inputs, tmp_path / "ray3", 3, ray="local", criteria=crit)
    _same(reference, again, "Ray, capped")
    assert again[1]["workers"]["workers"] == 2 and "3 asked" in again[1]["workers"]["chosen"]
    assert again[1]["workers"]["replaced"] == 0


def _cli_args(zoo, tmp_path) -> list[str]:
    model, inputs = save_zoo_model(zoo["precision_loss"], tmp_path / "in")
    return ["run", str(model), "--inputs", str(inputs), "--out", str(tmp_path / "o")]


def test_ray_address_nobody_answers_is_one_line_and_exit_2_before_any_work(zoo, tmp_path):
    import socket

    pytest.importorskip("ray")
    with socket.socket() as s:  # a port nobody listens at
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = CliRunner().invoke(main, [*_cli_args(zoo, tmp_path), "--ray", f"127.0.0.1:{port}"])
    assert r.exit_code == 2 and "no Ray cluster answers" in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()  # refused before any work


def test_ray_not_installed_is_one_line_and_exit_2(zoo, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    r = CliRunner().invoke(main, [*_cli_args(zoo, tmp_path), "--ray"])
    assert r.exit_code == 2 and "pip install 'trtbisect[ray]'" in r.output
    assert len(r.output.strip().splitlines()) == 1
