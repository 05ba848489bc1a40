"""The task's own calls to Optuna's artifact API and to MLflow, under real torchrun on CPU (cases C53, C57, C58).

``tests/apps/user_calls_app.py`` does what users write: the FAQ's ``optuna.artifacts.upload_artifact`` on the
trial's rank 0 (optuna#6015), ``with mlflow.start_run(): mlflow.log_param(...)`` (mlflow#11782,
transformers#13362), fluent ``mlflow.log_metric`` on every rank, ``RANK`` read at import time. Each run's working
directory is a fresh folder, so a file MLflow leaves there (its default store ``./mlflow.db``) is seen.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from tests.multirank.sweep_helpers import load
from tests.torchrun_utils import REPO, TorchrunResult, run_torchrun
from tests.tracking_readers import mlflow_history, mlflow_runs

pytestmark = pytest.mark.torchrun

APP = REPO / "tests" / "apps" / "user_calls_app.py"


def _run(tmp_path: Path, calls: str, *overrides: str, timeout_s: float = 150) -> TorchrunResult:
    """``torchrun --nproc-per-node 2 user_calls_app.py -m`` in the empty folder ``tmp_path/cwd``."""
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    args = ["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.sweeper.rank_timeout=30", "hydra.sweeper.plots=false",
            "hydra.sweeper.sampler.seed=1", *overrides]
    return run_torchrun(APP, args, nproc=2, timeout_s=timeout_s, cwd=cwd,
                        extra_env={"DSO_RECORD_DIR": str(tmp_path / "records"), "DSO_USER_CALLS": calls})


def _records(tmp_path: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "records").glob("trial*.json"))]


def _trial_runs(tmp_path: Path) -> dict[int, object]:
    """``{trial number: its MLflow run}`` in the sweep's default store."""
    runs = mlflow_runs(f"sqlite:///{tmp_path / 'sweep'}/mlflow.db", "user_calls_app")
    return {int(r.data.tags["ds_optuna.trial"]): r for r in runs if "ds_optuna.trial" in r.data.tags}


@pytest.mark.timeout(220)
@pytest.mark.parametrize("n_jobs", [1, 2])
def test_c53_an_artifact_uploaded_on_the_trials_rank_0_is_stored_and_linked_to_the_trial(tmp_path: Path,
                                                                                         n_jobs: int) -> None:
    """The FAQ's way to keep each trial's model, with the trial's ``optuna_trial()``: one world of 2 ranks
    (rank 1 gets a clear error), and 2 trial groups (group 1's rank 0 is global rank 1: its storage calls go
    to global rank 0's study service).

    The same launches carry two more of the task's own calls (issue 39: one launch each, not one per call):
    with one world of 2 ranks, ``start_run(nested=True)`` on every rank (C57: on the trial's rank 0 a child of
    the trial's run, on rank 1 the trial's run itself, and no other run, no ``./mlflow.db`` left behind); with
    two trial groups, the app's module-level ``RANK`` (C58: the launch's, 1, in trial group 1, while the task's
    ``RANK`` and ``current_trial().rank`` are 0: the process says so once, and where to read the trial's rank)."""
    if n_jobs == 1:
        r = _run(tmp_path, "artifact,mlflow_nested", "x=interval(0,1)", "hydra.sweeper.n_trials=4",
                 "hydra.sweeper.tracking.report_to=[mlflow]", timeout_s=200)
    else:
        r = _run(tmp_path, "artifact", "x=interval(0,1)", "hydra.sweeper.n_trials=4", "hydra.sweeper.n_jobs=2",
                 timeout_s=200)
    assert r.returncode == 0, r.output[-4000:]
    study = load(tmp_path, "user_calls_app")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4, r.output[-3000:]
    store = optuna.artifacts.FileSystemArtifactStore(str(tmp_path / "sweep" / "artifacts"))
    uploaded = {rec["number"]: rec["artifact_id"] for rec in _records(tmp_path) if "artifact_id" in rec}
    for t in study.trials:
        metas = optuna.artifacts.get_all_artifact_meta(t, storage=study._storage)
        assert [(m.artifact_id, m.filename) for m in metas] == [(uploaded[t.number], "model.txt")], t.number
        got = tmp_path / f"got{t.number}.txt"
        optuna.artifacts.download_artifact(artifact_store=store, artifact_id=metas[0].artifact_id, file_path=str(got))
        assert got.read_text() == f"model of trial {t.number}"
    recs = _records(tmp_path)
    assert all(rec["listed"] == [rec["artifact_id"]] for rec in recs if "artifact_id" in rec)
    if n_jobs == 1:  # rank 1 is told where the trial is
        errors = [rec["error"] for rec in recs if rec["trial_rank"] == 1]
        assert len(errors) == 4 and all("GlueUsageError" in e and "rank 0 only" in e for e in errors), errors
        # C57: start_run(nested=True) on every rank
        uri = f"sqlite:///{tmp_path / 'sweep'}/mlflow.db"
        runs = _trial_runs(tmp_path)
        nested = [x for x in mlflow_runs(uri, "user_calls_app") if "ds_optuna.study" not in x.data.tags]
        for t in study.trials:
            run = runs[t.number]
            assert run.info.status == "FINISHED" and run.data.metrics["value"] == t.value
            assert run.data.params["nested_rank1"] == "0.001"  # rank 1 resumes the trial's run
            children = [x for x in nested if x.data.tags.get("mlflow.parentRunId") == run.info.run_id]
            assert [x.data.params for x in children] == [{"nested_rank0": "0.001"}]
        assert len(nested) == 4, [x.info.run_name for x in nested]
        assert not list((tmp_path / "cwd").iterdir()), list((tmp_path / "cwd").iterdir())
    else:  # both groups ran trials and uploaded from their own rank 0
        assert {t.user_attrs["ds_optuna:trial_group"] for t in study.trials} == {0, 1}
        assert all("error" not in rec for rec in recs)
        # C58: a rank read at import time in a trial group is named with where to read it
        assert {(rec["import_rank"], rec["env_rank"], rec["trial_rank"]) for rec in recs} <= {(0, 0, 0), (1, 0, 0)}
        warning = ("rank 1 of the launch, rank 0 of trial group 1/2: the script read torchrun's variables before "
                   "the sweep")
        assert r.output.count(warning) == 1, r.output[-4000:]
        line = next(x for x in r.output.splitlines() if warning in x)
        assert "RANK=1 (the trial group's: 0)" in line and "current_trial().rank" in line, line
        assert "rank 0 of the launch" not in r.output  # group 0's rank 0 reads the same RANK


MLFLOW = ["x=interval(0,1)", "hydra.sweeper.n_trials=2", "hydra.sweeper.tracking.report_to=[mlflow]",
          "hydra.sweeper.max_failure_rate=1.0"]


@pytest.mark.timeout(150)
def test_c57_the_tasks_own_start_run_is_refused_with_what_to_do(tmp_path: Path) -> None:
    """``with mlflow.start_run(): mlflow.log_param(...)`` on every rank (mlflow#11782): on the trial's rank 0 the
    trial's run is active, MLflow refuses a second one, and the trial's error says why and what to write instead.
    On rank 1 the same ``start_run`` lands in the trial's run (its ``log_param`` is there, no other run appears):
    what ``start_run`` on rank 1 only does (issue 39: that case's own launch folded in here)."""
    r = _run(tmp_path, "mlflow_with", *MLFLOW)
    assert r.returncode == 0, r.output[-4000:]
    study = load(tmp_path, "user_calls_app")
    assert [t.state.name for t in study.trials] == ["FAIL", "FAIL"]
    runs = _trial_runs(tmp_path)
    for t in study.trials:
        error = runs[t.number].data.tags["ds_optuna.error"]
        assert "is already active" in error and "the sweeper makes the trial's MLflow run the active run" in error
        assert "mlflow.start_run(nested=True)" in error and "no start_run" in error, error
        assert runs[t.number].data.params["lr"] == "0.001"  # rank 1's start_run: the trial's run
    everything = mlflow_runs(f"sqlite:///{tmp_path / 'sweep'}/mlflow.db", "user_calls_app")
    assert [x.info.run_name for x in everything if "ds_optuna.study" not in x.data.tags] == []  # no other run
    assert "no start_run, or open a child run" in r.output
    assert not list((tmp_path / "cwd").iterdir()), list((tmp_path / "cwd").iterdir())


@pytest.mark.timeout(200)
@pytest.mark.parametrize("calls", ["mlflow_fluent,mlflow_autolog"])  # nested: the C53 launch; rank 1: start_run's
def test_c57_the_tasks_mlflow_calls_land_in_the_trials_run_and_leave_no_file(tmp_path: Path, calls: str) -> None:
    """Fluent calls on every rank (and after ``mlflow.autolog()``): each lands in the trial's run, no other run
    appears, and no rank leaves MLflow's default store ``./mlflow.db`` behind. (``start_run`` on rank 1: the
    start_run test above; ``start_run(nested=True)`` on every rank: the C53 launch with one world.)"""
    r = _run(tmp_path, calls, *MLFLOW)
    assert r.returncode == 0, r.output[-4000:]
    study = load(tmp_path, "user_calls_app")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"], r.output[-3000:]
    uri = f"sqlite:///{tmp_path / 'sweep'}/mlflow.db"
    everything = mlflow_runs(uri, "user_calls_app")
    runs = _trial_runs(tmp_path)
    nested = [x for x in everything if "ds_optuna.study" not in x.data.tags]
    for t in study.trials:
        run = runs[t.number]
        assert run.info.status == "FINISHED" and run.data.metrics["value"] == t.value
        if "mlflow_fluent" in calls:  # rank 0's at step 0, rank 1's at step 1
            assert mlflow_history(uri, run.info.run_id, "user_metric") == {0: t.params["x"], 1: t.params["x"]}
            assert run.data.metrics["autolog_metric"] == 1.0
    assert nested == [], [x.info.run_name for x in nested]
    assert not list((tmp_path / "cwd").iterdir()), list((tmp_path / "cwd").iterdir())


def test_c58_stale_globals_names_the_launchs_values_only() -> None:
    from hydra_plugins.ds_optuna_sweeper._loop._import_time_env import stale_globals

    launch = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3"}
    group = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    namespace = {"RANK": 3, "world_size": "4", "local_rank": 1, "GLOBAL_RANK": 3, "rank_ok": 3, "LOCAL_WORLD_SIZE": 2,
                 "IS_RANK": True, "os": object()}
    assert stale_globals(namespace, launch, group) == {"RANK": (3, 1), "world_size": (4, 2), "GLOBAL_RANK": (3, 1)}
    assert stale_globals({"RANK": 0}, {"RANK": "0"}, {"RANK": "0"}) == {}  # group 0's first rank: nothing stale
