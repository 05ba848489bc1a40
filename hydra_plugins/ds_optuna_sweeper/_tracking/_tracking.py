"""The sweep's trackers on the rank that owns the study: open them, start and end each trial's run, close.

Every call to a tracker is guarded: a tracker that is down or refuses a write is logged once (a warning naming
the tracker and the error) and dropped for the rest of this run, so tracking never fails a trial or the sweep
and never touches the study (issue 25). The driver calls this under the study's lock (one call at a time).

MLflow is :mod:`._mlflow`; the two smaller trackers are here. TensorBoard (:class:`TensorboardTracker`): one event
dir per trial, ``<log_dir>/trial_<number>``, with the trial's intermediate values, its final value and its params
(TensorBoard's HPARAMS tab), written with ``torch.utils.tensorboard``; the task's own TensorBoard logging writes into
the same dir (:mod:`._task_env`), and TensorBoard shows every event file of a dir as one run. Weights & Biases
(:class:`WandbTracker`): one run per trial, grouped by the study (W&B's ``group``), written when the trial ends. A
trial's run id is fixed by the study (a hash of the storage and the study name) and the trial number, so a resumed
study, or a retry that resumes from a checkpoint, writes into the same run (``resume="allow"``), and the task's own
W&B logging joins it through W&B's environment variables (W&B docs, "Environment variables"; :mod:`._task_env`).
This avoids W&B's own sweeps, which break under DDP (wandb/wandb#3883, #7811, #5695).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from pathlib import Path
from typing import Any, Callable, Optional

from ._record import StudyBest, TrialRecord, TrialStart, redact, redacted_params, start_tags
from .._settings import TrackingSettings
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
        return TensorboardTracker(settings.tensorboard_dir(sweep_dir), study_name)
    cfg = settings.wandb
    return WandbTracker(cfg.get("project") or study_name, cfg.get("entity"), cfg.get("mode"),
                        settings.wandb_dir(sweep_dir), study_name, study_key, list(cfg.get("tags") or []))


class Tracking:
    """The trackers of one sweep (possibly none), used by the driver on the rank that owns the study.

    Args:
        trackers: the opened trackers (:mod:`._mlflow`, :class:`TensorboardTracker`, :class:`WandbTracker`).
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


#: The environment variable transformers' ``TensorBoardCallback`` takes its log dir from (transformers 5).
LOG_DIR_ENV = "TENSORBOARD_LOGGING_DIR"


class TensorboardTracker:
    """Event dirs below ``root``, one per trial (a retry that resumes writes into its first attempt's dir).

    Args:
        root: the parent dir (created).
        study_name: the study's name (a text summary of each run).
    """

    name = "tensorboard"

    def __init__(self, root: str, study_name: str) -> None:
        import torch.utils.tensorboard  # noqa: F401 - fails here, once, when tensorboard is missing

        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.study_name = study_name

    def run_dir(self, start: TrialStart) -> Path:
        """``<root>/trial_<run_key>``, or ``<root>/refit_<number>`` for a refit run."""
        return self.root / (f"refit_{start.refit_key}" if start.refit else f"trial_{start.run_key}")

    def trial_started(self, start: TrialStart) -> dict[str, str]:
        """Create the trial's event dir; the task's environment names it."""
        path = self.run_dir(start)
        path.mkdir(parents=True, exist_ok=True)
        return {LOG_DIR_ENV: str(path)}

    def trial_ended(self, record: TrialRecord, env: dict[str, str]) -> None:
        """Write the record's scalars, its params with the final metrics (HPARAMS), and its tags as text."""
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        writer = SummaryWriter(log_dir=env[LOG_DIR_ENV])
        try:
            for step, value in sorted(record.intermediate.items()):
                writer.add_scalar("intermediate_value", value, step)
            last = max(record.intermediate, default=0)
            final = record.final_metrics()
            for key, value in final.items():
                writer.add_scalar(key, value, last)
            if not record.start.refit:
                params = {k: v if isinstance(v, (int, float, str, bool)) else str(v)  # what the HPARAMS plugin takes
                          for k, v in redacted_params(record.start.params).items()}
                for summary in hparams(params, final or {"duration_s": 0.0}):
                    writer.file_writer.add_summary(summary)
            tags = {"ds_optuna.study": self.study_name, **record.tags()}
            writer.add_text("ds_optuna", "\n\n".join(f"**{k}**: {redact(v)}" for k, v in tags.items()), last)
        finally:
            writer.close()

    def where(self) -> str:
        """How to look: the ``tensorboard`` command."""
        return f"TensorBoard: tensorboard --logdir {self.root}"


#: W&B's "no system metadata" setting (``x_disable_meta``) as an environment variable: the metadata holds the
#: process's command line, where a storage URL with its password may stand (issue 25: no secret reaches a tracker).
_NO_METADATA_ENV = "WANDB__DISABLE_META"


class WandbTracker:
    """The study's runs in one W&B project.

    Args:
        project: the W&B project.
        entity: the team or user, or ``None`` (W&B's default).
        mode: ``online``, ``offline``, ``disabled`` or ``None`` (W&B's default).
        directory: where W&B writes its ``wandb/`` folder.
        study_name: the study's name (every run's group).
        study_key: text that tells this study from another of the same name (the storage's label).
        tags: tags of every run.
    """

    name = "wandb"

    def __init__(self, project: str, entity: str | None, mode: str | None, directory: str, study_name: str,
                 study_key: str, tags: list[str]) -> None:
        import wandb  # noqa: F401 - fails here, once, when wandb is missing

        self.project, self.entity, self.mode, self.dir = project, entity, mode, directory
        self.study_name = study_name
        self.tags = [str(t) for t in tags]
        slug = re.sub(r"[^A-Za-z0-9_-]+", "-", study_name).strip("-")[:40] or "study"
        self.prefix = f"{slug}-{hashlib.sha1(f'{study_key}|{study_name}'.encode()).hexdigest()[:8]}"

    def run_id(self, start: TrialStart) -> str:
        """``<study>-<hash>-t<run_key>``; a refit run: ``...-refit<number>-<unix time>`` (a new run each refit)."""
        if start.refit:
            return f"{self.prefix}-refit{start.refit_key}-{int(time.time())}"
        return f"{self.prefix}-t{start.run_key}"

    def trial_started(self, start: TrialStart) -> dict[str, str]:
        """The task's environment: W&B joins the trial's run (nothing is written before the trial ends)."""
        env = {"WANDB_RUN_ID": self.run_id(start), "WANDB_RESUME": "allow", "WANDB_PROJECT": self.project,
               "WANDB_RUN_GROUP": self.study_name, "WANDB_NAME": start.name, "WANDB_DIR": self.dir,
               "WANDB_JOB_TYPE": "refit" if start.refit else "trial", _NO_METADATA_ENV: "true"}
        if self.entity:
            env["WANDB_ENTITY"] = self.entity
        if self.mode:
            env["WANDB_MODE"] = self.mode
        return env

    def trial_ended(self, record: TrialRecord, env: dict[str, str]) -> None:
        """Write the record into the trial's run and finish it (exit code 1 for FAIL)."""
        import wandb

        start = record.start
        config: dict[str, Any] = {**redacted_params(start.params), "fixed_overrides": [redact(o) for o in start.fixed]}
        run = wandb.init(
            id=env["WANDB_RUN_ID"], project=self.project, entity=self.entity, group=self.study_name, name=start.name,
            job_type=env["WANDB_JOB_TYPE"], dir=self.dir, mode=self.mode, resume="allow", reinit="create_new",
            config=config, tags=self.tags, settings=wandb.Settings(silent=True, console="off", x_disable_meta=True),
        )
        try:
            run.define_metric("trial_step")
            run.define_metric("intermediate_value", step_metric="trial_step")
            for step, value in sorted(record.intermediate.items()):
                run.log({"trial_step": step, "intermediate_value": value})
            run.summary.update(record.final_metrics())
            run.summary.update({k.replace("ds_optuna.", "ds_optuna/"): v
                                for k, v in {**start_tags(start, self.study_name), **record.tags()}.items()})
        finally:
            run.finish(exit_code=1 if record.state == "FAIL" else 0)

    def close_study(self, status: str, best: Any = None) -> None:
        """At the sweep's end: wait until W&B has written every run (``wandb.teardown()``, W&B's documented
        "wait for W&B to finish"): ``run.finish()`` returns before W&B's service has written the run's file (an
        offline run's summary came about a second later), and a process that ends with ``os._exit``
        (``run_then_exit``) skips W&B's own teardown at exit. ``status`` and ``best`` are unused: W&B groups have
        no run."""
        import wandb

        wandb.teardown()

    def where(self) -> str:
        """Where the runs are: the project (online), or the offline run files and ``wandb sync``."""
        if self.mode == "offline":
            return f"W&B (offline): {self.dir}/wandb (upload with: wandb sync {self.dir}/wandb/offline-run-*)"
        return f"W&B: project '{self.project}', group '{redact(self.study_name)}'"
