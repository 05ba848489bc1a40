"""Issue 25: tracking owned by the sweeper, under real torchrun on CPU, read back with each tracker's own reader.

A 2-rank sweep with pruning and a failing trial writes exactly one run per trial to MLflow (a local store),
TensorBoard (event files) and W&B (offline run files), with the trial's params, its intermediate values by
step (rank 0's: rank 1 reports -1e9, which must appear nowhere), its final value and state, and nothing from
rank 1 (rank 1 never imports a tracker). The same command resumed adds the new trials' runs under the same
parent. A storage-style password in an override never reaches a tracker. The HF Trainer's own curves, and a
retry that resumes from a checkpoint, are checked in ``test_preemption.py`` (the same runs).
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tests.multirank.sweep_helpers import load, records, run_sweep
from tests.tracking_readers import mlflow_history, mlflow_runs, tensorboard_scalars, wandb_runs

pytestmark = pytest.mark.torchrun

SECRET = "hunter2"
TRACKED = [
    "steps=4", "x=interval(0,1)", f"label=postgresql://me:{SECRET}@db.example/optuna",
    "hydra/sweeper/pruner=median", "hydra.sweeper.pruner.n_startup_trials=2", "hydra.sweeper.pruner.n_warmup_steps=1",
    "fail_on_rank=1", "fail_on_trial=1", "hydra.sweeper.max_failure_rate=1.0",
    "hydra.sweeper.tracking.report_to=[mlflow,tensorboard,wandb]", "hydra.sweeper.tracking.wandb.mode=offline",
    "hydra.sweeper.sampler.seed=3",
]
MLFLOW_STATUS = {"COMPLETE": "FINISHED", "PRUNED": "FINISHED", "FAIL": "FAILED"}


def _child_runs(uri: str) -> tuple[list, dict[int, object]]:
    """(refit runs, {trial number: its run}) under the study's one parent run."""
    runs = mlflow_runs(uri, "sweep_app")
    parents = [r for r in runs if r.data.tags.get("ds_optuna.kind") == "study"]
    children = [r for r in runs if r.data.tags.get("ds_optuna.kind") != "study"]
    assert len(parents) == 1, [r.info.run_name for r in runs]
    assert all(r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for r in children)
    refits = [r for r in children if r.data.tags.get("ds_optuna.refit") == "true"]
    trials = [r for r in children if r not in refits]
    by_trial = {int(r.data.tags["ds_optuna.trial"]): r for r in trials}
    assert len(by_trial) == len(trials), "two runs for one trial"
    return refits, by_trial


def _check_trackers(tmp_path: Path, study: optuna.Study) -> None:
    """Each tracker holds one run per trial of ``study`` (and one per refit run), equal to the study; returns the
    MLflow refit runs."""
    sweep = tmp_path / "sweep"
    uri = f"sqlite:///{sweep}/mlflow.db"
    refits, runs = _child_runs(uri)
    wandb = {run["name"]: run for run in wandb_runs(sweep / "wandb").values()}
    refit_names = [r.info.run_name for r in refits]
    assert sorted(runs) == [t.number for t in study.trials]
    assert sorted(wandb) == sorted([*(f"trial-{t.number}" for t in study.trials), *refit_names])
    assert sorted(p.name for p in (sweep / "tensorboard").iterdir()) == sorted(
        [*(f"trial_{t.number}" for t in study.trials), *(n.replace("-", "_") for n in refit_names)])
    for t in study.trials:
        run, state = runs[t.number], t.state.name
        # MLflow: params (the sampled x and the fixed overrides), state, status, curve by step, final value
        assert float(run.data.params["x"]) == t.params["x"] and run.data.params["steps"] == "4"
        assert run.data.tags["ds_optuna.state"] == state and run.info.status == MLFLOW_STATUS[state], (t.number, state)
        assert run.data.tags["ds_optuna.study"] == "sweep_app"
        assert run.info.artifact_uri.startswith(str(sweep / "mlartifacts")), run.info.artifact_uri  # not ./mlruns
        assert mlflow_history(uri, run.info.run_id, "intermediate_value") == t.intermediate_values
        if state == "COMPLETE":
            assert run.data.metrics["value"] == t.value
        if state == "PRUNED":
            assert run.data.tags["ds_optuna.pruned_at_step"] == str(max(t.intermediate_values))
        if state == "FAIL":
            assert "injected failure on rank 1" in run.data.tags["ds_optuna.error"]
        assert f"x={t.params['x']}" in run.data.tags["ds_optuna.rerun"]
        # TensorBoard: the same curve (float32) in the trial's event dir
        scalars = tensorboard_scalars(sweep / "tensorboard" / f"trial_{t.number}")
        assert scalars["intermediate_value"] == pytest.approx(t.intermediate_values, rel=1e-6)
        # W&B: config, curve on the trial's own step axis, state, exit code
        w = wandb[f"trial-{t.number}"]
        assert w["group"] == "sweep_app" and w["config"]["x"] == t.params["x"]
        curve = {row["trial_step"]: row["intermediate_value"] for row in w["history"] if "intermediate_value" in row}
        assert curve == t.intermediate_values
        assert w["summary"]["ds_optuna/state"] == state and w["exit_codes"][-1] == (1 if state == "FAIL" else 0)
        if state == "COMPLETE":
            assert w["summary"]["value"] == t.value
    tracker_files = [sweep / "mlflow.db", *(sweep / "tensorboard").rglob("*"), *(sweep / "wandb").rglob("*")]
    for path in tracker_files:  # the password in an override reached no tracker (the study keeps the override)
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    return refits


@pytest.mark.timeout(300)
def test_two_rank_sweep_writes_one_run_per_trial_to_each_tracker_from_rank_0_only(tmp_path: Path) -> None:
    """THE tracking launch: 5 trials (one FAIL, some PRUNED, some COMPLETE) and the refit of the best. The same
    command resumed with a larger budget (new runs under the same parent, none duplicated) is rank 0's alone:
    ``tests/test_tracking_in_process.py``."""
    r = run_sweep(tmp_path, *TRACKED, "hydra.sweeper.n_trials=5", "hydra.sweeper.refit.enabled=true", timeout_s=200)
    assert r.returncode == 0, r.output[-4000:]
    study = load(tmp_path)
    states = [t.state.name for t in study.trials]
    assert states[1] == "FAIL" and "PRUNED" in states and "COMPLETE" in states, states
    refits = _check_trackers(tmp_path, study)
    recs = records(tmp_path)
    for (number, rank), rec in recs.items():  # the trackers live on rank 0 alone
        assert rec["trackers_imported"] == (["mlflow", "tensorboard", "wandb"] if rank == 0 else []), (number, rank)
        if number != study.best_trial.number:  # the best trial's records are its refit's (same file names)
            assert rec["tracking_env"]["WANDB_RUN_ID"].endswith(f"-t{number}")  # every rank's task can join the run
        else:
            assert f"-refit{number}-" in rec["tracking_env"]["WANDB_RUN_ID"], (number, rank)  # the refit run's
    assert "mlflow ui --backend-store-uri sqlite:///" in r.output

    # The refit of the best trial gets a run of its own, tagged as a refit.
    assert [(r.info.run_name, r.data.tags["ds_optuna.trial"], r.info.status) for r in refits] == [
        (f"refit-{study.best_trial.number}", str(study.best_trial.number), "FINISHED")]
    assert refits[0].data.metrics["value"] == study.best_value
    # C59: the parent run holds the study's best; the final table lists the refit's metrics too
    parent = [r for r in mlflow_runs(f"sqlite:///{tmp_path / 'sweep'}/mlflow.db", "sweep_app")
              if r.data.tags.get("ds_optuna.kind") == "study"][0]
    assert parent.data.metrics["best_value"] == study.best_value
    assert parent.data.tags["ds_optuna.best_trial"] == str(study.best_trial.number)
    assert float(parent.data.tags["ds_optuna.best.x"]) == study.best_params["x"]
    table = r.output.split("Refit runs of study 'sweep_app':")[1].splitlines()
    assert table[1].split() == ["run", "state", "value"] and table[2].split()[:3] == [
        "trial", str(study.best_trial.number), "COMPLETE"], table[:3]
