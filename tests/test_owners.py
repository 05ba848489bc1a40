"""Owner locks (case C54, ``_study/_owners.py``) on each storage the README lists: SQLite, a journal file,
PostgreSQL and Redis, with real servers and a real second process as the owner.

A trial whose owner process is alive stays RUNNING; once that process is SIGKILLed, the next open closes it
(FAIL, re-queued with its params and user attributes when retries are on) and says which one. A RUNNING trial
with no owner record (an older study, another tool) is left to the heartbeat rule.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import uuid

import optuna
import pytest
from optuna.trial import TrialState

from hydra_plugins.ds_optuna_sweeper._study import _owners
from hydra_plugins.ds_optuna_sweeper._study._storage import open_storage
from hydra_plugins.ds_optuna_sweeper._study._stored import OWNER_ATTR
from tests.multirank.test_shared_study import postgres_url, redis_url  # noqa: F401 - the fixtures
from tests.torchrun_utils import REPO

#: The owner: opens the study like rank 0, holds its owner lock, asks one trial, then waits to be killed.
OWNER = textwrap.dedent("""
    import sys, time, optuna
    from hydra_plugins.ds_optuna_sweeper._study import _owners
    from tests.test_owners import storage_for
    study = optuna.create_study(storage=storage_for(sys.argv[1]), study_name=sys.argv[2], load_if_exists=True)
    assert _owners.hold(study) is not None
    trial = study.ask()
    trial.set_user_attr("ds_optuna:checkpoint_dir", "/ckpt/trial0")
    trial.suggest_float("x", -1, 1)
    _owners.record_owner(study, trial)
    print("READY", _owners.launch_id(), flush=True)
    time.sleep(120)
""")


def storage_for(location: str):
    """The sweeper's storage for a URL, or a ``JournalStorage`` for ``journal:<file>``."""
    if location.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(location[len("journal:"):]))
    return open_storage(location, heartbeat_interval_s=None, grace_period_s=None, max_retry=1)


@pytest.fixture(params=["sqlite", "journal_file", pytest.param("postgresql", marks=pytest.mark.postgres),
                        pytest.param("redis", marks=pytest.mark.redis)])
def location(request, tmp_path):
    """``(storage location, study name)`` on each storage; server studies are deleted afterwards."""
    name = f"dso-owner-{uuid.uuid4().hex[:10]}"
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'optuna.db'}", name
        return
    if request.param == "journal_file":
        yield f"journal:{tmp_path / 'journal.log'}", name
        return
    url = request.getfixturevalue("postgres_url" if request.param == "postgresql" else "redis_url")
    yield url, name
    try:
        optuna.delete_study(study_name=name, storage=storage_for(url))
    except KeyError:
        pass


def _start_owner(location: str, name: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", OWNER, location, name], stdout=subprocess.PIPE, text=True,
                            env=env, cwd=REPO, start_new_session=True)
    try:
        line = proc.stdout.readline()  # the owner prints READY or dies (then readline returns "")
    except Exception:
        proc.kill()
        raise
    if not line.startswith("READY"):
        proc.kill()
        raise AssertionError(f"the owner process did not start: {line!r}, exit {proc.wait(timeout=30)}")
    return proc, line.split()[1]


def _kill9(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.mark.timeout(120)
def test_a_live_owner_keeps_its_trial_running_and_a_killed_ones_is_closed_and_requeued(location, caplog):
    where, name = location
    proc, owner = _start_owner(where, name)
    try:
        study = optuna.load_study(study_name=name, storage=storage_for(where))
        (trial,) = study.get_trials(deepcopy=False)
        assert trial.state == TrialState.RUNNING and trial.system_attrs[OWNER_ATTR] == owner
        assert _owners.orphans(study) == {}  # alive in another process: left alone
        assert _owners.close_orphans(study, 1) == []
    finally:
        _kill9(proc)
    with caplog.at_level(logging.WARNING):
        assert _owners.orphans(study) == {0: owner}
        assert _owners.close_orphans(study, 1) == [0]
    first, retry = study.get_trials(deepcopy=False)
    assert first.state == TrialState.FAIL and retry.state == TrialState.WAITING
    assert retry.params == first.params and retry.user_attrs["ds_optuna:checkpoint_dir"] == "/ckpt/trial0"
    assert f"trial 0 was RUNNING with no live owner (launch {owner}): closed FAIL and re-queued as trial 1 " \
           "with the same params" in caplog.text
    assert _owners.close_orphans(study, 1) == []  # closed once


@pytest.mark.timeout(120)
def test_a_killed_owners_trial_is_closed_for_good_without_retries(location, caplog):
    where, name = location
    proc, owner = _start_owner(where, name)
    _kill9(proc)
    study = optuna.load_study(study_name=name, storage=storage_for(where))
    with caplog.at_level(logging.WARNING):
        assert _owners.close_orphans(study, 0) == [0]
    assert [t.state for t in study.get_trials(deepcopy=False)] == [TrialState.FAIL]
    assert "closed FAIL and not re-queued (retry_failed_trials=0)" in caplog.text


@pytest.mark.timeout(120)
def test_a_running_trial_without_owner_record_is_left_to_the_heartbeat(location):
    where, name = location
    study = optuna.create_study(storage=storage_for(where), study_name=name)
    study.ask()  # asked by another tool (or an older sweeper): no owner record
    assert _owners.orphans(study) == {}
    assert _owners.close_orphans(study, 1) == []
    assert [t.state for t in study.get_trials(deepcopy=False)] == [TrialState.RUNNING]


def test_this_launchs_own_lock_counts_as_alive_and_its_file_goes_with_release(tmp_path):
    study = optuna.create_study(storage=storage_for(f"sqlite:///{tmp_path / 'optuna.db'}"), study_name="s")
    try:
        owner = _owners.hold(study)
        assert owner == _owners.launch_id() and _owners.held_owner(study) == owner
        trial = study.ask()
        _owners.record_owner(study, trial)
        assert _owners.orphans(study) == {}
        lock_file = tmp_path / f".optuna.db.owner-{owner}"
        assert lock_file.is_file()  # hidden, a file: job-dir listings of the sweep dir do not change
        assert not [p for p in tmp_path.iterdir() if p.is_dir()]
    finally:
        _owners.release_all()
    assert not lock_file.exists()


def test_storages_without_owner_lock_record_nothing():
    study = optuna.create_study()  # in memory
    assert _owners.hold(study) is None
    trial = study.ask()
    _owners.record_owner(study, trial)
    assert OWNER_ATTR not in study.trials[0].system_attrs


@pytest.mark.timeout(120)
def test_the_policy_looks_for_dead_launches_at_its_first_round_then_every_few_seconds(tmp_path):
    """``_policy.CloseOrphans``: the first round looks; a launch killed after it is found at the first round
    ``every_s`` seconds later, not at each round (two study reads each, issue 40's overhead measure)."""
    import time

    from hydra_plugins.ds_optuna_sweeper._settings import Settings
    from hydra_plugins.ds_optuna_sweeper._study._policy import CloseOrphans, RoundState

    where, name = f"sqlite:///{tmp_path / 'optuna.db'}", "dso-owner-cadence"
    proc, _ = _start_owner(where, name)
    study = optuna.load_study(study_name=name, storage=storage_for(where))
    settings = Settings.from_node({"sampler": {"_target_": "optuna.samplers.RandomSampler"},
                                   "pruner": {"_target_": "optuna.pruners.NopPruner"}, "n_trials": 4},
                                  world_size=1)
    state, rule = RoundState(study, settings, str(tmp_path)), CloseOrphans(every_s=1.0)
    assert rule.decide(state, 1) == 1  # looked: the owner lives
    _kill9(proc)
    assert rule.decide(state, 1) == 1  # within every_s: no look
    assert [t.state for t in study.get_trials(deepcopy=False)] == [TrialState.RUNNING]
    time.sleep(1.0)
    assert rule.decide(state, 1) == 1  # looked again: closed
    assert [t.state for t in study.get_trials(deepcopy=False)] == [TrialState.FAIL]


def test_a_sweep_that_ends_leaves_no_owner_lock_file(tmp_path):
    """The lock file goes when rank 0 has written the results, not at interpreter exit: a script ending with
    ``run_then_exit``/``exit_cleanly`` (``os._exit``) runs no ``atexit`` handler, and a new user found
    ``.optuna.db.owner-<id>`` left in every sweep dir."""
    from tests.in_process import sweep

    sweep(tmp_path, "hydra.sweeper.n_trials=2", "x=interval(-1,1)").check()
    assert not list((tmp_path / "sweep").glob(".optuna.db.owner-*"))
