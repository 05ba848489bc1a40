"""The task's own calls to Optuna's artifact API and to MLflow, under real torchrun on CPU (cases C53, C57, C58).

``tests/apps/user_calls_app.py`` does what users write: the FAQ's ``optuna.artifacts.upload_artifact`` on the
trial's rank 0 (optuna#6015), ``with mlflow.start_run(): mlflow.log_param(...)`` (mlflow#11782,
transformers#13362), fluent ``mlflow.log_metric`` on every rank, ``RANK`` read at import time. Each run's working
directory is a fresh folder, so a file MLflow leaves there (its default store ``./mlflow.db``) is seen.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
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


#: The one world of 2 ranks (``n_jobs=1``), 8 trials, each case's calls in its own trials (issue 39: one launch, not
#: one per call): trials 0-3 C53's artifact and C57's ``start_run(nested=True)`` on every rank, trials 4-5 C57's
#: ``with mlflow.start_run()`` on every rank (refused on rank 0: the trials fail), trials 6-7 fluent calls after
#: ``mlflow.autolog()``. A trial that failed on the task's own ``start_run`` leaves no active run to the next.
ONE_WORLD_CALLS = ["artifact,mlflow_nested"] * 4 + ["mlflow_with"] * 2 + ["mlflow_fluent,mlflow_autolog"] * 2
ARTIFACT, START_RUN, FLUENT = range(0, 4), range(4, 6), range(6, 8)


@dataclass
class OneWorld:
    """The launch of :data:`ONE_WORLD_CALLS`: its folder (``sweep``, ``records``, ``cwd``), output and study."""

    path: Path
    result: TorchrunResult
    study: optuna.Study

    @property
    def uri(self) -> str:
        return f"sqlite:///{self.path / 'sweep'}/mlflow.db"

    def trial_runs(self) -> dict[int, object]:
        return _trial_runs(self.path)

    def other_runs(self) -> list:
        """Every MLflow run that is neither the study's nor a trial's: the task's own (nested) runs."""
        return [x for x in mlflow_runs(self.uri, "user_calls_app") if "ds_optuna.study" not in x.data.tags]


@pytest.fixture(scope="module")
def one_world(tmp_path_factory) -> OneWorld:
    """``user_calls_app.py -m`` at 2 ranks with :data:`ONE_WORLD_CALLS` and MLflow tracking; exit 0 checked."""
    path = tmp_path_factory.mktemp("one_world")
    r = _run(path, "|".join(ONE_WORLD_CALLS), "x=interval(0,1)", f"hydra.sweeper.n_trials={len(ONE_WORLD_CALLS)}",
             "hydra.sweeper.tracking.report_to=[mlflow]", "hydra.sweeper.max_failure_rate=1.0", timeout_s=200)
    assert r.returncode == 0, r.output[-4000:]
    study = load(path, "user_calls_app")
    expected = ["FAIL" if t in START_RUN else "COMPLETE" for t in range(len(ONE_WORLD_CALLS))]
    assert [t.state.name for t in study.trials] == expected, r.output[-3000:]
    return OneWorld(path, r, study)


def _check_artifacts(path: Path, study: optuna.Study, numbers: range) -> list[dict]:
    """Each trial of ``numbers`` holds the one artifact its rank 0 uploaded, readable from the store; every other
    trial none. Returns the records of the ``numbers`` trials."""
    store = optuna.artifacts.FileSystemArtifactStore(str(path / "sweep" / "artifacts"))
    recs = [rec for rec in _records(path) if rec["number"] in numbers]
    uploaded = {rec["number"]: rec["artifact_id"] for rec in recs if "artifact_id" in rec}
    for t in study.trials:
        metas = optuna.artifacts.get_all_artifact_meta(t, storage=study._storage)
        if t.number not in numbers:
            assert metas == [], t.number
            continue
        assert [(m.artifact_id, m.filename) for m in metas] == [(uploaded[t.number], "model.txt")], t.number
        got = path / f"got{t.number}.txt"
        optuna.artifacts.download_artifact(artifact_store=store, artifact_id=metas[0].artifact_id, file_path=str(got))
        assert got.read_text() == f"model of trial {t.number}"
    assert all(rec["listed"] == [rec["artifact_id"]] for rec in recs if "artifact_id" in rec)
    return recs


@pytest.mark.timeout(240)
def test_c53_an_artifact_uploaded_on_the_trials_rank_0_is_stored_and_linked_to_the_trial(one_world: OneWorld) -> None:
    """The FAQ's way to keep each trial's model, with the trial's ``optuna_trial()``, in one world of 2 ranks: rank
    1 gets a clear error. The same trials carry C57's ``start_run(nested=True)`` on every rank: on the trial's rank
    0 a child of the trial's run, on rank 1 the trial's run itself, and no other run, no ``./mlflow.db`` left."""
    recs = _check_artifacts(one_world.path, one_world.study, ARTIFACT)
    errors = [rec["error"] for rec in recs if rec["trial_rank"] == 1]  # rank 1 is told where the trial is
    assert len(errors) == len(ARTIFACT) and all("GlueUsageError" in e and "rank 0 only" in e for e in errors), errors
    runs = one_world.trial_runs()
    nested = one_world.other_runs()
    for t in one_world.study.trials[:len(ARTIFACT)]:
        run = runs[t.number]
        assert run.info.status == "FINISHED" and run.data.metrics["value"] == t.value
        assert run.data.params["nested_rank1"] == "0.001"  # rank 1 resumes the trial's run
        children = [x for x in nested if x.data.tags.get("mlflow.parentRunId") == run.info.run_id]
        assert [x.data.params for x in children] == [{"nested_rank0": "0.001"}]
    assert len(nested) == len(ARTIFACT), [x.info.run_name for x in nested]  # no run from the other trials either
    assert not list((one_world.path / "cwd").iterdir()), list((one_world.path / "cwd").iterdir())


@pytest.mark.soak  # the lean net's 12 min; make test keeps the one-group upload (above)
@pytest.mark.timeout(220)
def test_c53_c58_with_two_trial_groups_each_groups_rank_0_uploads(tmp_path: Path) -> None:
    """2 trial groups (group 1's rank 0 is global rank 1: its storage calls go to global rank 0's study service).
    The same launch carries C58: the app's module-level ``RANK`` is the launch's, 1, in trial group 1, while the
    task's ``RANK`` and ``current_trial().rank`` are 0: the process says so once, and where to read the trial's
    rank."""
    r = _run(tmp_path, "artifact", "x=interval(0,1)", "hydra.sweeper.n_trials=4", "hydra.sweeper.n_jobs=2",
             timeout_s=200)
    assert r.returncode == 0, r.output[-4000:]
    study = load(tmp_path, "user_calls_app")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4, r.output[-3000:]
    recs = _check_artifacts(tmp_path, study, range(4))
    assert {t.user_attrs["ds_optuna:trial_group"] for t in study.trials} == {0, 1}  # both groups ran trials
    assert all("error" not in rec for rec in recs)
    # C58: a rank read at import time in a trial group is named with where to read it
    assert {(rec["import_rank"], rec["env_rank"], rec["trial_rank"]) for rec in recs} <= {(0, 0, 0), (1, 0, 0)}
    warning = ("rank 1 of the launch, rank 0 of trial group 1/2: the script read torchrun's variables before "
               "the sweep")
    assert r.output.count(warning) == 1, r.output[-4000:]
    line = next(x for x in r.output.splitlines() if warning in x)
    assert "RANK=1 (the trial group's: 0)" in line and "current_trial().rank" in line, line
    assert "rank 0 of the launch" not in r.output  # group 0's rank 0 reads the same RANK


@pytest.mark.timeout(240)
def test_c57_the_tasks_own_start_run_is_refused_with_what_to_do(one_world: OneWorld) -> None:
    """``with mlflow.start_run(): mlflow.log_param(...)`` on every rank (mlflow#11782): on the trial's rank 0 the
    trial's run is active, MLflow refuses a second one, and the trial's error says why and what to write instead.
    On rank 1 the same ``start_run`` lands in the trial's run (its ``log_param`` is there, no other run appears):
    what ``start_run`` on rank 1 only does. Trials 4-5 of the one world."""
    runs, others = one_world.trial_runs(), one_world.other_runs()
    for number in START_RUN:
        t = one_world.study.trials[number]
        assert t.state.name == "FAIL"
        error = runs[number].data.tags["ds_optuna.error"]
        assert "is already active" in error and "the sweeper makes the trial's MLflow run the active run" in error
        assert "mlflow.start_run(nested=True)" in error and "no start_run" in error, error
        assert runs[number].data.params["lr"] == "0.001"  # rank 1's start_run: the trial's run
        assert not [x for x in others if x.data.tags.get("mlflow.parentRunId") == runs[number].info.run_id]
    assert "no start_run, or open a child run" in one_world.result.output


@pytest.mark.timeout(240)
def test_c57_the_tasks_mlflow_calls_land_in_the_trials_run_and_leave_no_file(one_world: OneWorld) -> None:
    """Fluent calls on every rank (and after ``mlflow.autolog()``): each lands in the trial's run, no other run
    appears, and no rank leaves MLflow's default store ``./mlflow.db`` behind. Trials 6-7 of the one world, right
    after the trials whose own ``start_run`` failed: no run of theirs is left active."""
    runs, others = one_world.trial_runs(), one_world.other_runs()
    for number in FLUENT:
        t, run = one_world.study.trials[number], runs[number]
        assert run.info.status == "FINISHED" and run.data.metrics["value"] == t.value
        # rank 0's at step 0, rank 1's at step 1
        assert mlflow_history(one_world.uri, run.info.run_id, "user_metric") == {0: t.params["x"], 1: t.params["x"]}
        assert run.data.metrics["autolog_metric"] == 1.0
        assert not [x for x in others if x.data.tags.get("mlflow.parentRunId") == run.info.run_id]
    assert not list((one_world.path / "cwd").iterdir()), list((one_world.path / "cwd").iterdir())


def test_c58_stale_globals_names_the_launchs_values_only() -> None:
    from hydra_plugins.ds_optuna_sweeper._loop._trial_groups import stale_globals

    launch = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3"}
    group = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    namespace = {"RANK": 3, "world_size": "4", "local_rank": 1, "GLOBAL_RANK": 3, "rank_ok": 3, "LOCAL_WORLD_SIZE": 2,
                 "IS_RANK": True, "os": object()}
    assert stale_globals(namespace, launch, group) == {"RANK": (3, 1), "world_size": (4, 2), "GLOBAL_RANK": (3, 1)}
    assert stale_globals({"RANK": 0}, {"RANK": "0"}, {"RANK": "0"}) == {}  # group 0's first rank: nothing stale
