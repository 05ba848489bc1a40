"""Every rank: point the loggers of a tracked Lightning ``Trainer`` at the trial's tracker runs.

Lightning's loggers do not read the trial's environment the way transformers' callbacks do: ``MLFlowLogger``
takes its tracking URI from ``MLFLOW_TRACKING_URI`` when Lightning is imported (a default argument) and
creates a run of its own, and ``TensorBoardLogger`` writes under the ``save_dir`` it was given. So
``lightning_trial_scope().track(trainer)`` moves a logger that has not written yet into the trial's run:
``MLFlowLogger`` -> the trial's MLflow run (``MLFLOW_RUN_ID``), ``TensorBoardLogger`` -> the trial's event dir.
``WandbLogger`` built inside the task needs nothing: ``wandb.init`` reads ``WANDB_RUN_ID``, ``WANDB_PROJECT``,
``WANDB_NAME`` and ``WANDB_RUN_GROUP``. Outside a tracked trial nothing changes. Attribute names checked with
lightning 2.6 (``lightning.pytorch.loggers``); a logger without them is left as it is, with a warning.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ._task_env import mlflow_run_id

log = logging.getLogger(__name__)


def retarget_loggers(trainer: Any) -> list[str]:
    """Move ``trainer.loggers`` that have not written yet into the trial's runs; the names of those moved."""
    moved = []
    for logger in list(getattr(trainer, "loggers", None) or []):
        kind = type(logger).__name__
        try:
            run_id = mlflow_run_id() if kind == "MLFlowLogger" else None
            if run_id:
                moved += _mlflow(logger, run_id)
            elif kind == "TensorBoardLogger" and os.environ.get("TENSORBOARD_LOGGING_DIR"):
                moved += _tensorboard(logger)
        except AttributeError as e:  # another Lightning version: leave the logger as it is
            log.warning("lightning_trial_scope: %s left writing where it was configured (%s)", kind, e)
    return moved


def _mlflow(logger: Any, run_id: str) -> list[str]:
    if logger._initialized:  # it has a run already
        return []
    from mlflow import MlflowClient

    logger._tracking_uri = os.environ["MLFLOW_TRACKING_URI"]
    logger._mlflow_client = MlflowClient(tracking_uri=logger._tracking_uri)
    logger._experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", logger._experiment_name)
    logger._run_id = run_id
    return ["MLFlowLogger"]


def _tensorboard(logger: Any) -> list[str]:
    if logger._experiment is not None:  # it has a writer already
        return []
    logger._root_dir = os.environ["TENSORBOARD_LOGGING_DIR"]
    logger._name = ""
    logger._version = ""
    return ["TensorBoardLogger"]
