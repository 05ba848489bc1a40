"""A search that stops itself (``hydra.sweeper.stop``) in a sweep: goal, patience and Optuna's terminator, on
resume, and a terminator that does not build. Rank 0 alone decides (world size 1, in process:
``tests/in_process.py``); ``tests/apps/sweep_app.py``'s value is ``x**2 + 1``, with ``steps``
``10 * trial number + x**2 - 0.1 * step``, so every later trial is worse. Stop rules inside trial groups (2
ranks): ``tests/multirank/test_stop_rules.py``; the rules' arithmetic: ``tests/test_stop_rules.py``."""

from __future__ import annotations

import pytest
import yaml
from optuna.trial import TrialState

from tests.in_process import sweep
from tests.multirank.sweep_helpers import load, records

pytestmark = [pytest.mark.timeout(120)]

C, P, W = TrialState.COMPLETE, TrialState.PRUNED, TrialState.WAITING
WARM = "hydra.sweeper.enqueue_trials=[{x:0.9},{x:0.5},{x:0.1},{x:0.7}]"  # values 1.81, 1.25, 1.01, 1.49


def _stopped_by(tmp_path) -> dict:
    return yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())["stopped_by"]


def test_goal_stops_the_search_and_the_resumed_study_runs_no_new_trial(tmp_path):
    """``stop.goal=1.05`` (minimize): trial 2 (value 1.01) reaches it, so of ``n_trials=10`` only 3 run; the reason is logged
    and written. The same command again finds the goal met before its first ask: no trial runs and it exits 0. The fourth warm start stays queued (WAITING) for a later search."""
    args = ("hydra.sweeper.n_trials=10", "x=interval(-1,1)", WARM, "hydra.sweeper.stop.goal=1.05")
    res = sweep(tmp_path, *args).check()
    assert [t.state for t in load(tmp_path).trials] == [C, C, C, W]
    assert sorted(records(tmp_path)) == [(n, 0) for n in range(3)]  # the app ran exactly these
    assert "Stop rules: goal=1.05 (checked before each ask)" in res.output
    assert "Sweep finished: hydra.sweeper.stop.goal reached: best value 1.01 <= 1.05 (trial 2)" in res.output
    assert _stopped_by(tmp_path) == {"rule": "goal", "reason": "hydra.sweeper.stop.goal reached: best value "
                                                                "1.01 <= 1.05 (trial 2)"}
    again = sweep(tmp_path, *args).check()
    assert [t.state for t in load(tmp_path).trials] == [C, C, C, W]
    assert "Sweep finished: hydra.sweeper.stop.goal reached" in again.output
    assert "Launching" not in again.output.split("Sweep dir:")[-1]  # no job of the resumed run


def test_patience_counts_pruned_trials(tmp_path):
    """Every later trial is worse and the median pruner prunes it at its first step: with ``stop.patience=3``
    trial 0 and three pruned trials run, of ``n_trials=20``."""
    sweep(tmp_path, "hydra.sweeper.n_trials=20", "x=interval(-1,1)", "steps=2", "hydra/sweeper/pruner=median",
          "hydra.sweeper.pruner.n_startup_trials=1", "hydra.sweeper.stop.patience=3").check()
    assert [t.state for t in load(tmp_path).trials] == [C, P, P, P]
    stopped = _stopped_by(tmp_path)
    assert stopped["rule"] == "patience" and "3 finished trials without improving on trial 0's" in stopped["reason"]


def test_optunas_terminator_stops_the_search(tmp_path):
    """A terminator node instantiated by Hydra on rank 0 (an error estimate no improvement can beat) stops the
    search once it has its ``min_n_trials=3``."""
    node = ("{_target_:optuna.terminator.Terminator,min_n_trials:3,"
            "improvement_evaluator:{_target_:optuna.terminator.BestValueStagnationEvaluator},"
            "error_evaluator:{_target_:optuna.terminator.StaticErrorEvaluator,constant:1e9}}")
    res = sweep(tmp_path, "hydra.sweeper.n_trials=10", "x=interval(-1,1)",
                f"hydra.sweeper.stop.terminator={node}").check()
    assert [t.state for t in load(tmp_path).trials] == [C, C, C]
    assert _stopped_by(tmp_path)["rule"] == "terminator"
    assert "optuna.terminator, which Optuna deprecated in 4.9.0" in res.output


def test_a_terminator_that_does_not_build_stops_the_sweep_before_any_study_or_trial(tmp_path):
    """A terminator node that is no ``BaseTerminator`` is refused on rank 0 before the study opens; the
    process exits 1 and nothing is stored (every rank's exit: the refusal contract, tests/multirank)."""
    res = sweep(tmp_path, "hydra.sweeper.n_trials=2", "x=interval(-1,1)",
                "hydra.sweeper.stop.terminator={_target_:optuna.samplers.RandomSampler}")
    assert res.returncode == 1, res.output[-3000:]
    assert "stop.terminator must build an optuna.terminator.BaseTerminator, got RandomSampler" in res.output
    assert not (tmp_path / "sweep" / "optuna.db").exists() and records(tmp_path) == {}
