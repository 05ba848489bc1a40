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
    return {int(r.data.tags["ds_optuna.trial"]): r for r in runs if r.data.tags.get("ds_optuna.kind") == "trial"}


@pytest.mark.timeout(220)
@pytest.mark.parametrize("n_jobs", [1, 2])
def test_c53_an_artifact_uploaded_on_the_trials_rank_0_is_stored_and_linked_to_the_trial(tmp_path: Path,
                                                                                         n_jobs: int) -> None:
    """The FAQ's way to keep each trial's model, with the trial's ``optuna_trial()``: one world of 2 ranks
    (rank 1 gets a clear error), and 2 trial groups (group 1's rank 0 is global rank 1: its storage calls go
    to global rank 0's study service)."""
    r = _run(tmp_path, "artifact", "x=interval(0,1)", "hydra.sweeper.n_trials=4", f"hydra.sweeper.n_jobs={n_jobs}",
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
    else:  # both groups ran trials and uploaded from their own rank 0
        assert {t.user_attrs["ds_optuna:trial_group"] for t in study.trials} == {0, 1}
        assert all("error" not in rec for rec in recs)
