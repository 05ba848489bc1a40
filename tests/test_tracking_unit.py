"""Issue 25, in one process: the tracking settings' checks, redaction, a tracker that fails, and MLflow's run
lookup (a retry continues its run, a refit never does, runs left RUNNING by a crash are closed) on a real store."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hydra_plugins.ds_optuna_sweeper._errors import SweeperConfigError
from hydra_plugins.ds_optuna_sweeper._tracking._mlflow import MlflowTracker
from hydra_plugins.ds_optuna_sweeper._tracking._record import TrialRecord, TrialStart, redact
from hydra_plugins.ds_optuna_sweeper._settings import TrackingSettings
from hydra_plugins.ds_optuna_sweeper._tracking._task_env import RUN_NAME_ENV, hf_tracking_args, trial_tracking
from hydra_plugins.ds_optuna_sweeper._tracking._tracking import Tracking
from hydra_plugins.ds_optuna_sweeper.config import TrackingConf


def _settings(**values) -> TrackingSettings:
    node = OmegaConf.merge(OmegaConf.structured(TrackingConf), values)
    return TrackingSettings.from_node(node)


def test_settings_name_the_trackers_and_refuse_unknown_ones() -> None:
    assert _settings().report_to == ()
    assert _settings(report_to=["MLflow", "tensorboard"]).report_to == ("mlflow", "tensorboard")
    with pytest.raises(SweeperConfigError, match="'neptune'; the trackers are mlflow, tensorboard, wandb"):
        _settings(report_to=["neptune"])
    with pytest.raises(SweeperConfigError, match="names 'mlflow' twice"):
        _settings(report_to=["mlflow", "mlflow"])
    with pytest.raises(SweeperConfigError, match="wandb.mode='cloud'"):
        _settings(report_to=["wandb"], wandb={"mode": "cloud"})
    s = _settings(report_to=["mlflow"])
    assert s.mlflow_uri("/tmp/sw") == "sqlite:////tmp/sw/mlflow.db"
    assert s.tensorboard_dir("/tmp/sw") == "/tmp/sw/tensorboard"


@pytest.mark.parametrize("text, expected", [
    ("postgresql://me:hunter2@db/optuna", "postgresql://me:***@db/optuna"),
    ("a=mysql+pymysql://u:p%40ss@h:3306/x b=2", "a=mysql+pymysql://u:***@h:3306/x b=2"),
    ("http://127.0.0.1:5000 and sqlite:///x.db", "http://127.0.0.1:5000 and sqlite:///x.db"),  # no password: unchanged
])
def test_redact_hides_every_url_password(text: str, expected: str) -> None:
    assert redact(text) == expected


class _Refusing:
    """A tracker (the interface of ``_mlflow``'s and ``_tracking``'s trackers) whose writes are refused."""

    name = "refusing"

    def __init__(self) -> None:
        self.calls = 0

    def trial_started(self, start: TrialStart) -> dict[str, str]:
        self.calls += 1
        raise ConnectionError("503 Service Unavailable for http://u:secret@tracker")

    def trial_ended(self, record, env) -> None:  # pragma: no cover - never reached: dropped at the start
        raise AssertionError("called after it failed")

    def where(self) -> str:
        return "nowhere"


def test_a_tracker_that_refuses_a_write_is_logged_once_and_dropped(tmp_path: Path, caplog) -> None:
    refusing = _Refusing()
    mlflow = MlflowTracker(f"sqlite:///{tmp_path}/mlflow.db", "exp", "study", {})
    tracking = Tracking([refusing, mlflow])
    with caplog.at_level(logging.WARNING):
        for n in range(3):
            env = tracking.trial_started(TrialStart(n, n, {"x": 0.5}))
            assert "MLFLOW_RUN_ID" in env  # the other tracker goes on
            tracking.trial_ended(n, lambda s: TrialRecord(s, "COMPLETE", (1.0,)))
    warnings = [r.getMessage() for r in caplog.records if "refusing" in r.getMessage()]
    assert len(warnings) == 1 and refusing.calls == 1, warnings
    assert "u:***@tracker" in warnings[0] and "secret" not in warnings[0]


def test_mlflow_retry_continues_its_run_and_a_refit_gets_its_own(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracker = MlflowTracker(uri, "exp", "study", {"team": "a"})
    first = tracker.trial_started(TrialStart(0, 0, {"lr": 0.1}, ("epochs=2",)))["MLFLOW_RUN_ID"]
    tracker.trial_ended(TrialRecord(TrialStart(0, 0), "INTERRUPTED", intermediate={0: 1.0}), {"MLFLOW_RUN_ID": first})
    retry = tracker.trial_started(TrialStart(1, 0, {"lr": 0.1}, ("epochs=2",), written_steps=(0,)))["MLFLOW_RUN_ID"]
    refit = tracker.trial_started(TrialStart(0, 0, {"lr": 0.1}, refit=True))["MLFLOW_RUN_ID"]
    assert retry == first and refit != first
    other = tracker.trial_started(TrialStart(2, 2, {"lr": 0.2}))["MLFLOW_RUN_ID"]
    # A crash left runs RUNNING: closing finds them from the study's states.
    assert tracker.close_stale({0: "COMPLETE", 2: "FAIL"}) == 2  # trial 0's run (continued) and trial 2's
    run = tracker.client.get_run(other)
    assert run.info.status == "FAILED" and run.data.tags["ds_optuna.state"] == "FAIL"
    assert run.data.params == {"lr": "0.2"}
    assert tracker.client.get_run(first).data.params == {"epochs": "2", "lr": "0.1"}
    assert tracker.client.get_run(first).data.tags["team"] == "a"
    # Opening the same study again finds the same parent run.
    assert MlflowTracker(uri, "exp", "study", {}).parent_id == tracker.parent_id


def test_task_environment_is_restored_and_the_open_mlflow_run_ended(tmp_path: Path, monkeypatch) -> None:
    import mlflow

    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlflow.db", "exp", "study", {})
    env = {**tracker.trial_started(TrialStart(0, 0)), RUN_NAME_ENV: "trial-0"}
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "user's own")
    with trial_tracking(env):
        assert os.environ["MLFLOW_EXPERIMENT_NAME"] == "exp"
        assert hf_tracking_args({}, {"run_name", "logging_dir"}) == {"run_name": "trial-0"}
        assert hf_tracking_args({"run_name": "mine"}, {"run_name"}) == {}
        assert mlflow.active_run().info.run_id == env["MLFLOW_RUN_ID"]  # the trial's run is the active run
        mlflow.log_metric("task_metric", 0.5, step=3)  # what a task (or a library after train()) logs lands there
    assert mlflow.active_run() is None  # ended with the task
    assert os.environ["MLFLOW_EXPERIMENT_NAME"] == "user's own" and "MLFLOW_RUN_ID" not in os.environ
    assert tracker.client.get_run(env["MLFLOW_RUN_ID"]).data.metrics == {"task_metric": 0.5}


def test_each_trial_in_one_process_logs_into_its_own_wandb_run(tmp_path: Path) -> None:
    """W&B reads its environment once per process: without the trial's run made ``wandb.run`` by the sweeper, the
    second trial's ``wandb.init()`` (as transformers' ``WandbCallback`` calls it when ``wandb.run`` is None)
    reopened the first trial's run (found by a new user). Here two trials run one after the other in this
    process, logging as the callback does; each trial's rows land in its own run, and no console capture is kept."""
    import wandb

    from hydra_plugins.ds_optuna_sweeper._tracking._tracking import WandbTracker
    from tests.tracking_readers import wandb_runs

    tracker = WandbTracker("proj", None, "offline", str(tmp_path), "study", "key", [])
    for number in (0, 1):
        start = TrialStart(number, number, {"lr": 0.1 * (number + 1)}, ("secret=postgresql://u:hunter2@h/db",))
        with trial_tracking(tracker.trial_started(start)):
            print("postgresql://u:hunter2@h/db")  # a launch line on stdout
            if wandb.run is None:  # transformers' WandbCallback.setup
                wandb.init(project=os.getenv("WANDB_PROJECT", "huggingface"))
            wandb.log({"train/loss": 1.0 + number})
        tracker.trial_ended(TrialRecord(start, "COMPLETE", (float(number),)), tracker.trial_started(start))
    tracker.close_study("FINISHED")  # as the sweeper at its end: W&B writes a run's file after run.finish() returns
    runs = {run["name"]: run for run in wandb_runs(tmp_path / "wandb").values()}
    assert sorted(runs) == ["trial-0", "trial-1"]
    for number in (0, 1):
        losses = [row["train/loss"] for row in runs[f"trial-{number}"]["history"] if "train/loss" in row]
        assert losses == [1.0 + number], (number, runs[f"trial-{number}"]["history"])
        assert runs[f"trial-{number}"]["summary"]["value"] == float(number)
    for path in (tmp_path / "wandb").rglob("*"):
        assert not path.is_file() or b"hunter2" not in path.read_bytes(), path


def test_a_refit_baseline_gets_a_run_named_after_it_without_a_trial_tag(tmp_path: Path) -> None:
    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlflow.db", "exp", "study", {})
    start = TrialStart(-1, -1, {"lr": 3e-4}, refit=True, baseline="hand_picked")
    run_id = tracker.trial_started(start)["MLFLOW_RUN_ID"]
    tracker.trial_ended(TrialRecord(start, "COMPLETE", metrics={"test_accuracy": 0.87}), {"MLFLOW_RUN_ID": run_id})
    run = tracker.client.get_run(run_id)
    assert run.info.run_name == "refit-hand_picked" and run.info.status == "FINISHED"
    assert run.data.tags["ds_optuna.baseline"] == "hand_picked" and "ds_optuna.trial" not in run.data.tags
    assert run.data.metrics["test_accuracy"] == 0.87 and run.data.params == {"lr": "0.0003"}
    assert tracker.close_stale({0: "COMPLETE"}) == 0  # never taken for a trial's run


def test_c59_a_retry_run_is_named_after_its_attempt_and_drops_the_interrupted_attempts_error(tmp_path: Path) -> None:
    """Issue 38, C59: a retry's result landed in the run named after the trial it continues, still tagged with the
    preemption error. The run keeps its curve and params; its name says which attempt wrote it."""
    tracker = MlflowTracker(f"sqlite:///{tmp_path}/mlflow.db", "exp", "study", {})
    first = tracker.trial_started(TrialStart(0, 0, {"lr": 0.1}))["MLFLOW_RUN_ID"]
    tracker.trial_ended(TrialRecord(TrialStart(0, 0), "INTERRUPTED", intermediate={0: 1.0},
                                    error="preempted (SIGTERM) (last reported step 0)"), {"MLFLOW_RUN_ID": first})
    assert tracker.client.get_run(first).data.tags["ds_optuna.error"].startswith("preempted")
    retry = TrialStart(1, 0, {"lr": 0.1}, written_steps=(0,))
    assert tracker.trial_started(retry)["MLFLOW_RUN_ID"] == first
    run = tracker.client.get_run(first)
    assert run.info.run_name == "trial-1 (resumes trial-0)" and "ds_optuna.error" not in run.data.tags
    assert run.data.tags["ds_optuna.state"] == "RUNNING" and run.data.tags["ds_optuna.resumed_by_trial"] == "1"
    tracker.trial_ended(TrialRecord(retry, "COMPLETE", (0.5,), intermediate={1: 0.5}), {"MLFLOW_RUN_ID": first})
    run = tracker.client.get_run(first)
    assert run.info.status == "FINISHED" and run.data.tags["ds_optuna.state"] == "COMPLETE"
    assert "ds_optuna.error" not in run.data.tags and run.data.metrics["value"] == 0.5
    assert run.data.params == {"lr": "0.1"}


def test_c59_the_parent_run_holds_the_studys_best_value_and_params(tmp_path: Path) -> None:
    """Issue 38, C59: the study's parent run held no best value. At the end it gets ``best_value`` and the best
    trial's number and params (as tags: a resumed study's new best would change a param, which MLflow refuses)."""
    import optuna

    from hydra_plugins.ds_optuna_sweeper._tracking._record import StudyBest

    study = optuna.create_study(direction="minimize")
    for x in (0.5, 0.2, 0.9):
        study.enqueue_trial({"x": x})
    study.optimize(lambda t: t.suggest_float("x", 0, 1) ** 2, n_trials=3)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracking = Tracking([MlflowTracker(uri, "exp", "study", {})])
    tracking.close({}, "FINISHED", StudyBest.of(study))
    parent = MlflowTracker(uri, "exp", "study", {})
    run = parent.client.get_run(parent.parent_id)
    assert run.data.metrics["best_value"] == study.best_value == pytest.approx(0.04)
    assert run.data.tags["ds_optuna.best_trial"] == "1" and run.data.tags["ds_optuna.best.x"] == "0.2"
    # resumed with a better trial: the same parent gets the new best (no "changing param values" refusal)
    study.enqueue_trial({"x": 0.1})
    study.optimize(lambda t: t.suggest_float("x", 0, 1) ** 2, n_trials=1)
    parent.close_study("FINISHED", StudyBest.of(study))
    run = parent.client.get_run(parent.parent_id)
    assert run.data.metrics["best_value"] == pytest.approx(0.01) and run.data.tags["ds_optuna.best.x"] == "0.1"
    assert StudyBest.of(optuna.create_study()) is None  # no complete trial: nothing to log


def test_c59_the_final_table_lists_the_refit_and_baseline_metrics() -> None:
    """Issue 38, C59: the trials table at the end left out the refit runs; their metrics get a table of their own."""
    from hydra_plugins.ds_optuna_sweeper._study._results import refit_table

    table = refit_table([
        {"trial": 3, "state": "COMPLETE", "metrics": {"test_loss": 0.123456789, "test_acc": 0.9}},
        {"trial": None, "baseline": "hand_picked", "state": "COMPLETE", "metrics": {"test_loss": 0.2}},
        {"trial": 5, "state": "FAIL", "metrics": {}},
    ]).splitlines()
    assert table[0].split() == ["run", "state", "test_loss", "test_acc"]
    assert table[1].split() == ["trial", "3", "COMPLETE", "0.123457", "0.9"]
    assert table[2].split() == ["baseline", "hand_picked", "COMPLETE", "0.2", "-"]
    assert table[3].split() == ["trial", "5", "FAIL", "-", "-"]
