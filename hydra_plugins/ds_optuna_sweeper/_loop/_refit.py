"""Rank 0 only: which trials to refit after the search, and what each refit run gave.

Refit is the field's term (scikit-learn's ``refit``): once the search is over, the chosen configs run
once more with ``hydra.sweeper.refit.overrides`` (e.g. ``[data.stage=final]``: train on everything,
score on held-out test data). The loop in ``_sweep.py`` runs them like trials, on every rank; this
module only plans and records.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from .._errors import RemoteError
from .._study._command import rerun_dir, rerun_line, resume_command, split_params, trial_overrides
from .._study._override_text import read_override_value
from .._study._queue import warm_start_runs
from .._study._stored import CHECKPOINT_DIR_ATTR
from .._task import _checkpoints
from .._task._replayed import REPLAY_ENV
from .._tracking._record import TrialRecord, TrialStart
from ._agree import Verdict
from ._driver import Driver
from ._messages import Command, CommandKind
from ._payload import TrialPayload

log = logging.getLogger(__name__)


class RefitRuns:
    """The refit of one sweep, on rank 0; records go to ``driver.refits`` (``refit:`` in the results).

    Args:
        driver: the sweep's driver (study, space, settings, sweep dir).
    """

    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    def _checkpoint(self, number: int) -> dict[str, Any]:
        """With ``refit.from_checkpoint``: the refit run's own checkpoint dir (``<sweep dir>/refit/<n>/checkpoints``)
        and the trial's newest checkpoint to start from (logged when there is none: it trains from scratch)."""
        d = self.driver
        if not d.settings.refit_from_checkpoint:
            return {}
        directory = d.study.trials[number].user_attrs.get(CHECKPOINT_DIR_ATTR)
        latest = _checkpoints.latest_checkpoint(directory) if directory else None
        if latest is None:
            log.warning("refit.from_checkpoint: trial %d has no checkpoint left (%s); its refit trains from scratch",
                        number, directory or "no checkpoint dir recorded")
        else:
            log.info("refit.from_checkpoint: the refit of trial %d starts from %s", number, latest)
        return {"checkpoint_dir": str(Path(d.sweep_dir) / "refit" / str(number) / "checkpoints"), "resume_from": latest}

    def command(self) -> Command:
        """One payload per chosen trial, or STOP (nothing to refit, or an error to raise on every rank).

        Each payload carries the trial's overrides, then ``refit.overrides``, with the job dir
        ``<sweep dir>/refit/<trial>``; its ``params`` are the params the task suggested itself (the
        task's ``current_trial()`` replays them). The ``refit.baselines`` configs follow, after the
        trials (:meth:`_baseline_payloads`). Never raises.
        """
        d = self.driver
        try:
            numbers = self._numbers()
        except Exception as e:
            log.exception("Rank 0 could not prepare the refit")
            return Command(CommandKind.STOP, error=RemoteError("SweepStoppedError", f"refit: {type(e).__name__}: {e}", 0))
        payloads = []
        for number in numbers:
            trial_lines, task_params = trial_overrides(d.study.trials[number], d.space)
            overrides = [*trial_lines, *d.settings.refit_overrides]
            start = TrialStart(number, number, split_params(d.study.trials[number], d.space)[0],
                               tuple(d.space.fixed), refit=True)
            payloads.append(TrialPayload(number, task_params, [*overrides, f"hydra.sweep.subdir=refit/{number}"],
                                         **self._checkpoint(number), tracking_env=d.tracking.trial_env(start)))
        payloads += self._baseline_payloads()
        if not payloads:
            return Command(CommandKind.STOP, reason="nothing to refit")
        log.info("Refit of %s with %s", ", ".join(p.what for p in payloads), list(d.settings.refit_overrides))
        return Command(CommandKind.RUN, tuple(payloads))

    def _baseline_payloads(self) -> list[TrialPayload]:
        """One payload per ``refit.baselines`` config, numbered -1, -2, ... (no trial of the study): the run's
        fixed overrides, the baseline's, then ``refit.overrides``, in ``<sweep dir>/refit/<name>``. Its
        ``params`` are the values of the baseline's ``+`` keys (names the config lacks), ``+`` dropped: they
        answer the task's own ``suggest_*`` calls, as a trial's suggested params do in its refit (a
        baseline of a task that suggests ``width`` itself says ``+width: 19``)."""
        d = self.driver
        payloads = []
        for i, (name, lines) in enumerate(d.settings.refit_baselines):
            number = -(i + 1)
            params = {k: read_override_value(v) for k, v in (line.split("=", 1) for line in lines)}
            start = TrialStart(number, number, params, tuple(d.space.fixed), refit=True, baseline=name)
            overrides = [*d.space.fixed, *lines, *d.settings.refit_overrides, f"hydra.sweep.subdir=refit/{name}"]
            suggested = {k.lstrip("+"): v for k, v in params.items() if k.startswith("+")}
            payloads.append(TrialPayload(number, suggested, overrides, tracking_env=d.tracking.trial_env(start),
                                         baseline=name))
        return payloads

    def _numbers(self) -> list[int]:
        """The trial numbers ``refit.trials`` names, in order, each once.

        ``enqueued`` names each warm start's last COMPLETE run (:func:`.._study._queue.warm_start_runs`).

        Raises:
            ValueError: ``best`` without a COMPLETE trial, or a number the study does not have.
        """
        study = self.driver.study
        trials = study.get_trials(deepcopy=False)
        numbers: list[int] = []
        for entry in self.driver.settings.refit_trials:
            if entry == "best":
                if not any(t.state == TrialState.COMPLETE for t in trials):
                    raise ValueError("no COMPLETE trial: there is no best trial to refit")
                found = [study.best_trial.number]
            elif entry == "enqueued":
                found = warm_start_runs(trials)
                if not found:
                    log.warning("hydra.sweeper.refit.trials names 'enqueued', but the study has no COMPLETE trial "
                                "from hydra.sweeper.enqueue_trials: nothing to refit for it")
            else:
                if int(entry) >= len(trials):
                    raise ValueError(f"hydra.sweeper.refit.trials names trial {entry}, but the study has {len(trials)} trials")
                found = [int(entry)]
            numbers += [n for n in found if n not in numbers]
        return numbers

    def record(self, payload: TrialPayload, verdict: Verdict) -> None:
        """Keep one refit run's outcome (trial, state, overrides, metrics, rerun line, job dir) and log it."""
        d = self.driver
        overrides = [o for o in payload.overrides if not o.startswith("hydra.sweep.subdir=")]
        env = {REPLAY_ENV: json.dumps({"number": payload.number, "params": payload.params})} if payload.params else None
        key = payload.baseline or payload.number
        entry: dict[str, Any] = {
            "trial": None if payload.baseline else payload.number,
            **({"baseline": payload.baseline} if payload.baseline else {}),
            "state": verdict.state.name,
            "overrides": overrides,
            "metrics": dict(verdict.metrics or {}),
            "rerun_command": rerun_line(overrides, d.hydra_overrides, env,
                                        run_dir=rerun_dir(d.sweep_dir, key, refit=True)),
            "job_dir": str(Path(d.sweep_dir) / "refit" / str(key)),
        }
        if verdict.error:
            entry["error"] = verdict.error
        d.refits.append(entry)
        d.tracking.trial_ended(payload.number, lambda start: TrialRecord(
            start, verdict.state.name, error=verdict.error, rerun=entry["rerun_command"], metrics=entry["metrics"]),
            refit=True)
        log.info("Refit of %s %s: metrics %s\n  rerun: %s", payload.what, verdict.state.name,
                 entry["metrics"], entry["rerun_command"])


class RefitQueue:
    """The refit runs of one sweep handed out one at a time, to one group or to several trial groups.

    Built once the search is over (every trial group left its search loop). Each :meth:`next` gives one
    run, or the final STOP once every run handed out was recorded: its error (``TrialFailedError`` naming
    each failed run and the resume command) is raised by every group when any run failed.

    Args:
        runs: the sweep's :class:`RefitRuns` (rank 0).
    """

    def __init__(self, runs: RefitRuns) -> None:
        self.runs = runs
        self._first = runs.command()
        self._left = list(self._first.payloads) if self._first.kind == CommandKind.RUN else []
        self._out = 0  # runs handed out and not yet recorded
        self._failed: list[str] = []

    def next(self) -> Command | None:
        """The next run (``Command(RUN, (payload,))``), the final STOP, or ``None`` while runs handed to
        other groups are still running (the caller asks again after :meth:`record`)."""
        if self._first.kind == CommandKind.STOP:
            return self._first
        if self._left:
            self._out += 1
            return Command(CommandKind.RUN, (self._left.pop(0),))
        if self._out:
            return None
        if not self._failed:
            return Command(CommandKind.STOP, reason="refit done")
        return Command(CommandKind.STOP, error=RemoteError("TrialFailedError", (
            f"refit failed ({'; '.join(self._failed)}); the search's results are kept. Run the refit again on the "
            f"study without new trials: {resume_command(self.runs.driver.sweep_dir)}"), 0))

    def record(self, payload: TrialPayload, verdict: Verdict) -> None:
        """Keep one run's outcome (:meth:`RefitRuns.record`); a run that did not complete fails the refit."""
        self._out = max(self._out - 1, 0)
        self.runs.record(payload, verdict)
        if verdict.state != TrialState.COMPLETE:
            self._failed.append(f"{payload.what}: {verdict.error or verdict.state.name}")
