"""MLflow: the study's parent run and one child run per trial, written with ``MlflowClient`` on the rank that
owns the study.

A run is found again by its tags, never remembered in memory: the parent by ``ds_optuna.study`` +
``ds_optuna.kind=study`` in the experiment, a trial's run by ``ds_optuna.trial`` under the parent. So a resumed
study continues under the same parent, and a retry that resumes from a checkpoint continues its first attempt's
run. The task's own MLflow logging joins the trial's run through ``MLFLOW_RUN_ID`` (:mod:`._task_env`).
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from ._record import StudyBest, TrialRecord, TrialStart, redact, start_tags

#: MLflow run statuses for the trial states (MLflow's ``RunStatus``): a pruned trial ended as planned.
_STATUS = {"COMPLETE": "FINISHED", "PRUNED": "FINISHED", "FAIL": "FAILED", "INTERRUPTED": "KILLED"}

#: MLflow's HTTP retry settings for the sweeper's own calls, unless the environment sets them: MLflow's defaults
#: (7 retries, backoff factor 2, 120 s per request) keep a call to a server that is down going for minutes,
#: while the other ranks wait for rank 0 (``hydra.sweeper.rank_timeout``).
_HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}

_MAX_PARAM = 6000  # MLflow's limit on a param value (characters, MLflow >= 2.x)
#: The tags an attempt's end writes that a retry's own end may not write again (:meth:`TrialRecord.tags`).
_END_TAGS = ("ds_optuna.error", "ds_optuna.pruned_at_step")


class MlflowTracker:
    """One study's runs in one MLflow experiment.

    Args:
        tracking_uri: the tracking URI (a server or a store; ``sqlite:///...`` by default).
        experiment_name: the experiment, created when missing.
        study_name: the Optuna study's name (the parent run's name and every run's ``ds_optuna.study`` tag).
        tags: extra tags of every run.
        artifact_location: where a new experiment keeps its artifacts (``None``: MLflow's default, which for a
            SQL store is ``./mlruns`` below the working directory).

    Raises:
        Exception: whatever MLflow raises when the server or store cannot be reached (the caller,
            :class:`._tracking.Tracking`, logs it once and goes on without MLflow).
    """

    name = "mlflow"

    def __init__(self, tracking_uri: str, experiment_name: str, study_name: str, tags: dict[str, str],
                 artifact_location: str | None = None) -> None:
        self.uri = tracking_uri
        self.study_name = study_name
        self.tags = {str(k): str(v) for k, v in tags.items()}
        with _limits():
            from mlflow import MlflowClient

            self.client = MlflowClient(tracking_uri=tracking_uri)
            found = self.client.get_experiment_by_name(experiment_name)
            self.experiment_id = found.experiment_id if found else self.client.create_experiment(
                experiment_name, artifact_location=artifact_location)
            self.experiment_name = experiment_name
            self.parent_id = self._parent()

    def _parent(self) -> str:
        """The study's parent run: found by its tags (a resumed study), else created; set RUNNING."""
        runs = self.client.search_runs(
            [self.experiment_id], max_results=1,
            filter_string=f"tags.`ds_optuna.kind` = 'study' and tags.`ds_optuna.study` = '{_quoted(self.study_name)}'")
        if runs:
            run_id = runs[0].info.run_id
            self.client.update_run(run_id, status="RUNNING")
            return run_id
        tags = {**self.tags, "ds_optuna.kind": "study", "ds_optuna.study": self.study_name}
        return self.client.create_run(self.experiment_id, run_name=self.study_name, tags=tags).info.run_id

    def _trial_run(self, start: TrialStart) -> str | None:
        """The run of ``start.run_key`` under the parent (refit runs are never looked up), or ``None``."""
        if start.refit:
            return None
        runs = self.client.search_runs(  # (a tag filter with != leaves out runs without the tag: refits are skipped here)
            [self.experiment_id], max_results=100,
            filter_string=f"tags.`mlflow.parentRunId` = '{self.parent_id}' and tags.`ds_optuna.trial` = '{start.run_key}'")
        found = [r.info.run_id for r in runs if r.data.tags.get("ds_optuna.refit") != "true"]
        return found[0] if found else None

    def trial_started(self, start: TrialStart) -> dict[str, str]:
        """Create (or continue) the trial's child run with its params and tags; the task's environment."""
        with _limits():
            run_id = self._trial_run(start)
            tags = {**self.tags, **start_tags(start, self.study_name), "mlflow.parentRunId": self.parent_id}
            if run_id is None:
                run_id = self.client.create_run(self.experiment_id, run_name=start.name, tags=tags).info.run_id
                params = mlflow_params(start)
                if params:
                    from mlflow.entities import Param

                    self.client.log_batch(run_id, params=[Param(k, v[:_MAX_PARAM]) for k, v in params.items()])
            else:  # a retry continues its first attempt's run, renamed after this attempt; the interrupted
                # attempt's end (its error, its pruned step) is no longer the run's: this attempt writes its own
                self.client.update_run(run_id, status="RUNNING", name=start.display_name)
                stale = self.client.get_run(run_id).data.tags
                for key in _END_TAGS:
                    if key in stale:
                        self.client.delete_tag(run_id, key)
                for key, value in tags.items():
                    self.client.set_tag(run_id, key, value)
        return {"MLFLOW_TRACKING_URI": self.uri, "MLFLOW_EXPERIMENT_NAME": self.experiment_name, "MLFLOW_RUN_ID": run_id}

    def trial_ended(self, record: TrialRecord, env: dict[str, str]) -> None:
        """Log the record into the run named by ``env["MLFLOW_RUN_ID"]`` and end it with the trial's status."""
        from mlflow.entities import Metric, RunTag

        run_id = env["MLFLOW_RUN_ID"]
        now = _now_ms()
        metrics = [Metric("intermediate_value", float(v), now, int(s)) for s, v in sorted(record.intermediate.items())]
        last = max(record.intermediate, default=0)
        metrics += [Metric(k, v, now, last) for k, v in record.final_metrics().items()]
        with _limits():
            for i in range(0, len(metrics), 1000):  # MLflow's log_batch takes at most 1000 metrics
                self.client.log_batch(run_id, metrics=metrics[i:i + 1000])
            self.client.log_batch(run_id, tags=[RunTag(k, v) for k, v in record.tags().items()])
            if record.start.display_name != record.start.name:  # a retry: named after it again at its end, in case
                # the task's own MLflow calls renamed the run (a start_run(run_id=..., run_name=...) of its own)
                self.client.update_run(run_id, name=record.start.display_name)
            self.client.set_terminated(run_id, status=_STATUS.get(record.state, "FAILED"))

    def close_stale(self, states: dict[int, str]) -> int:
        """End the trial runs still RUNNING whose trial the study closed without a tell from this run (a crash,
        a stale heartbeat): ``states`` is ``{trial number: state name}`` of the study's finished trials. Returns
        how many were ended."""
        closed = 0
        with _limits():
            runs = self.client.search_runs(
                [self.experiment_id], max_results=10000,
                filter_string=f"tags.`mlflow.parentRunId` = '{self.parent_id}' and attributes.status = 'RUNNING'")
            for run in runs:
                key = run.data.tags.get("ds_optuna.trial", "")
                state = states.get(int(key)) if key.isdigit() and run.data.tags.get("ds_optuna.refit") != "true" else None
                if state is not None:
                    self.client.set_tag(run.info.run_id, "ds_optuna.state", state)
                    self.client.set_terminated(run.info.run_id, status=_STATUS.get(state, "FAILED"))
                    closed += 1
        return closed

    def close_study(self, status: str, best: StudyBest | None = None) -> None:
        """End the parent run (``FINISHED``, ``FAILED`` or ``KILLED``), with the study's best trial on it (issue 38,
        C59): metrics ``best_value`` (one objective; ``best_values_<i>`` otherwise, for the first of the best
        trials), tags ``ds_optuna.best_trial`` (the best trials' numbers) and ``ds_optuna.best.<param>`` (tags, not
        params: a resumed study's new best would change a param, which MLflow refuses)."""
        from mlflow.entities import Metric, RunTag

        with _limits():
            if best is not None:
                step = best.numbers[0]
                names = ["best_value"] if len(best.values) == 1 else [f"best_values_{i}" for i in range(len(best.values))]
                metrics = [Metric(k, float(v), _now_ms(), step) for k, v in zip(names, best.values)]
                tags = [RunTag("ds_optuna.best_trial", ",".join(str(n) for n in best.numbers))]
                tags += [RunTag(f"ds_optuna.best.{k}", redact(str(v))[:_MAX_PARAM]) for k, v in best.params.items()]
                self.client.log_batch(self.parent_id, metrics=metrics, tags=tags)
            self.client.set_terminated(self.parent_id, status=status)

    def where(self) -> str:
        """How to look: the ``mlflow ui`` command for a local store, else the server's URI."""
        if self.uri.startswith(("http://", "https://", "databricks")):
            return f"MLflow: experiment '{self.experiment_name}' at {redact(self.uri)}"
        return f"MLflow: mlflow ui --backend-store-uri {redact(self.uri)}  (experiment '{self.experiment_name}')"


@contextlib.contextmanager
def _limits() -> Iterator[None]:
    """:data:`_HTTP_LIMITS` in ``os.environ`` for the duration (those the user set are kept)."""
    added = {k: v for k, v in _HTTP_LIMITS.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def _quoted(text: str) -> str:
    return text.replace("'", "\\'")


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


def mlflow_params(start: TrialStart) -> dict[str, str]:
    """The params a trial's run gets, as redacted text: the fixed override lines (``+key=value`` -> ``key``; a
    deletion is left out), then the sampled params."""
    params: dict[str, str] = {}
    for line in start.fixed:
        key, sep, value = line.partition("=")
        if sep and not key.startswith("~"):
            params[key.lstrip("+")] = value
    params.update({k: str(v) for k, v in start.params.items()})
    return {k: redact(v) for k, v in params.items()}
