"""A search that stops itself (``hydra.sweeper.stop``) inside a torchrun world of trial groups: each group's
leader checks the rules before its own asks, so this needs 2 ranks, ``n_jobs=2``
(``tests/apps/sweep_app.py``: value ``x**2 + 1``). The rules in a sweep (goal, patience, Optuna's
terminator, a resumed study, a terminator that does not build): ``tests/test_stop_rules_in_sweeps.py``, in
process; the rules' arithmetic on stored trials: ``tests/test_stop_rules.py``."""

from __future__ import annotations

import pytest
import yaml
from optuna.trial import TrialState

from tests.multirank.sweep_helpers import exit_statuses, load, run_sweep

pytestmark = [pytest.mark.torchrun, pytest.mark.timeout(300)]

C, W = TrialState.COMPLETE, TrialState.WAITING
WARM = "hydra.sweeper.enqueue_trials=[{x:0.9},{x:0.5},{x:0.1},{x:0.7}]"  # values 1.81, 1.25, 1.01, 1.49


def _stopped_by(tmp_path) -> dict:
    return yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())["stopped_by"]


@pytest.mark.soak  # the lean net's 12 min; make test keeps the stop rules in process
def test_goal_with_two_trial_groups_stops_both_and_lets_the_running_trial_finish(tmp_path):
    """2 ranks, ``n_jobs=2``: once trial 2 reaches the goal, neither group asks again (no trial starts after
    it ended); a trial the other group was running then finishes COMPLETE (never cut short). Both groups log
    the reason; every rank exits 0."""
    res = run_sweep(tmp_path, "hydra.sweeper.n_jobs=2", "hydra.sweeper.n_trials=20", "x=interval(-1,1)", WARM,
                    "sleep_s=1", "hydra.sweeper.stop.goal=1.05").check()
    study = load(tmp_path)
    trials = study.get_trials(deepcopy=False)
    assert all(t.state in (C, W) for t in trials) and study.best_trial.number == 2, [t.state for t in trials]
    goal_met = trials[2].datetime_complete
    # No trial was asked after trial 2 reached the goal (a group whose trial ended first may have asked one before).
    assert all(t.datetime_start <= goal_met for t in trials if t.datetime_start is not None), \
        [(t.number, t.datetime_start, t.state) for t in trials]
    for group in (0, 1):
        assert f"Trial group {group}/2 finished its search: hydra.sweeper.stop.goal reached" in res.output, \
            res.output[-3000:]
    assert _stopped_by(tmp_path)["rule"] == "goal"
    assert all(status == 0 for status in exit_statuses(tmp_path).values())
