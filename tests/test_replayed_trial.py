"""``ReplayedTrial``: the trial a refit or a pasted rerun line (``DS_OPTUNA_TRIAL``) hands the task.

docs/reference/results.md: ``current_trial()`` replays a trial outside a sweep, "so ``in_trial()`` is true there and
``suggest_*`` return the trial's values; ``report`` and ``should_prune`` do nothing". No process group and
no study exist in this process: a call that tried to talk to rank 0 or to a study would fail here.
"""

import json

import optuna
import pytest

from hydra_plugins.ds_optuna_sweeper._task._replayed import REPLAY_ENV, ReplayedTrial
from hydra_plugins.ds_optuna_sweeper._glue._pruning_policy import pruning_trial
from hydra_plugins.ds_optuna_sweeper._task._slot import current_trial, in_trial, record_optimizer_steps, trial_slot


def test_report_and_should_prune_do_nothing_however_bad_the_values():
    trial = ReplayedTrial(4, {"lr": 0.01})
    for step, value in enumerate([1.0, float("nan"), -1e9, 0.0]):
        assert trial.report(value, step) is None
        assert trial.should_prune() is False
        trial.prune_if_needed()  # never raises optuna.TrialPruned
    assert trial.last_step == 3
    assert trial.set_user_attr("k", 1) is None and trial.record_on_rank0("k", 1) is None


def test_suggest_returns_the_replayed_values_and_names_an_unknown_param():
    trial = ReplayedTrial(4, {"lr": 0.01, "layers": 3, "act": "relu"})
    assert trial.suggest_float("lr", 1e-5, 1e-5) == 0.01  # the range is ignored
    assert trial.suggest_int("layers", 1, 2) == 3
    assert trial.suggest_categorical("act", ["gelu"]) == "relu"
    with pytest.raises(KeyError, match=r"replays trial 4 with params \['act', 'layers', 'lr'\], but the task asked "
                                       r"for 'width'"):
        trial.suggest_int("width", 8, 64)


def test_the_unknown_param_error_names_who_replays_it():
    """A refit of a trial and a refit baseline say so, not "DS_OPTUNA_TRIAL replays" (no variable is set
    there); a baseline's message says how to give the value (a new user could not find out)."""
    with pytest.raises(KeyError, match=r"the refit of trial 4 with params \['lr'\], but the task asked for 'width'"):
        ReplayedTrial(4, {"lr": 0.01}, refit=True).suggest_int("width", 8, 64)
    with pytest.raises(KeyError) as err:
        ReplayedTrial(-2, {}, refit=True, baseline="wide").suggest_int("width", 8, 64)
    assert "baseline wide answers suggest_* only with its own values [], but the task asked for 'width'" in str(err.value)
    assert "hydra.sweeper.refit.baselines.wide={+width:<value>}" in str(err.value) and REPLAY_ENV not in str(err.value)


def test_a_rerun_line_replays_its_trial_through_current_trial(monkeypatch):
    monkeypatch.setenv(REPLAY_ENV, json.dumps({"number": 7, "params": {"lr": 0.5}}))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    trial = current_trial()
    assert isinstance(trial, ReplayedTrial) and in_trial()
    assert (trial.number, trial.params, trial.rank, trial.world_size) == (7, {"lr": 0.5}, 1, 2)
    assert trial.suggest_float("lr", 0.0, 1.0) == 0.5
    assert trial.should_prune() is False
    assert pruning_trial() is None  # the pruning callbacks stand aside


def test_a_refit_slot_gives_no_pruning_trial_and_stores_no_optimizer_steps():
    """Positive control first: a live trial in the slot is the pruning trial and gets optimizer_steps."""
    from hydra_plugins.ds_optuna_sweeper._comm._ranks import RankComm
    from hydra_plugins.ds_optuna_sweeper._task._handle import RankTrial
    from hydra_plugins.ds_optuna_sweeper._task._slot import STEPS_ATTR

    study = optuna.create_study()
    live = study.ask()
    with trial_slot(RankTrial(live.number, {}, RankComm(), live)) as rank_trial:
        assert pruning_trial() is rank_trial
        record_optimizer_steps(12)
    assert study.trials[live.number].user_attrs == {STEPS_ATTR: 12}
    with trial_slot(ReplayedTrial(live.number, {})):
        assert in_trial() and pruning_trial() is None
        record_optimizer_steps(99)
    assert study.trials[live.number].user_attrs == {STEPS_ATTR: 12}


def test_a_malformed_replay_variable_is_refused_naming_the_form(monkeypatch):
    monkeypatch.setenv(REPLAY_ENV, '{"params": {}}')
    with pytest.raises(RuntimeError, match=r'DS_OPTUNA_TRIAL must be \{"number": n, "params": \{...\}\}'):
        current_trial()


def test_a_replayed_trial_has_no_optuna_trial_for_the_artifact_api_and_says_so():
    """C53: ``optuna_trial()`` is a live trial's, on its rank 0; a refit or rerun line stores nothing in the study."""
    from hydra_plugins.ds_optuna_sweeper import GlueUsageError

    with pytest.raises(GlueUsageError, match="the refit of trial 4 is replayed .* guard with 'if not trial.replayed:'"):
        ReplayedTrial(4, {"lr": 0.01}, refit=True).optuna_trial()
    with pytest.raises(GlueUsageError, match="^trial 4 is replayed"):
        ReplayedTrial(4, {"lr": 0.01}).optuna_trial()
