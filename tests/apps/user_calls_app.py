"""Test app: a task that calls Optuna's artifact API and MLflow itself, as users write it (cases C53, C57, C58).

``DSO_USER_CALLS`` is a comma-separated list of what the task does on each trial, or several such lists
separated by ``|``: trial N does the N-th (the last one for every later trial), so that one launch carries the
calls of several cases (issue 39). The calls:

- ``artifact``: on the trial's rank 0, write ``model.txt`` in the job dir and upload it with the FAQ's
  ``optuna.artifacts.upload_artifact(..., study_or_trial=trial.optuna_trial())`` into
  ``FileSystemArtifactStore(<sweep dir>/artifacts)``; on any other rank, call ``trial.optuna_trial()`` and
  record the error;
- ``mlflow_with``: ``with mlflow.start_run(): mlflow.log_param("lr", ...)`` on every rank (the reports' code);
- ``mlflow_nested``: ``with mlflow.start_run(nested=True): mlflow.log_param(...)`` on every rank;
- ``mlflow_fluent``: ``mlflow.log_metric("user_metric", ...)`` on every rank, no ``start_run``;
- ``mlflow_rank1``: ``with mlflow.start_run(): mlflow.log_param("rank1_param", ...)`` on rank 1 only;
- ``mlflow_autolog``: ``mlflow.autolog()`` then a fluent ``mlflow.log_metric`` on rank 0.

Each rank writes ``$DSO_RECORD_DIR/trial<N>_rank<R>.json``: the ``RANK`` this module read at import, the
``RANK`` and ``current_trial().rank`` inside the task, and what the calls above gave.
"""

import json
import os
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from exit_record import run_recorded  # tests/apps/exit_record.py (the script's folder is on sys.path)
from hydra_plugins.ds_optuna_sweeper import current_trial

RANK = int(os.environ.get("RANK", "0"))  # read at import time, as "rank 0 only" code often does (C58)
PER_TRIAL = [[c for c in calls.split(",") if c] for calls in os.environ.get("DSO_USER_CALLS", "").split("|")]


@hydra.main(config_path="conf", config_name="app", version_base="1.3")
def main(cfg: DictConfig) -> float:
    trial = current_trial()
    CALLS = PER_TRIAL[min(trial.number, len(PER_TRIAL) - 1)]
    hc = HydraConfig.get()
    job_dir = Path(hc.runtime.output_dir)
    record = {"import_rank": RANK, "env_rank": int(os.environ["RANK"]), "trial_rank": trial.rank,
              "number": trial.number, "cwd": os.getcwd()}
    if "artifact" in CALLS:
        if trial.rank == 0:
            import optuna
            from optuna.artifacts import FileSystemArtifactStore, upload_artifact

            store_dir = Path(hc.sweep.dir) / "artifacts"
            store_dir.mkdir(parents=True, exist_ok=True)
            model = job_dir / "model.txt"
            model.write_text(f"model of trial {trial.number}")
            record["artifact_id"] = upload_artifact(artifact_store=FileSystemArtifactStore(str(store_dir)),
                                                    file_path=str(model), study_or_trial=trial.optuna_trial())
            record["listed"] = [m.artifact_id for m in optuna.artifacts.get_all_artifact_meta(trial.optuna_trial())]
        else:
            try:
                trial.optuna_trial()
            except Exception as e:  # noqa: BLE001 - recorded for the test
                record["error"] = f"{type(e).__name__}: {e}"
    if any(c.startswith("mlflow") for c in CALLS):
        import mlflow

        if "mlflow_autolog" in CALLS:
            mlflow.autolog()
        if "mlflow_with" in CALLS:
            with mlflow.start_run():
                mlflow.log_param("lr", cfg.lr)
        if "mlflow_nested" in CALLS:
            with mlflow.start_run(nested=True):
                mlflow.log_param(f"nested_rank{trial.rank}", cfg.lr)
        if "mlflow_fluent" in CALLS:
            mlflow.log_metric("user_metric", float(cfg.x), step=trial.rank)
        if "mlflow_rank1" in CALLS and trial.rank == 1:
            with mlflow.start_run():
                mlflow.log_param("rank1_param", "yes")
        if "mlflow_autolog" in CALLS and trial.rank == 0:
            mlflow.log_metric("autolog_metric", 1.0)
    out = Path(os.environ["DSO_RECORD_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"trial{trial.number}_rank{int(os.environ['RANK'])}_g{os.environ.get('DS_OPTUNA_TRIAL_GROUP', '0/1')[0]}.json"
     ).write_text(json.dumps(record))
    return float(cfg.x) ** 2


if __name__ == "__main__":
    run_recorded(main)
