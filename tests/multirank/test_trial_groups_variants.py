"""Trial groups (``hydra.sweeper.n_jobs``, issue 23): the variants beyond the one 4-rank contract launch
(``tests/multirank/test_trial_groups.py``), under ``make soak`` (issue 39: a launch per cross-rank contract in
``make test``).

- kill -9 of one group's rank under ``--max-restarts 1``, with and without ``retry_failed_trials`` (``make test``:
  the kill -9 contract in ``tests/faults``; ``tests/multirank/test_preemption.py`` has one more, a kill -9 inside
  a launch with two trial groups resuming both trials from their checkpoints, under ``make soak`` too);
- the successive-halving pruner with concurrent trials (``make test``: the median pruner in the 4-rank contract
  launch: both reach global rank 0's study through the same service);
- two launches with trial groups on one PostgreSQL study (``make test``: the shared PostgreSQL study contract,
  ``tests/multirank/test_shared_study.py``).
"""

from __future__ import annotations

import json

import optuna
import pytest
from optuna.trial import TrialState

from hydra_plugins.ds_optuna_sweeper._study._stored import NEVER_RAN_ATTR
from tests.multirank import test_shared_study as shared
from tests.multirank.sweep_helpers import exit_lines, exit_statuses, load, run_sweep
from tests.multirank.test_shared_study import pg_study, postgres_url  # noqa: F401 (fixtures)
from tests.multirank.test_trial_groups import GROUP, _groups

pytestmark = [pytest.mark.torchrun, pytest.mark.soak, pytest.mark.timeout(300)]

C, F, P, W = TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED, TrialState.WAITING


@pytest.mark.parametrize("pruner", ["successive_halving"])
def test_pruning_with_concurrent_trials(tmp_path, pruner):
    """Both groups' trials report each step to global rank 0's study (group 1's over the service) while the
    other group's trials run; the pruner sees every reported step and prunes later, worse trials."""
    settings = {"median": ["hydra.sweeper.pruner.n_startup_trials=2", "hydra.sweeper.pruner.n_warmup_steps=0"],
                "successive_halving": ["hydra.sweeper.pruner.min_resource=1", "hydra.sweeper.pruner.reduction_factor=2"]}
    run_sweep(tmp_path, "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=8", "x=interval(-1,1)", "steps=4",
              "sleep_s=0.3", f"hydra/sweeper/pruner={pruner}", *settings[pruner], "hydra.sweeper.plots=false",
              timeout_s=240).check()
    study = load(tmp_path)
    states = [t.state for t in study.trials]
    assert len(states) == 8 and set(states) <= {C, P}, states
    assert P in states, states  # the app's objective grows with the trial number: later trials are pruned
    assert set(_groups(study).values()) == {0, 1}
    for t in study.trials:
        steps = sorted(t.intermediate_values)
        assert steps == list(range(len(steps))) and steps, (t.number, steps)  # no step lost or stored twice
        if t.state == P:  # the task stopped at the step the pruner answered
            pruned_at = json.loads(next((tmp_path / "records").glob(f"pruned_trial{t.number}_rank*.json")).read_text())
            assert pruned_at["step"] == steps[-1]
    assert exit_statuses(tmp_path) == {0: 0, 1: 0}, exit_lines(tmp_path)




@pytest.mark.parametrize("retry", [0, 1])
def test_kill9_in_one_group_restarts_the_launch_and_closes_every_groups_trial(tmp_path, retry):
    """kill -9 of global rank 1 (group 1) in its first trial, ``--max-restarts 1``: torchrun stops the
    launch (SIGTERM to global rank 0, which closes every group's running trial, or the restarted launch
    closes them), restarts it, and the restarted launch finishes the study with the exact budget; with
    ``retry_failed_trials=1`` the closed trials are re-queued with their params and run again. torchrun's SIGTERM may
    land in rank 0's ask of the next trial: that trial is closed FAIL marked ``ds_optuna:never_ran`` (no params, no
    retry) and does not count in the budget."""
    run_sweep(tmp_path, "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=5", "x=interval(-1,1)", "sleep_s=1",
              "fault.kind=kill9", "fault.rank=1", "fault.attempt=0", f"hydra.sweeper.retry_failed_trials={retry}",
              "hydra.sweeper.plots=false", timeout_s=200, torchrun_args=["--max-restarts", "1"]).check()
    study = load(tmp_path)
    states = [t.state for t in study.trials]
    assert TrialState.RUNNING not in states and W not in states, states
    never_ran = [t.number for t in study.trials if t.user_attrs.get(NEVER_RAN_ATTR)]
    assert len(never_ran) <= 1, states
    failed = [t for t in study.trials if t.state == F and t.number not in never_ran]
    assert 1 <= len(failed) <= 2, states  # group 1's killed trial, and group 0's if it was running then
    assert (states.count(C) == 5) if retry else (states.count(C) + len(failed) == 5), states
    if retry:
        for t in failed:  # each closed trial ran again with its params (and is replaced by it in the budget)
            assert any(r.system_attrs.get("failed_trial") == t.number and r.params == t.params and r.state == C
                       for r in study.trials), (t.number, states)
    lines = exit_lines(tmp_path)
    assert exit_statuses(tmp_path, restart=0).get(1) == -9, lines
    assert exit_statuses(tmp_path, restart=1) == {0: 0, 1: 0}, lines




def test_two_launches_with_trial_groups_share_one_postgres_study(tmp_path, pg_study):
    """Several launches share one study as several torchrun groups do: two launches of 2 ranks with
    ``n_jobs=2`` each (4 single-rank trial groups) on one PostgreSQL study. Every trial is COMPLETE and
    numbered once, every trial group of both launches ran trials (they meet at a start barrier), each
    launch tagged its trials with its own id, and the budget is overshot by at most one trial (one per
    extra launch: within a launch the asks are serialised)."""
    url, name = pg_study
    env = {"DSO_START_BARRIER_DIR": str(tmp_path / "start_barrier"), "DSO_START_BARRIER_N": "4"}
    launches = [shared._start(f"launch{i}", tmp_path, ["--standalone", "--nproc-per-node", "2"], [
        "-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", f"hydra.sweeper.storage={url}", f"hydra.sweeper.study_name={name}",
        "hydra.sweeper.n_trials=8", "hydra.sweeper.n_jobs=2", "hydra.sweeper.rank_timeout=30", "sleep_s=0.5",
        "x=interval(-1,1)", "hydra.sweeper.plots=false"], env=env) for i in range(2)]
    shared._check_exit_zero(launches, shared._wait(launches, 180))
    trials = optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)
    assert all(t.state == C for t in trials), [t.state for t in trials]
    assert sorted(t.number for t in trials) == list(range(len(trials)))
    assert 8 <= len(trials) <= 9, len(trials)
    by_launch: dict[str, set[int]] = {}
    for t in trials:
        by_launch.setdefault(t.user_attrs[shared.GROUP_ATTR], set()).add(t.user_attrs[GROUP])
    assert len(by_launch) == 2 and all(groups == {0, 1} for groups in by_launch.values()), by_launch
