"""The rule "does a pruning callback report or stand aside" (``_pruning_policy.callback_policy``), one row
per situation, built from real objects: a real Optuna study and trial, the real process slot, the real
``DS_OPTUNA_TRIAL`` variable; the Hugging Face callback is then driven through each row.

Also: both trial classes satisfy the ``TrialHandle`` protocol that ``current_trial()`` is typed with.
"""

import inspect
import json
import typing

import optuna
import pytest

from hydra_plugins.ds_optuna_sweeper._task._handle import RankTrial, TrialHandle
from hydra_plugins.ds_optuna_sweeper._task._replayed import REPLAY_ENV, ReplayedTrial
from hydra_plugins.ds_optuna_sweeper._glue._pruning_policy import Situation, callback_policy, pruning_trial
from hydra_plugins.ds_optuna_sweeper._comm._ranks import RankComm
from hydra_plugins.ds_optuna_sweeper._task._slot import STEPS_ATTR, current_trial, record_optimizer_steps, trial_slot

SITUATIONS = ["sweep", "several objectives", "refit", "rerun line", "plain run"]

#: situation -> (reports to the trial, the sweeper's SIGTERM handler is kept, optimizer steps are stored)
TRUTH_TABLE = {
    "sweep": (True, True, True),
    "several objectives": (False, True, True),
    "refit": (False, True, False),
    "rerun line": (False, False, False),
    "plain run": (False, False, False),
}


def _enter(situation, stack, monkeypatch):
    """Put the process in ``situation``; returns (the study, the live optuna trial), or (None, None)."""
    if situation == "rerun line":
        monkeypatch.setenv(REPLAY_ENV, json.dumps({"number": 3, "params": {"lr": 0.1}}))
        return None, None
    if situation == "plain run":
        monkeypatch.delenv(REPLAY_ENV, raising=False)
        return None, None
    if situation == "refit":
        stack.enter_context(trial_slot(ReplayedTrial(3, {"lr": 0.1})))
        return None, None
    directions = ["maximize"] if situation == "sweep" else ["maximize", "minimize"]
    study = optuna.create_study(directions=directions, pruner=optuna.pruners.NopPruner())
    live = study.ask()
    stack.enter_context(trial_slot(RankTrial(live.number, {}, RankComm(), live, n_objectives=len(directions))))
    return study, live


def test_the_truth_table_covers_the_five_situations_and_nothing_else():
    assert sorted(TRUTH_TABLE) == sorted(SITUATIONS) == sorted(s.value for s in Situation)


@pytest.mark.parametrize("situation", SITUATIONS)
def test_each_situation_reports_or_stands_aside_as_the_table_says(situation, monkeypatch):
    import contextlib

    reports, sweeper_runs, stores_steps = TRUTH_TABLE[situation]
    with contextlib.ExitStack() as stack:
        study, live = _enter(situation, stack, monkeypatch)
        policy = callback_policy()
        assert policy.situation is Situation(situation)
        assert policy.sweeper_runs is sweeper_runs
        if reports:
            assert policy.report_to is current_trial() and policy.report_to.number == live.number
        else:
            assert policy.report_to is None
        assert pruning_trial() is policy.report_to
        record_optimizer_steps(7)  # stored on the live trial or nowhere; never raises
    if study is not None:
        assert (study.trials[live.number].user_attrs.get(STEPS_ATTR) == 7) is stores_steps


@pytest.mark.parametrize("situation", SITUATIONS)
def test_the_hf_callback_follows_the_table_with_metrics_named_otherwise_than_it_asks(situation, monkeypatch):
    """Where the table says "stand aside", a missing metric name raises nothing and nothing is stored;
    where it says "report", the value is stored at the step and a missing name raises naming the keys."""
    import contextlib

    pytest.importorskip("transformers")
    from transformers import TrainerControl, TrainerState

    from hydra_plugins.ds_optuna_sweeper._glue._hf_pruning import pruning_callback

    reports = TRUTH_TABLE[situation][0]
    callback = pruning_callback("eval_accuracy", step="global_step")
    state, control = TrainerState(), TrainerControl()
    state.global_step = 4
    with contextlib.ExitStack() as stack:
        study, live = _enter(situation, stack, monkeypatch)
        callback.on_evaluate(None, state, control, metrics={"eval_accuracy": 0.5})
        if reports:
            with pytest.raises(KeyError, match="not among the evaluation metrics"):
                state.global_step = 8
                callback.on_evaluate(None, state, control, metrics={"test_accuracy": 0.9})
        else:
            callback.on_evaluate(None, state, control, metrics={"test_accuracy": 0.9})
    assert callback.reported_steps == ([4] if reports else [])
    if study is not None:
        assert study.trials[live.number].intermediate_values == ({4: 0.5} if reports else {})
    assert control.should_training_stop is False


def test_a_malformed_rerun_variable_is_refused_by_the_rule_too(monkeypatch):
    monkeypatch.setenv(REPLAY_ENV, '{"params": {}}')
    with pytest.raises(RuntimeError, match=r'DS_OPTUNA_TRIAL must be \{"number": n'):
        callback_policy()


def test_the_slot_wins_over_the_rerun_variable(monkeypatch):
    """A refit is launched with ``DS_OPTUNA_TRIAL`` in its environment and a replayed trial in the slot: refit."""
    monkeypatch.setenv(REPLAY_ENV, json.dumps({"number": 1, "params": {}}))
    with trial_slot(ReplayedTrial(2, {})):
        assert callback_policy().situation is Situation.REFIT and current_trial().number == 2


# --- the handle's type ----------------------------------------------------------------------------


def _protocol_methods():
    return [name for name, value in vars(TrialHandle).items() if inspect.isfunction(value) and not name.startswith("_")]


@pytest.mark.parametrize("cls", [RankTrial, ReplayedTrial])
def test_both_trial_classes_have_the_protocols_methods_with_its_signatures(cls):
    names = _protocol_methods()
    assert {"report", "should_prune", "suggest_float", "suggest_int", "suggest_categorical", "set_user_attr"} <= set(names)
    for name in names:
        assert inspect.signature(getattr(cls, name)) == inspect.signature(getattr(TrialHandle, name)), (cls, name)


def test_both_trial_objects_satisfy_the_protocol_and_current_trial_is_typed_with_it():
    study = optuna.create_study()
    live = study.ask()
    for trial in (RankTrial(live.number, {"x": 1}, RankComm(), live), ReplayedTrial(live.number, {"x": 1})):
        assert isinstance(trial, TrialHandle)
        for attribute in typing.get_type_hints(TrialHandle):
            assert hasattr(trial, attribute), (trial, attribute)
    assert typing.get_type_hints(current_trial)["return"] is TrialHandle
