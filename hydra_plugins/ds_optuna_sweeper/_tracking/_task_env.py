"""Every rank: the tracking environment a trial's task runs in, so its own logging joins the trial's run.

The rank that owns the study starts each trial's runs and sends their environment variables in the trial's
payload (``TrialPayload.tracking_env``): ``MLFLOW_TRACKING_URI``/``MLFLOW_EXPERIMENT_NAME``/``MLFLOW_RUN_ID``
(MLflow's ``start_run`` and transformers' ``MLflowCallback`` read them), ``TENSORBOARD_LOGGING_DIR``
(transformers' ``TensorBoardCallback``), ``WANDB_RUN_ID``/``WANDB_RESUME``/``WANDB_PROJECT``/... (``wandb.init``),
and :data:`RUN_NAME_ENV`; :func:`retarget_loggers` moves a tracked Lightning ``Trainer``'s loggers there. Only the
standard library at module level.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Any, Iterator, Mapping

log = logging.getLogger(__name__)

#: The trial's run name (``trial-<number>``), for ``TrainingArguments.run_name`` (the HF glue).
RUN_NAME_ENV = "DS_OPTUNA_RUN_NAME"


@contextlib.contextmanager
def trial_tracking(env: Mapping[str, str]) -> Iterator[None]:
    """Run the task with ``env`` added to ``os.environ``; afterwards restore the environment and end the runs the
    task's libraries left open in this process (an MLflow active run or a W&B run of this trial), so that the next
    trial starts clean and the sweeper writes the trial's end into a closed run. No-op for an empty ``env``."""
    if not env:
        yield
        return
    before = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        if os.environ.get("RANK", "0") == "0":  # the trial's rank 0 (a trial group's own rank)
            for activate in (_activate_mlflow_run, _activate_wandb_run):
                try:
                    activate(env)
                except Exception as e:  # noqa: BLE001 - tracking never fails a trial
                    log.warning("Tracking: the trial's run could not be made active (%s: %s); the task runs without it",
                                type(e).__name__, str(e).splitlines()[0][:300] if str(e) else "")
        yield
    finally:
        _end_open_runs(env)  # before the restore: MLflow's end_run on a rank whose task resumed the run via
        # MLFLOW_RUN_ID reads MLFLOW_TRACKING_URI; without it, MLflow's default store, ./mlflow.db, appears (C57)
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _activate_mlflow_run(env: Mapping[str, str]) -> None:
    """On the trial's rank 0: make the trial's MLflow run the process's active run (as Ray Tune's
    ``setup_mlflow`` does), so whatever the task logs through MLflow's fluent API lands there, including what
    transformers' ``MLflowCallback`` logs after ``train()`` ended its own run (``start_run`` consumes
    ``MLFLOW_RUN_ID``, so MLflow would otherwise start a new run). A task's own ``mlflow.start_run()`` on rank 0
    then gets MLflow's "already active" error (:func:`mlflow_cause`)."""
    run_id = env.get("MLFLOW_RUN_ID")
    if not run_id:
        return
    import mlflow

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    active = mlflow.active_run()
    if active is None:
        mlflow.start_run(run_id=run_id)
    # As MLflow's own start_run does with the variable: transformers' MLflowCallback, seeing it, would start the
    # run again ("already active"); without it, the callback logs into the active run and leaves it open.
    os.environ.pop("MLFLOW_RUN_ID", None)


def _activate_wandb_run(env: Mapping[str, str]) -> None:
    """On the trial's rank 0: make the trial's W&B run the process's run (``wandb.run``), opened with explicit
    arguments: W&B reads its environment variables once per process, so a second trial's ``wandb.init()`` inside
    transformers' ``WandbCallback`` would open the first trial's run again. Console capture and system metadata are
    off: both may hold a storage URL with its password. A run the task already has is left alone."""
    run_id = env.get("WANDB_RUN_ID")
    if not run_id:
        return
    import wandb

    if wandb.run is not None:
        return
    wandb.init(id=run_id, project=env.get("WANDB_PROJECT"), entity=env.get("WANDB_ENTITY"),
               group=env.get("WANDB_RUN_GROUP"), name=env.get("WANDB_NAME"), job_type=env.get("WANDB_JOB_TYPE"),
               dir=env.get("WANDB_DIR"), mode=env.get("WANDB_MODE"), resume="allow",
               settings=wandb.Settings(silent=True, console="off", x_disable_meta=True))


#: MLflow's refusal to start a run while one is active (``mlflow.start_run``, mlflow/tracking/fluent.py;
#: checked with MLflow 3.17): "Run with UUID <id> is already active. To start a new run, ...".
_MLFLOW_ALREADY_ACTIVE = ("Run with UUID", "is already active")


def mlflow_cause(exc: BaseException) -> str:
    """The sweeper's word on a task that failed with MLflow's "Run with UUID ... is already active" (case C57,
    mlflow/mlflow#11782, huggingface/transformers#13362), to append to the trial's error; ``""`` for any other
    exception."""
    text = str(exc)
    if not all(part in text for part in _MLFLOW_ALREADY_ACTIVE):
        return ""
    return (" -- with hydra.sweeper.tracking on, the sweeper makes the trial's MLflow run the active run on the "
            "trial's rank 0, so the task's mlflow.start_run() cannot start another: log into the trial's run with "
            "mlflow.log_param/log_metric and no start_run, or open a child run with mlflow.start_run(nested=True)")


def mlflow_run_id() -> str | None:
    """The trial's MLflow run id in a tracked trial: ``MLFLOW_RUN_ID``, or on the trial's rank 0 (where
    :func:`trial_tracking` started the run and MLflow consumed the variable) the active run's; else ``None``."""
    if os.environ.get("MLFLOW_RUN_ID"):
        return os.environ["MLFLOW_RUN_ID"]
    mlflow = sys.modules.get("mlflow")
    active = mlflow.active_run() if mlflow is not None and os.environ.get("MLFLOW_TRACKING_URI") else None
    return active.info.run_id if active is not None else None


def _end_open_runs(env: Mapping[str, str]) -> None:
    """End this trial's MLflow active run and W&B run if the task left them open (never raises)."""
    mlflow = sys.modules.get("mlflow")
    run_id = env.get("MLFLOW_RUN_ID")
    if mlflow is not None and run_id:
        with contextlib.suppress(Exception):
            active = mlflow.active_run()
            if active is not None and active.info.run_id == run_id:
                mlflow.end_run()
    wandb = sys.modules.get("wandb")
    wandb_id = env.get("WANDB_RUN_ID")
    if wandb is not None and wandb_id:
        with contextlib.suppress(Exception):
            run = wandb.run
            if run is not None and run.id == wandb_id:
                run.finish()


def hf_tracking_args(training: Mapping[str, object], fields: "set[str]") -> dict[str, str]:
    """TrainingArguments the HF glue adds in a tracked trial, unless ``training`` sets them: ``run_name`` = the
    trial's run name (transformers names the MLflow and W&B runs after it), and ``logging_dir`` = the trial's
    TensorBoard dir where ``TrainingArguments`` still has that field (transformers 4; transformers 5 reads
    ``TENSORBOARD_LOGGING_DIR``). ``fields``: ``TrainingArguments``' init fields."""
    extra: dict[str, str] = {}
    name = os.environ.get(RUN_NAME_ENV)
    if name and training.get("run_name") is None:
        extra["run_name"] = name
    log_dir = os.environ.get("TENSORBOARD_LOGGING_DIR")
    if log_dir and "logging_dir" in fields and training.get("logging_dir") is None:
        extra["logging_dir"] = log_dir
    return extra


def retarget_loggers(trainer: Any) -> list[str]:
    """Move the loggers of a tracked Lightning ``trainer`` that have not written yet into the trial's runs; the
    names of those moved.

    Lightning's loggers do not read the trial's environment the way transformers' callbacks do: ``MLFlowLogger``
    takes its tracking URI from ``MLFLOW_TRACKING_URI`` when Lightning is imported (a default argument) and
    creates a run of its own, and ``TensorBoardLogger`` writes under the ``save_dir`` it was given. So
    ``MLFlowLogger`` is moved into the trial's MLflow run (:func:`mlflow_run_id`), ``TensorBoardLogger`` into the
    trial's event dir. ``WandbLogger`` needs nothing: ``wandb.init`` reads ``WANDB_RUN_ID``, ``WANDB_PROJECT``,
    ``WANDB_NAME`` and ``WANDB_RUN_GROUP``. Attribute names checked with lightning 2.6
    (``lightning.pytorch.loggers``); a logger without them is left as it is, with a warning.
    """
    moved = []
    for logger in list(getattr(trainer, "loggers", None) or []):
        kind = type(logger).__name__
        try:
            run_id = mlflow_run_id() if kind == "MLFlowLogger" else None
            if run_id:
                moved += _mlflow_logger(logger, run_id)
            elif kind == "TensorBoardLogger" and os.environ.get("TENSORBOARD_LOGGING_DIR"):
                moved += _tensorboard_logger(logger)
        except AttributeError as e:  # another Lightning version: leave the logger as it is
            log.warning("lightning_trial_scope: %s left writing where it was configured (%s)", kind, e)
    return moved


def _mlflow_logger(logger: Any, run_id: str) -> list[str]:
    if logger._initialized:  # it has a run already
        return []
    from mlflow import MlflowClient

    logger._tracking_uri = os.environ["MLFLOW_TRACKING_URI"]
    logger._mlflow_client = MlflowClient(tracking_uri=logger._tracking_uri)
    logger._experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", logger._experiment_name)
    logger._run_id = run_id
    return ["MLFlowLogger"]


def _tensorboard_logger(logger: Any) -> list[str]:
    if logger._experiment is not None:  # it has a writer already
        return []
    logger._root_dir = os.environ["TENSORBOARD_LOGGING_DIR"]
    logger._name = ""
    logger._version = ""
    return ["TensorBoardLogger"]
