"""``hydra.sweeper.stop`` on real Optuna studies (``_study/_stop.py``): the rules' arithmetic and their checks.
The rules under torchrun, agreed by every rank and trial group: ``tests/multirank/test_stop_rules.py``."""

from __future__ import annotations

import datetime

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.trial import TrialState, create_trial

from hydra_plugins.ds_optuna_sweeper._errors import SweeperConfigError
from hydra_plugins.ds_optuna_sweeper._settings import StopRules
from hydra_plugins.ds_optuna_sweeper._study._stop import StopCheck

T0 = datetime.datetime(2026, 1, 1)


def _study(direction: str, trials: list[tuple[str, float | None]], finished_at: list[int] | None = None) -> optuna.Study:
    """An in-memory study holding ``trials`` = ``[(state, value)]``, finished ``finished_at[i]`` seconds after
    the start (default: one second apart, in list order)."""
    study = optuna.create_study(direction=direction)
    dist = optuna.distributions.FloatDistribution(-10, 10)
    for i, (state, value) in enumerate(trials):
        i = finished_at[i] if finished_at else i
        t = create_trial(state=TrialState[state], value=value if state == "COMPLETE" else None,
                         params={"x": 0.0}, distributions={"x": dist},
                         intermediate_values={0: value} if state == "PRUNED" and value is not None else None)
        t.datetime_start, t.datetime_complete = T0, T0 + datetime.timedelta(seconds=i)
        study.add_trial(t)
    return study


def _reason(rules: StopRules, direction: str, trials) -> tuple[str, str] | None:
    reason = StopCheck(rules, direction).reason(_study(direction, trials))
    return (reason.rule, reason.text) if reason else None


@pytest.mark.parametrize("direction,values,goal,stops", [
    ("minimize", [3.0, 2.0, 1.5], 1.5, True),   # reached exactly
    ("minimize", [3.0, 2.0, 1.6], 1.5, False),
    ("maximize", [0.7, 0.91, 0.8], 0.9, True),
    ("maximize", [0.7, 0.89, 0.8], 0.9, False),
])
def test_goal_follows_the_study_direction(direction, values, goal, stops):
    got = _reason(StopRules(goal=goal), direction, [("COMPLETE", v) for v in values])
    assert (got is not None) == stops, got
    if stops:
        best = max(values) if direction == "maximize" else min(values)
        assert got[0] == "goal" and f"best value {best:.6g}" in got[1] and f"trial {values.index(best)}" in got[1]


def test_goal_ignores_pruned_and_failed_trials():
    """A pruned trial's last intermediate value below the goal is no best value (Optuna's best_value: COMPLETE only)."""
    assert _reason(StopRules(goal=1.0), "minimize", [("COMPLETE", 5.0), ("PRUNED", 0.1), ("FAIL", None)]) is None


def test_patience_counts_complete_and_pruned_trials_finished_after_the_best_not_failed_ones():
    trials = [("COMPLETE", 5.0), ("COMPLETE", 1.0), ("COMPLETE", 2.0), ("PRUNED", 9.0), ("FAIL", None)]
    assert _reason(StopRules(patience=3), "minimize", trials) is None  # 2 since trial 1 (the FAIL does not count)
    rule, text = _reason(StopRules(patience=3), "minimize", [*trials, ("COMPLETE", 3.0)])
    assert rule == "patience" and "3 finished trials without improving on trial 1's best value 1" in text
    assert _reason(StopRules(patience=3), "minimize", [*trials, ("COMPLETE", 0.5)]) is None  # a new best resets it


def test_patience_follows_the_order_trials_finished_in_not_their_numbers():
    """Trials of several groups finish out of number order: the best trial (0) finishing last leaves none after it."""
    trials = [("COMPLETE", 1.0), ("COMPLETE", 3.0), ("COMPLETE", 4.0)]
    assert StopCheck(StopRules(patience=2), "minimize").reason(_study("minimize", trials)).rule == "patience"
    assert StopCheck(StopRules(patience=2), "minimize").reason(_study("minimize", trials, [2, 0, 1])) is None


def test_patience_before_any_complete_trial_counts_every_finished_trial():
    rule, text = _reason(StopRules(patience=2), "minimize", [("PRUNED", 1.0), ("PRUNED", 2.0)])
    assert rule == "patience" and "the start (no COMPLETE trial)" in text


def test_terminator_node_is_instantiated_and_decides():
    """A terminator whose error estimate is huge stops once it has its minimum trials; Optuna's own default for
    ``true`` (EMMR + median error) goes on while it has fewer than 20."""
    node = {"_target_": "optuna.terminator.Terminator", "min_n_trials": 3,
            "improvement_evaluator": {"_target_": "optuna.terminator.BestValueStagnationEvaluator",
                                      "max_stagnation_trials": 1},
            "error_evaluator": {"_target_": "optuna.terminator.StaticErrorEvaluator", "constant": 0.0}}
    values = [("COMPLETE", v) for v in (1.0, 2.0, 3.0)]
    assert _reason(StopRules(terminator=node), "minimize", values[:2]) is None  # below min_n_trials
    rule, text = _reason(StopRules(terminator=node), "minimize", values)
    assert rule == "terminator" and "Terminator" in text and "3 COMPLETE trials" in text
    assert _reason(StopRules(terminator=True), "minimize", values) is None


def test_goal_comes_first_and_no_rule_means_no_stop():
    values = [("COMPLETE", v) for v in (1.0, 2.0, 3.0)]
    assert _reason(StopRules(goal=1.0, patience=1), "minimize", values)[0] == "goal"
    assert _reason(StopRules(), "minimize", values) is None


@pytest.mark.parametrize("node,directions,message", [
    ({"goal": "high"}, ("minimize",), "stop.goal must be a finite number"),
    ({"goal": float("inf")}, ("minimize",), "stop.goal must be a finite number"),
    ({"goal": True}, ("minimize",), "stop.goal must be a finite number"),
    ({"patience": 0}, ("minimize",), "stop.patience must be an integer >= 1"),
    ({"patience": 2.5}, ("minimize",), "stop.patience must be an integer >= 1"),
    ({"terminator": "yes"}, ("minimize",), "stop.terminator must be true"),
    ({"terminator": {"min_n_trials": 3}}, ("minimize",), "stop.terminator must be true"),
    ({"goal": 0.1}, ("minimize", "maximize"), "needs a single objective"),
])
def test_bad_stop_settings_are_refused_naming_the_key(node, directions, message):
    with pytest.raises(SweeperConfigError, match=message):
        StopRules.from_node(node, directions)


def test_a_terminator_that_cannot_be_built_is_refused_before_the_study():
    rules = StopRules.from_node({"terminator": {"_target_": "optuna.samplers.TPESampler"}}, ("minimize",))
    with pytest.raises(SweeperConfigError, match="must build an optuna.terminator.BaseTerminator, got TPESampler"):
        StopCheck(rules, "minimize")
    rules = StopRules.from_node({"terminator": {"_target_": "optuna.terminator.Nope"}}, ("minimize",))
    with pytest.raises(SweeperConfigError, match="stop.terminator could not be built"):
        StopCheck(rules, "minimize")


def test_a_terminator_that_raises_when_asked_is_logged_once_and_turned_off(caplog):
    """A bare ``optuna.terminator.Terminator`` wants cross-validation scores and raises ``ValueError`` at its
    first real check (a new user's sweep failed at its 11th ask): the rule is turned off with the fix logged
    once, and the search goes on."""
    rules = StopRules.from_node({"terminator": {"_target_": "optuna.terminator.Terminator", "min_n_trials": 2}},
                                ("minimize",))
    check = StopCheck(rules, "minimize")
    study = _study("minimize", [("COMPLETE", v) for v in (1.0, 2.0, 3.0)])
    assert check.reason(study) is None and check.reason(study) is None
    warnings = [r.getMessage() for r in caplog.records if "stop.terminator is off" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(
        "hydra.sweeper.stop.terminator is off for the rest of this sweep: Terminator raised ValueError: "), warnings
    assert "\n" not in warnings[0] and warnings[0].endswith(
        ". A bare optuna.terminator.Terminator needs cross-validation scores; give it an error_evaluator (e.g. "
        "{_target_: optuna.terminator.MedianErrorEvaluator, paired_improvement_evaluator: {_target_: "
        "optuna.terminator.EMMREvaluator}}) or use stop.terminator=true"), warnings


@pytest.mark.parametrize("direction", ["minimize", "maximize"])
def test_a_later_trial_equal_to_the_best_is_no_improvement(direction):
    """Ties: the best trial is the first that reached the value (Optuna's ``best_trial``), so patience counts
    a later equal value as a trial without improvement, in either direction."""
    rule, text = _reason(StopRules(patience=2), direction, [("COMPLETE", 1.0), ("COMPLETE", 1.0), ("COMPLETE", 1.0)])
    assert rule == "patience" and "improving on trial 0's" in text


@pytest.mark.parametrize("node,rules,described", [
    (None, StopRules(), ""),
    ({"goal": 1, "patience": 1}, StopRules(goal=1.0, patience=1), "goal=1, patience=1"),
    ({"goal": "${oc.decode:'0.25'}", "terminator": False}, StopRules(goal=0.25), "goal=0.25"),
    ({"patience": "${n}", "terminator": True}, StopRules(patience=3, terminator=True), "patience=3, terminator"),
    ({"terminator": {"_target_": "optuna.terminator.Terminator"}},
     StopRules(terminator={"_target_": "optuna.terminator.Terminator"}), "terminator"),
])
def test_accepted_stop_nodes_read_from_the_composed_config(node, rules, described):
    """The node as Hydra composes it (a DictConfig, interpolations resolved); the lowest patience, 1, is valid;
    ``terminator: false`` is off; ``describe`` names the rules that are on (mutation testing found these rows
    missing: bench/results/mutation.md)."""
    if node is not None:
        node = OmegaConf.create({"n": 3, "stop": node}).stop
    got = StopRules.from_node(node, ("minimize",))
    assert got == rules and got.describe() == described and bool(got) == bool(described)
    assert type(got.goal) is (float if rules.goal is not None else type(None))


def test_the_stop_reasons_say_the_rule_the_value_and_the_trial():
    """The reason texts as printed and written under ``stopped_by`` (``as_dict``)."""
    goal = StopCheck(StopRules(goal=1.5), "minimize").reason(_study("minimize", [("COMPLETE", 2.0), ("COMPLETE", 1.25)]))
    assert goal.as_dict() == {"rule": "goal", "reason": "hydra.sweeper.stop.goal reached: best value 1.25 <= 1.5 (trial 1)"}
    high = StopCheck(StopRules(goal=1.5), "maximize").reason(_study("maximize", [("COMPLETE", 2.0)]))
    assert high.text == "hydra.sweeper.stop.goal reached: best value 2 >= 1.5 (trial 0)"
    patience = StopCheck(StopRules(patience=2), "minimize").reason(
        _study("minimize", [("COMPLETE", 1.0), ("PRUNED", 3.0), ("COMPLETE", 2.0)]))
    assert patience.as_dict() == {"rule": "patience", "reason": "hydra.sweeper.stop.patience=2 reached: 2 finished "
                                  "trials without improving on trial 0's best value 1"}
    start = StopCheck(StopRules(patience=1), "minimize").reason(_study("minimize", [("PRUNED", 3.0)]))
    assert start.text == ("hydra.sweeper.stop.patience=1 reached: 1 finished trials without improving on the start "
                          "(no COMPLETE trial)")
    with pytest.raises(SweeperConfigError, match=r"hydra.sweeper.stop \(goal=0.1, patience=2\) needs a single "
                                                 r"objective; the study has 2 directions \['minimize', 'maximize'\]"):
        StopRules.from_node({"goal": 0.1, "patience": 2}, ("minimize", "maximize"))
    with pytest.raises(SweeperConfigError, match=r"got 0$"):
        StopRules.from_node({"patience": 0}, ("minimize",))
    with pytest.raises(SweeperConfigError, match=r"'yes'$"):
        StopRules.from_node({"terminator": "yes"}, ("minimize",))


def test_terminator_true_builds_optunas_pairing_without_warnings_and_says_the_deprecation_once(caplog):
    """``terminator: true`` is ``Terminator(EMMREvaluator(), MedianErrorEvaluator(EMMREvaluator()))``: past its
    ``min_n_trials`` (20) it decides without cross-validation scores (a bare ``Terminator`` raises there and is
    turned off), Optuna's FutureWarning/ExperimentalWarning are not shown, and the deprecation is logged once in
    our words (mutation testing found none of this pinned)."""
    import warnings

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        check = StopCheck(StopRules(terminator=True), "minimize")
    assert [w for w in shown if issubclass(w.category, (FutureWarning, optuna.exceptions.ExperimentalWarning))] == []
    assert [r.getMessage() for r in caplog.records] == [
        "hydra.sweeper.stop.terminator uses optuna.terminator, which Optuna deprecated in 4.9.0 for removal in "
        "6.0.0; stop.goal and stop.patience do not depend on it"]
    built = check._terminator  # Optuna's attribute names, optuna 5.0 (the pairing is the rule under test)
    assert type(built._improvement_evaluator) is optuna.terminator.EMMREvaluator
    assert type(built._error_evaluator) is optuna.terminator.MedianErrorEvaluator
    assert type(built._error_evaluator._paired_improvement_evaluator) is optuna.terminator.EMMREvaluator
    study = _study("minimize", [("COMPLETE", float((i * 7) % 11)) for i in range(21)])
    caplog.clear()
    check.reason(study)
    assert check._terminator is not None and not [r for r in caplog.records if "is off" in r.getMessage()]


def test_the_terminator_messages_in_full():
    with pytest.raises(SweeperConfigError) as refused:
        StopRules.from_node({"terminator": 3}, ("minimize",))
    assert str(refused.value) == (
        "hydra.sweeper.stop.terminator must be true (Optuna's Terminator with EMMR and the median error, no "
        "cross-validation scores needed), false, or a node with _target_ building an "
        "optuna.terminator.BaseTerminator (docs/how-to/stop-rules.md); got 3")
    with pytest.raises(SweeperConfigError) as refused:
        StopCheck(StopRules.from_node({"terminator": {"_target_": "optuna.terminator.Nope"}}, ("minimize",)), "minimize")
    assert str(refused.value).startswith("hydra.sweeper.stop.terminator could not be built: InstantiationException: ")


def test_a_goal_equal_to_the_best_value_stops_in_both_directions():
    assert _reason(StopRules(goal=2.0), "maximize", [("COMPLETE", 2.0)])[0] == "goal"
    assert _reason(StopRules(goal=2.0), "minimize", [("COMPLETE", 2.0)])[0] == "goal"
