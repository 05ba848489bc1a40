"""The sweep's trackers on the rank that owns the study: open them, start and end each trial's run, close.

Every call to a tracker is guarded: a tracker that is down or refuses a write is logged once (a warning naming
the tracker and the error) and dropped for the rest of this run, so tracking never fails a trial or the sweep
and never touches the study (issue 25). The driver calls this under the study's lock (one call at a time).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Optional

from ._record import StudyBest, TrialRecord, TrialStart, redact
from .._tracking_settings import TrackingSettings
from ._task_env import RUN_NAME_ENV

log = logging.getLogger(__name__)


def _open_one(name: str, settings: TrackingSettings, sweep_dir: str, study_name: str, study_key: str) -> Any:
    """The tracker ``name`` with its settings resolved (its package is imported here, rank 0 only)."""
    if name == "mlflow":
        from ._mlflow import MlflowTracker

        cfg = settings.mlflow
        embedded = not cfg.get("tracking_uri")  # the store in the sweep dir keeps its artifacts there too
        return MlflowTracker(settings.mlflow_uri(sweep_dir), cfg.get("experiment_name") or study_name, study_name,
                             dict(cfg.get("tags") or {}),
                             artifact_location=str(Path(sweep_dir).absolute() / "mlartifacts") if embedded else None)
    if name == "tensorboard":
        from ._tensorboard import TensorboardTracker

        return TensorboardTracker(settings.tensorboard_dir(sweep_dir), study_name)
    from ._wandb import WandbTracker

    cfg = settings.wandb
    return WandbTracker(cfg.get("project") or study_name, cfg.get("entity"), cfg.get("mode"),
                        settings.wandb_dir(sweep_dir), study_name, study_key, list(cfg.get("tags") or []))


class Tracking:
    """The trackers of one sweep (possibly none), used by the driver on the rank that owns the study.

    Args:
        trackers: the opened trackers (:mod:`._mlflow`, :mod:`._tensorboard`, :mod:`._wandb`).
    """

    def __init__(self, trackers: list[Any]) -> None:
        self._trackers = list(trackers)
        self._open: dict[tuple[bool, int], tuple[TrialStart, dict[str, dict[str, str]]]] = {}

    @classmethod
    def open(cls, settings: TrackingSettings, *, sweep_dir: str, study_name: str, study_key: str) -> "Tracking":
        """Open each tracker of ``settings.report_to`` (MLflow: find or create the study's parent run). A tracker
        that fails to open is logged and left out. Never raises."""
        trackers = []
        for name in settings.report_to:
            try:
                trackers.append(_open_one(name, settings, sweep_dir, study_name, study_key))
            except Exception as e:  # noqa: BLE001 - tracking never stops the sweep
                log.warning("Tracking: %s could not be opened (%s: %s); the sweep goes on without it",
                            name, type(e).__name__, redact(str(e).splitlines()[0] if str(e) else ""))
        if trackers:
            log.info("Tracking to %s", ", ".join(t.name for t in trackers))
        return cls(trackers)

    def __bool__(self) -> bool:
        return bool(self._trackers)

    def _guarded(self, tracker: Any, what: str, call: Callable[[], Any]) -> Any:
        """``call()``; on an exception: one warning, and ``tracker`` is dropped. Returns ``None`` then."""
        try:
            return call()
        except Exception as e:  # noqa: BLE001 - tracking never fails a trial or the sweep
            if tracker in self._trackers:
                self._trackers.remove(tracker)
            text = str(e).strip().splitlines()[0] if str(e).strip() else ""
            log.warning("Tracking: %s failed to %s (%s: %s); no more writes to %s in this run, the study is "
                        "unchanged", tracker.name, what, type(e).__name__, redact(text)[:300], tracker.name)
            return None

    def trial_started(self, start: TrialStart) -> dict[str, str]:
        """Start (or continue) the run of ``start`` in every tracker; the environment variables the task runs
        with, so that its own logging (transformers' ``report_to``, Lightning's loggers) joins that run."""
        envs: dict[str, dict[str, str]] = {}
        for tracker in list(self._trackers):
            env = self._guarded(tracker, f"start the run of {start.name}", lambda t=tracker: t.trial_started(start))
            if env is not None:
                envs[tracker.name] = env
        self._open[(start.refit, start.number)] = (start, envs)
        return {k: v for env in envs.values() for k, v in env.items()}

    def trial_env(self, start: TrialStart) -> dict[str, str]:
        """:meth:`trial_started`'s environment plus the run's name (``DS_OPTUNA_RUN_NAME``); empty without trackers."""
        return {**self.trial_started(start), RUN_NAME_ENV: start.name} if self._trackers else {}

    def trial_ended(self, number: int, make_record: Callable[[TrialStart], TrialRecord], *, refit: bool = False) -> None:
        """End the run of trial (or refit run) ``number`` in every tracker that started it; ``make_record``
        builds what they write (called once, and only when some tracker has the run)."""
        entry = self._open.pop((refit, number), None)
        if entry is None or not self._trackers:
            return
        start, envs = entry
        record = make_record(start)
        for tracker in list(self._trackers):
            if tracker.name in envs:
                self._guarded(tracker, f"write the end of {start.name}",
                              lambda t=tracker: t.trial_ended(record, envs[t.name]))

    def close(self, finished: dict[int, str], status: str, best: Optional[StudyBest] = None) -> None:
        """At the end of the run: end the runs of trials the study closed without a tell from this run
        (``finished``: ``{trial number: state}``), end the parent run with ``status`` and the study's ``best``
        (:meth:`StudyBest.of`; MLflow's parent run), and log where to look."""
        self._open.clear()
        for tracker in list(self._trackers):
            if hasattr(tracker, "close_stale"):
                self._guarded(tracker, "close the runs of closed trials", lambda t=tracker: t.close_stale(finished))
            if hasattr(tracker, "close_study"):
                self._guarded(tracker, "close the study's run", lambda t=tracker: t.close_study(status, best))
        for tracker in self._trackers:
            log.info("Tracking: %s", tracker.where())
