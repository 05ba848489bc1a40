"""Rank 0's go/stop rules (``_study/_policy.py``): one table row per rule and per order that matters.

Each row builds a real in-memory Optuna study holding some finished trials, a :class:`RoundState` with this
run's counts, and asks :meth:`Policy.decide`: the number of asks, or the stop's reason or error type. The
sweeps that reach these rules end to end (failure rate, timeout, stop rules, grids, budget) are in
``test_sweep_rules.py``, ``test_sweep_edges.py``, ``test_stop_rules_in_sweeps.py`` and ``test_warm_starts.py``.
"""

from __future__ import annotations

import time

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from hydra_plugins.ds_optuna_sweeper._settings import Settings
from hydra_plugins.ds_optuna_sweeper._study._grid import WarmStartGridSampler
from hydra_plugins.ds_optuna_sweeper._study._policy import Policy, RoundState, Stop
from hydra_plugins.ds_optuna_sweeper._settings import StopRules
from hydra_plugins.ds_optuna_sweeper._study._stop import StopCheck

C, F, P = TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED


def _study(values=(), sampler=None) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=sampler)
    for i, v in enumerate(values):
        state = F if v is None else C
        study.add_trial(create_trial(state=state, value=v, params={"x": float(i)},
                                     distributions={"x": FloatDistribution(0, 10)}))
    return study


def _state(study, *, n_trials=8, batch=1,  # batch: n_jobs at world size 1
           max_failure_rate=0.0, timeout=None, stop=None, **counts) -> tuple:
    node = {"sampler": {"_target_": "optuna.samplers.RandomSampler"}, "pruner": {"_target_": "optuna.pruners.NopPruner"},
            "direction": "minimize", "n_trials": n_trials, "n_jobs": batch, "max_failure_rate": max_failure_rate,
            "timeout": timeout}
    settings = Settings.from_node(node, world_size=1)
    state = RoundState(study, settings, "/sweep", **counts)
    check = StopCheck(StopRules.from_node(stop, ("minimize",)), "minimize")
    return state, Policy(check)


ROWS = [
    # (id, stored values (None: FAIL), settings, this run's counts, expected asks or stop text / error type)
    ("a fresh study asks one trial", (), {}, {}, 1),
    ("a batch asks several", (), {"batch": 3}, {}, 3),
    ("the budget caps the batch", (1.0,) * 6, {"batch": 3}, {}, 2),
    ("a full study stops", (1.0,) * 8, {}, {}, "the study holds 8 trials (n_trials=8)"),
    ("one trial says trial", (1.0,), {"n_trials": 1}, {}, "the study holds 1 trial (n_trials=1)"),
    ("failed trials count against the budget", (None,) * 8, {}, {}, "the study holds 8 trials (n_trials=8)"),
    ("a failure above the rate stops with TrialFailedError", (None,), {}, {"finished": 1, "failed": 1},
     "TrialFailedError"),
    ("a failure at the rate goes on", (None, 1.0), {"max_failure_rate": 0.5}, {"finished": 2, "failed": 1}, 1),
    ("the failure rate comes before the budget", (None,) * 8, {}, {"finished": 8, "failed": 8}, "TrialFailedError"),
    ("a failed tell stops with SweepStoppedError", (), {}, {"pending_error": "study.tell failed"},
     "SweepStoppedError"),
    ("the timeout counts from the first ask", (), {"timeout": 5}, {"first_ask_at": -10.0},
     "hydra.sweeper.timeout=5 s reached"),
    ("no ask yet: the timeout has not started", (), {"timeout": 5}, {"first_ask_at": None}, 1),
    ("the sampler's stop ends the search", (), {}, {"sampler_exhausted": True},
     "the sampler has no point left (every grid point was tried)"),
    ("a goal met stops", (0.1,), {"stop": {"goal": 0.2}}, {},
     "hydra.sweeper.stop.goal reached: best value 0.1 <= 0.2 (trial 0)"),
    ("a goal not met goes on", (0.3,), {"stop": {"goal": 0.2}}, {}, 1),
    ("a stop rule comes before the budget", (0.1,) * 8, {"stop": {"goal": 0.2}}, {}, "goal reached"),
]


@pytest.mark.parametrize("values, settings, counts, expected", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_the_rules_decide_in_order(values, settings, counts, expected):
    if "first_ask_at" in counts and counts["first_ask_at"] is not None:
        counts = {**counts, "first_ask_at": time.monotonic() + counts["first_ask_at"]}
    state, policy = _state(_study(values), **settings, **counts)
    decision = policy.decide(state)
    if isinstance(expected, int):
        assert decision == expected
    elif expected.endswith("Error"):
        assert isinstance(decision, Stop) and decision.error is not None and decision.error.type_name == expected, \
            decision
    else:
        assert isinstance(decision, Stop) and decision.error is None and expected in decision.reason, decision


def test_a_stop_rule_once_met_stays_met_and_is_reported():
    study = _study((0.1,))
    state, policy = _state(study, stop={"goal": 0.2})
    assert isinstance(policy.decide(state), Stop) and policy.stopped_by.rule == "goal"
    study.add_trial(create_trial(state=C, value=5.0, params={"x": 1.0}, distributions={"x": FloatDistribution(0, 10)}))
    assert isinstance(policy.decide(state), Stop)  # other trial groups asking later stop too


def test_a_grid_asks_no_more_than_its_free_points_and_stops_when_done():
    grid = WarmStartGridSampler({"x": [0.0, 1.0, 2.0]})  # what hydra/sweeper/sampler=grid builds
    study = _study((), sampler=grid)
    state, policy = _state(study, batch=5)
    assert policy.decide(state) == 3
    study.optimize(lambda trial: trial.suggest_float("x", 0, 10), n_trials=3)
    decision = policy.decide(state)
    assert isinstance(decision, Stop) and "every grid point was tried" in decision.reason


def test_a_new_rule_is_one_class_in_the_list():
    """The seam the schedulers use: a rule that caps each round at one ask and stops after three trials."""
    class OneAtATime:
        def decide(self, state, asks):
            return Stop(reason="three is enough") if len(state.study.trials) >= 3 else min(asks, 1)

    state, _ = _state(_study((1.0, 2.0)), batch=4)
    policy = Policy(rules=(OneAtATime(),))
    assert policy.decide(state) == 1
    state.study.add_trial(create_trial(state=C, value=3.0, params={"x": 1.0},
                                       distributions={"x": FloatDistribution(0, 10)}))
    assert policy.decide(state) == Stop(reason="three is enough")
