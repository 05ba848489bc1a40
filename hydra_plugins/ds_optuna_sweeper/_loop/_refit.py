"""Rank 0 only: which trials to refit after the search (scikit-learn's ``refit``: the chosen configs run once
more with ``hydra.sweeper.refit.overrides``), and what each refit run gave; the loop in ``_sweep.py`` runs them.

Under ``hydra/sweeper/scheduler=pbt`` with ``refit.schedule`` (the default) a trial's refit replays its schedule
(:func:`.._study._pbt.schedule`), as Ray Tune's ``PopulationBasedTrainingReplay`` does: one run in parts, in
``<sweep dir>/refit/<trial>``; part ``k`` runs segment ``k``'s params and pauses at its ``to_step``, and part
``k + 1`` resumes from that checkpoint. ``refit.from_checkpoint`` wins over it (the trial's checkpoint already
holds what the schedule trained).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from .._errors import RemoteError
from .._study._command import rerun_dir, rerun_line, resume_command, split_params, trial_overrides
from .._study._override_text import read_override_value
from .._study._pbt import schedule
from .._study._queue import warm_start_runs
from .._study._stored import CHECKPOINT_DIR_ATTR
from .._task import _checkpoints
from .._task._replayed import REPLAY_ENV
from .._tracking._record import TrialRecord, TrialStart
from ._agree import Verdict
from ._driver import Driver
from ._messages import Command, CommandKind, TrialPayload

log = logging.getLogger(__name__)


class RefitRuns:
    """The refit of one sweep, on rank 0; records go to ``driver.refits`` (``refit:`` in the results)."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    def _checkpoint(self, number: int) -> dict[str, Any]:
        """With ``refit.from_checkpoint``: the refit run's own checkpoint dir and the trial's newest checkpoint."""
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

    def runs(self) -> list[list[TrialPayload]]:
        """The refit's runs in order, each its payloads in order: one per chosen trial (its parts when it replays a
        PBT schedule), then one per ``refit.baselines`` config. Each payload carries the trial's overrides, then
        ``refit.overrides``; its ``params`` are those the task suggested itself (``current_trial()`` replays them).

        Raises:
            ValueError: ``refit.trials`` names no trial the study can refit (:meth:`_numbers`).
        """
        d = self.driver
        runs = []
        for number in self._numbers():
            trial = d.study.trials[number]
            start = TrialStart(number, number, split_params(trial, d.space)[0], tuple(d.space.fixed), refit=True)
            first = self._payload(trial, number, **self._checkpoint(number), tracking_env=d.tracking.trial_env(start))
            runs.append(self._parts(first))
        return runs + [[p] for p in self._baseline_payloads()]

    def _payload(self, trial: Any, number: int, **fields: Any) -> TrialPayload:
        """The refit payload of trial ``number`` with ``trial``'s params (a part of a schedule: the segment's trial)."""
        trial_lines, task_params = trial_overrides(trial, self.driver.space)
        overrides = [*trial_lines, *self.driver.settings.refit_overrides, f"hydra.sweep.subdir=refit/{number}"]
        return TrialPayload(number, task_params, overrides, **fields)

    def _parts(self, first: TrialPayload) -> list[TrialPayload]:
        """``[first]``, or the parts replaying trial ``first.number``'s PBT schedule (module docstring), in the
        refit's own checkpoint dir, emptied first (a replay starts at step 0)."""
        d = self.driver
        if not (d.settings.refit_schedule and d.settings.scheduler.name == "pbt") or d.settings.refit_from_checkpoint:
            return [first]
        segments = schedule(d.study.get_trials(deepcopy=False), first.number)
        if len(segments) < 2:
            return [first]
        directory = str(Path(d.sweep_dir) / "refit" / str(first.number) / "checkpoints")
        for old in _checkpoints.checkpoints(directory):
            _checkpoints.remove(old)
        log.info("The refit of trial %d replays its PBT schedule in %d parts: %s", first.number, len(segments),
                 "; ".join(f"{s['params']} from step {s['from_step'] or 0}" for s in segments))
        parts = []
        for k, segment in enumerate(segments):
            part = self._payload(d.study.trials[segment["trials"][-1]], first.number, checkpoint_dir=directory,
                                 tracking_env=first.tracking_env, pause_at=segment["to_step"],
                                 part=f"part {k + 1} of {len(segments)}")
            parts.append(part)
        return parts

    def _baseline_payloads(self) -> list[TrialPayload]:
        """One payload per ``refit.baselines`` config, numbered -1, -2, ...: the run's fixed overrides, the
        baseline's, then ``refit.overrides``, in ``<sweep dir>/refit/<name>``. Its ``params`` are the baseline's
        ``+`` keys, ``+`` dropped: they answer the task's own ``suggest_*`` calls (``+width: 19``)."""
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
        """The trial numbers ``refit.trials`` names, in order, each once (``enqueued``: each warm start's last
        COMPLETE run).

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
        if payload.part:  # the last part of a replayed PBT schedule (or the part that failed)
            entry["schedule"] = [{k: v for k, v in segment.items() if k != "cloned"}
                                 for segment in schedule(d.study.get_trials(deepcopy=False), payload.number)]
            entry["part"] = payload.part
            # one command cannot replay the parts: the sweep's own line (its budget spent) runs only the refit again
            entry["rerun_command"] = resume_command(d.sweep_dir)
        if verdict.error:
            entry["error"] = verdict.error
        d.refits.append(entry)
        d.tracking.trial_ended(payload.number, lambda start: TrialRecord(
            start, verdict.state.name, error=verdict.error, rerun=entry["rerun_command"], metrics=entry["metrics"]),
            refit=True)
        log.info("Refit of %s %s: metrics %s\n  rerun: %s", payload.what, verdict.state.name,
                 entry["metrics"], entry["rerun_command"])


class RefitQueue:
    """The refit runs of one sweep handed out one at a time, to one group or to several trial groups, once the
    search is over. A run's parts go out one after the other, each once the part before paused. The final STOP
    carries a ``TrialFailedError`` naming each failed run and the resume command when any run failed."""

    def __init__(self, runs: RefitRuns) -> None:
        self.runs = runs
        self._stop: Command | None = None
        try:
            self._left = runs.runs()  # each run's parts still to hand out, in order
        except Exception as e:
            log.exception("Rank 0 could not prepare the refit")
            self._stop = Command(CommandKind.STOP, error=RemoteError("SweepStoppedError",
                                                                      f"refit: {type(e).__name__}: {e}", 0))
            self._left = []
        if self._left:
            log.info("Refit of %s with %s", ", ".join(parts[0].what for parts in self._left),
                     list(runs.driver.settings.refit_overrides))
        self._busy: set[int] = set()  # runs with a part handed out and not yet recorded
        self._failed: list[str] = []
        self._recorded = False

    def next(self) -> Command | None:
        """The next run or part (``Command(RUN, (payload,))``), the final STOP, or ``None`` while runs handed to
        other groups are still running (the caller asks again after :meth:`record`)."""
        if self._stop is not None:
            return self._stop
        for parts in self._left:
            if parts[0].number not in self._busy:
                payload = parts.pop(0)
                if not parts:
                    self._left.remove(parts)
                self._busy.add(payload.number)
                if payload.part:  # a part of a replay: from the checkpoint of the part before (none for the first)
                    latest = _checkpoints.latest_checkpoint(payload.checkpoint_dir)
                    payload = dataclasses.replace(payload, resume_from=latest)
                return Command(CommandKind.RUN, (payload,))
        if self._busy:
            return None
        if not self._recorded:
            return Command(CommandKind.STOP, reason="nothing to refit")
        if not self._failed:
            return Command(CommandKind.STOP, reason="refit done")
        return Command(CommandKind.STOP, error=RemoteError("TrialFailedError", (
            f"refit failed ({'; '.join(self._failed)}); the search's results are kept. Run the refit again on the "
            f"study without new trials: {resume_command(self.runs.driver.sweep_dir)}"), 0))

    def record(self, payload: TrialPayload, verdict: Verdict) -> None:
        """Keep one run's outcome (:meth:`RefitRuns.record`); a run that did not complete fails the refit. A part
        that paused where it should lets the run's next part go out; a part that did not drops the rest."""
        self._busy.discard(payload.number)
        rest = next((parts for parts in self._left if parts[0].number == payload.number), None)
        if rest is not None and verdict.paused_at is not None:
            log.info("The refit of trial %d paused at step %d (%s); the next part resumes from its checkpoint",
                     payload.number, verdict.paused_at, payload.part)
            return
        if rest is not None:
            self._left.remove(rest)
            verdict = dataclasses.replace(verdict, error=f"{payload.part} of the replayed schedule ended "
                                          f"{verdict.state.name} instead of pausing at step {payload.pause_at}"
                                          + (f": {verdict.error}" if verdict.error else ""))
        self._recorded = True
        self.runs.record(payload, verdict)
        if verdict.state != TrialState.COMPLETE or rest is not None:
            self._failed.append(f"{payload.what}: {verdict.error or verdict.state.name}")
