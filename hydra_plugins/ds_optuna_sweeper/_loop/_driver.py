"""Rank 0 only: the study's one owner. Ask -> :class:`Command`, tell verdicts, close, finish.

A :class:`Driver` exists on global rank 0 and is ``None`` on every other rank, so "only rank 0
touches the study" is a fact of the structure (docs/design.md, "One sampler"). Nothing here communicates
between ranks: the loop in ``_sweep.py`` broadcasts what the driver decides.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from typing import Any, Sequence

import optuna
from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf
from optuna.trial import TrialState

from .. import _upstream as upstream
from .._errors import DSOptunaSweeperError, RemoteError, StorageUnavailableError
from .._settings import Settings
from .._study import _grid, _retry
from .._study import _abandon, _heartbeat, _owners, _queue, _tell, _trial_checkpoints, _trial_log
from .._study import _plots as plots
from .._study import _results as results
from .._study._command import RerunContext, resume_command, trial_rerun_line
from .._study._override_text import command_line_overrides
from .._study._search_space import SearchSpace
from .._study._stop import StopCheck, StopReason, StopRules
from .._study._stored import (
    FIXED_OVERRIDES_ATTR,
    GPU_PEAK_ATTR,
    GROUP_ATTR,
    INTERRUPTED_ATTR,
    OVERRIDE_PARAMS_ATTR,
    SEED_VALUES_ATTR,
    TRIAL_GROUP_ATTR,
)
from .._tracking._record import TrialRecord, TrialStart, trial_record
from .._tracking._task_env import RUN_NAME_ENV
from .._tracking._tracking import Tracking
from ._agree import Verdict
from ._launch import Launch
from ._messages import Command, CommandKind, Setup
from ._payload import TrialPayload

log = logging.getLogger(__name__)


class Driver:
    """The study's owner on rank 0 for one sweep. Build it with :func:`._driver_start.start_driver`.

    Attributes:
        settings: the checked ``hydra.sweeper`` settings.
        study: the Optuna study.
        space: the search space.
        sweep_dir: rank 0's absolute sweep dir.
    """

    def __init__(
        self, settings: Settings, config: DictConfig, study: optuna.Study, space: SearchSpace, sweep_dir: str,
        group_id: str | None = None,
    ) -> None:
        self.settings = settings
        self.config = config
        self.study = study
        self.space = space
        self.sweep_dir = sweep_dir
        self.group_id = group_id
        self._asked: dict[int, optuna.trial.Trial] = {}
        self._groups: dict[int, int] = {}  # trial number -> the trial group that runs it (n_jobs above world size 1)
        self._started: dict[int, float] = {}
        self._finished, self._failed = 0, 0  # this run's finished and failed trials (failure rate)
        self._busy_s = 0.0  # seconds of this run's finished trials, for the ETA
        #: Trials another worker closed before this group could tell them (counted, never fatal).
        self.closed_elsewhere = 0
        #: The refit runs' records (``refit:`` in optimization_results.yaml).
        self.refits: list[dict[str, Any]] = []
        self._pending_error: str | None = None
        self._sampler_requested_stop = False
        self._custom = get_method(settings.custom_search_space) if settings.custom_search_space else None
        #: ``time.monotonic()`` when this launch's first ``study.ask`` began (``None`` before it):
        #: ``hydra.sweeper.timeout`` counts from here, as Optuna's ``study.optimize(timeout=...)``
        #: counts from the start of its trial loop, so set-up (study, ranks, runner) is not spent.
        self._t0: float | None = None
        #: The sweep's trackers (``hydra.sweeper.tracking``; none unless :func:`._driver_start.start_driver` opens them).
        self.tracking = Tracking([])
        #: ``hydra.sweeper.stop`` on this study (:func:`._driver_start.start_driver` builds it before the study opens).
        self.stop = StopCheck(StopRules(), "minimize")
        #: The stop rule that ended the search (``stopped_by:`` in optimization_results.yaml), or ``None``.
        self.stopped_by: StopReason | None = None

    def setup_message(self) -> Setup:
        """The :class:`Setup` every rank needs before the first trial."""
        cache = OmegaConf.get_cache(self.config)
        return Setup(self.sweep_dir, dict(cache) if cache else {})

    # --- one round ------------------------------------------------------------------------------

    def next_command(self, group: int | None = None) -> Command:
        """Decide the next round: stop (error, failure rate, timeout, grid done, a stop rule, budget) or run trials.

        ``group``: the trial group that asks (``hydra.sweeper.n_jobs`` inside a torchrun world), stored with
        each trial it gets (:data:`._stored.TRIAL_GROUP_ATTR`); ``None`` for the whole world.

        On a grid, a round asks no more trials than the grid has points nobody holds (plus queued
        trials), and a grid whose every point has run stops before asking (Optuna would re-run a
        point, with a warning; case C32).

        Never raises: a failure here becomes a STOP command with an error, so that the other ranks,
        waiting for the broadcast, learn it too.
        """
        try:
            return self._next_command(group)
        except Exception as e:
            outage = _retry.gave_up(self.study)
            if outage is not None:  # the storage stayed away longer than its retry budget (C35)
                resumable = outage.with_resume(resume_command(self.sweep_dir))
                return Command(CommandKind.STOP, error=RemoteError.from_exception(resumable, 0))
            log.exception("Rank 0 could not prepare the next trial")
            return Command(CommandKind.STOP, error=RemoteError(
                "SweepStoppedError", f"rank 0 could not prepare the next trial: {type(e).__name__}: {e}", 0))

    def _next_command(self, group: int | None) -> Command:
        s = self.settings
        outage = _retry.gave_up(self.study)
        if outage is not None:  # before the failure rate: a trial that failed on the outage is not the cause
            resumable = outage.with_resume(resume_command(self.sweep_dir))
            return Command(CommandKind.STOP, error=RemoteError.from_exception(resumable, 0))
        if self._pending_error:
            return Command(CommandKind.STOP, error=RemoteError("SweepStoppedError", self._pending_error, 0))
        rate = self._failed / self._finished if self._finished else 0.0
        if self._failed and rate > s.max_failure_rate:
            return Command(
                CommandKind.STOP,
                error=RemoteError("TrialFailedError", (
                    f"{self._failed} of {self._finished} trials of this run failed (failure rate {rate:.2f} > "
                    f"hydra.sweeper.max_failure_rate={s.max_failure_rate}); see the errors logged "
                    f"above. The study keeps every trial, and failed ones count against hydra.sweeper.n_trials="
                    f"{s.n_trials} (raise it to run as many new ones); fix the cause (in the task, its config or "
                    f"this command's overrides) and resume with: {resume_command(self.sweep_dir)}"
                ), 0),
            )
        if s.timeout_s is not None and self._t0 is not None and time.monotonic() - self._t0 >= s.timeout_s:
            return Command(CommandKind.STOP, reason=f"hydra.sweeper.timeout={s.timeout_s:g} s reached")
        if self._sampler_requested_stop:
            return Command(CommandKind.STOP, reason="the sampler has no point left (every grid point was tried)")
        _owners.close_orphans(self.study, s.retry_failed_trials)  # another launch on the study died (C54)
        _abandon.fail_stale(self.study)
        stop = self.stopped_by or self.stop.reason(self.study)  # once met, every later ask (other groups) stops too
        if stop is not None:
            self.stopped_by = stop
            return Command(CommandKind.STOP, reason=stop.text)
        stored = _queue.counted_trials(self.study)
        remaining = s.n_trials - stored
        if remaining <= 0:
            held = f"{stored} trial" + ("" if stored == 1 else "s")
            return Command(CommandKind.STOP, reason=f"the study holds {held} (n_trials={s.n_trials})")
        asks = min(s.batch, remaining)
        left = _grid.points_left(self.study)  # a grid: never ask a point twice in one round, never resume a done grid
        if left is not None:
            if left == 0 and self.study.sampler.is_exhausted(self.study):
                return Command(CommandKind.STOP, reason="the sampler has no point left (every grid point was tried)")
            asks = min(asks, max(left, 1))
        return Command(CommandKind.RUN, tuple(self._ask(group) for _ in range(asks)))

    def _ask(self, group: int | None = None) -> TrialPayload:
        """Ask one trial, run ``custom_search_space`` on it, and turn it into a payload.

        Raises:
            DSOptunaSweeperError: ``custom_search_space`` failed; every trial asked so far in this
                round is told FAIL first, so none is left RUNNING.
        """
        if self._t0 is None:  # the timeout's clock starts at this launch's first ask
            self._t0 = time.monotonic()
        known = len(self.study.get_trials(deepcopy=False))
        try:
            with warnings.catch_warnings():
                # We record heartbeats ourselves (_heartbeat.Heartbeat) outside Study.optimize.
                warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
                trial = self.study.ask(fixed_distributions=self.space.distributions())
        except Exception:
            _tell.close_orphan(self.study, known)
            raise
        self._asked[trial.number] = trial
        _owners.record_owner(self.study, trial)  # its launch's owner lock tells a later launch it is alive (C54)
        if self.group_id is not None:
            trial.set_user_attr(GROUP_ATTR, self.group_id)
        if group is not None:
            trial.set_user_attr(TRIAL_GROUP_ATTR, int(group))
            self._groups[trial.number] = int(group)
        trial.set_user_attr(FIXED_OVERRIDES_ATTR, list(self.space.fixed))  # for its rerun line
        # A retry holds the params of the trial it retries, those its task suggested too (replayed by
        # suggest_*, not config overrides) and those custom_search_space added (listed in the copied attribute).
        before = set(trial.params)
        stored = upstream.stored_trial(self.study, trial)  # a retry's copied attributes and intermediate values
        added = set(stored.user_attrs.get(OVERRIDE_PARAMS_ATTR, ()))
        try:
            if self._custom is not None:
                self._custom(self.config, trial)
                added |= set(trial.params) - set(self.space.params) - before
                if added:  # config overrides too (not params the task suggests): for rerun lines
                    trial.set_user_attr(OVERRIDE_PARAMS_ATTR, sorted(added))
            params = dict(trial.params)
        except Exception as e:
            for number in list(self._asked):  # asked but never run: do not leave them RUNNING
                self.study.tell(self._asked.pop(number), state=TrialState.FAIL)
            raise DSOptunaSweeperError(f"custom_search_space failed for trial {trial.number}: {e}") from e
        self._started[trial.number] = time.monotonic()
        root = _trial_checkpoints.checkpoint_root(self.settings.checkpoint_root, self.sweep_dir)
        ckpt = _trial_checkpoints.checkpoint_of(trial, stored, root)
        config_params = {k: v for k, v in params.items() if k in self.space.params or k in added}
        start = TrialStart(trial.number, trial.number if ckpt.continues is None else ckpt.continues, config_params,
                           tuple(self.space.fixed), group, written_steps=tuple(ckpt.inherited_steps))
        return TrialPayload(trial.number, params, self.space.overrides(config_params), checkpoint_dir=ckpt.directory,
                            resume_from=ckpt.resume_from, continues=ckpt.continues, inherited_steps=ckpt.inherited_steps,
                            tracking_env=self.track_start(start))

    def track_start(self, start: TrialStart) -> dict[str, str]:
        """Start the run of ``start`` in the trackers; the task's environment (empty without tracking)."""
        if not self.tracking:
            return {}
        return {**self.tracking.trial_started(start), RUN_NAME_ENV: start.name}

    def launch(self, payloads: Sequence[TrialPayload], watch: Any) -> Launch:
        """Rank 0's :class:`Launch` of a round of asked trials: their ``optuna.Trial`` objects (for the
        task's :class:`RankTrial`) and a heartbeat that records Optuna heartbeats while they run."""
        numbers = [p.number for p in payloads]
        return Launch.of(payloads, optuna_trials={n: self._asked[n] for n in numbers},
                         heartbeat=self.heartbeat(numbers), watch=watch)

    def heartbeat(self, numbers: Sequence[int]) -> _heartbeat.Heartbeat:
        """A :class:`._heartbeat.Heartbeat` (context manager) for the asked trials ``numbers``."""
        return _heartbeat.Heartbeat(self.study, [upstream.trial_id(self._asked[n]) for n in numbers])

    def asked_trial(self, number: int) -> optuna.trial.Trial:
        """The asked, not yet told ``optuna.Trial`` numbered ``number`` (``KeyError`` when it is not open)."""
        return self._asked[number]

    def tell(self, verdicts: Sequence[Verdict], group: int | None = None) -> None:
        """Tell each verdict to the study, log it, count failures, refresh plots when due.

        A storage error is not raised here: it stops the sweep at the next :meth:`next_command`, on
        every rank. ``group``: the trial group that ran them, for the log line (``None``: the world).
        """
        for verdict in verdicts:
            self._tell(verdict)

    def _tell(self, verdict: Verdict) -> None:
        """One verdict: count it for the failure rate, tell it, then log its line and refresh the plots."""
        trial = self._asked.pop(verdict.number)
        group = self._groups.pop(verdict.number, None)  # (the group that asked it; the tell's is the same)
        elapsed = time.monotonic() - self._started.pop(verdict.number, time.monotonic())
        self._finished += 1
        if verdict.state == TrialState.FAIL and not verdict.preempted:  # a preemption is not a failure
            self._failed += 1
        if verdict.preempted:
            trial.set_user_attr(INTERRUPTED_ATTR, verdict.error or "preempted (SIGTERM)")
        if not self._tell_study(trial, verdict):
            return
        if verdict.preempted:
            verdict = dataclasses.replace(verdict, error=f"{verdict.error}; {self._requeue(verdict.number)}")
        if self.tracking:
            self._track_end(trial, verdict, elapsed)
        s = self.settings
        _trial_checkpoints.retain(self.study, verdict.number, keep_best=s.keep_best, keep_pruned=s.keep_pruned,
                                  retried=verdict.preempted)
        self._busy_s += elapsed
        _trial_log.log_progress(self.study, self._report(trial, verdict, elapsed, group))
        every = self.settings.plot_every
        if self.settings.plots and every > 0 and self._finished % every == 0:
            plots.write_plots(self.study, self.sweep_dir)

    def _track_end(self, trial: optuna.trial.Trial, verdict: Verdict, elapsed: float) -> None:
        """Write the told trial's end into its tracker runs (read from the study: what the trackers show is
        what the study holds)."""
        def record(start: TrialStart) -> TrialRecord:
            stored = upstream.stored_trial(self.study, trial)
            state = "INTERRUPTED" if verdict.preempted else stored.state.name
            rerun = trial_rerun_line(stored, RerunContext(self.space, self.hydra_overrides, self.sweep_dir))
            return trial_record(start, stored, state, error=verdict.error, rerun=rerun, elapsed_s=elapsed)

        self.tracking.trial_ended(verdict.number, record)

    def _requeue(self, number: int) -> str:
        """Re-queue the interrupted trial ``number``; the text for its log line."""
        try:
            retry = _abandon.requeue_interrupted(self.study, number)
        except Exception as e:  # the storage: the sweep stops at the next command
            self._pending_error = f"re-queueing interrupted trial {number} failed: {type(e).__name__}: {e}"
            log.exception("re-queueing interrupted trial %d failed", number)
            return "NOT re-queued (see the error above)"
        return f"re-queued as trial {retry}, which resumes from the trial's newest checkpoint"

    def _tell_study(self, trial: optuna.trial.Trial, verdict: Verdict) -> bool:
        """Tell the verdict (and the per-seed values) to the study; ``False`` when there is nothing to log:
        another worker closed the trial, or the tell failed (kept to stop the sweep at the next command)."""
        try:
            if verdict.seed_values:
                trial.set_user_attr(SEED_VALUES_ATTR, {str(k): list(v) for k, v in verdict.seed_values.items()})
            values = list(verdict.values) if verdict.state == TrialState.COMPLETE and verdict.values else None
            told = _tell.tell(self.study, trial, verdict.state, values)
            if told == _tell.TellResult.SAMPLER_STOP:
                self._sampler_requested_stop = True
            elif told == _tell.TellResult.CLOSED_ELSEWHERE:
                self.closed_elsewhere += 1
                return False
        except Exception as e:
            self._pending_error = f"study.tell failed for trial {verdict.number}: {type(e).__name__}: {e}"
            if isinstance(e, StorageUnavailableError):  # the sweep stops at the next command (C35)
                log.error("Trial %d could not be told %s: it stays RUNNING in the study until a later launch "
                          "opens it (this launch's owner lock ends with it) or a heartbeat check closes it (grace_period)", verdict.number, verdict.state.name)
            else:
                log.exception("study.tell failed for trial %d", verdict.number)
            return False
        return True

    def _report(self, trial: optuna.trial.Trial, verdict: Verdict, elapsed: float,
                group: int | None = None) -> _trial_log.TrialReport:
        """The told trial's log line: budget and ETA (this run's mean seconds per finished trial, over the
        trial groups that run at once; at most the ``timeout`` left), its trial group, and the GPU peak rank 0's task stored on the trial
        (:mod:`._gpu_peak`)."""
        done = _queue.counted_trials(self.study) - len(self._asked)  # running trials (other groups, a batch) are not done
        left = max(self.settings.n_trials - done, 0)
        eta = self._busy_s / self._finished * left / self.settings.trial_groups if self._finished else None
        if self.settings.timeout_s is not None and self._t0 is not None:  # no ask after the timeout
            time_left = max(self.settings.timeout_s - (time.monotonic() - self._t0), 0.0)
            eta = time_left if eta is None else min(eta, time_left)
        gpu_peak = upstream.stored_trial(self.study, trial).user_attrs.get(GPU_PEAK_ATTR)
        return _trial_log.TrialReport(verdict.number, trial.params, verdict.state, verdict.values, elapsed,
                                   verdict.error, _trial_log.Progress(done, self.settings.n_trials, eta), gpu_peak,
                                   group=group, interrupted=verdict.preempted)

    @property
    def hydra_overrides(self) -> tuple[str, ...]:
        """The run's ``hydra.*`` command-line overrides (for rerun lines)."""
        return tuple(command_line_overrides(self.config))

    # --- the end ----------------------------------------------------------------------------------

    def abandon_open(self, why: str, *, retry: bool = True, numbers: Sequence[int] | None = None) -> None:
        """Close (FAIL, or re-queue with ``retry_failed_trials``) every asked trial not yet told.

        Called when the sweep leaves with a trial still asked (a peer timed out, an interrupt,
        SIGTERM), so the study holds no RUNNING trial that nobody runs. ``retry=False`` never re-queues:
        for a trial whose task raised (case C45), which the same params would fail again. ``numbers``
        limits it to those trials (one trial group's); ``None``: all.
        """
        chosen = [n for n in self._asked if numbers is None or n in numbers]
        if chosen and _abandon.abandon_or_log(self.study, chosen, self.settings.retry_failed_trials if retry else 0,
                                              why, self.settings.storage_url(self.sweep_dir)):
            for number in chosen:  # closed (or found closed already): nothing of this run holds them any more
                self._asked.pop(number, None)
                self._groups.pop(number, None)
                self._started.pop(number, None)

    def finish(self) -> None:
        """Log the trials table, write ``optimization_results.yaml`` and the plots (:func:`._results.finish_study`).
        Never raises."""
        rerun = RerunContext(self.space, self.hydra_overrides, self.sweep_dir)
        results.finish_study(self.study, rerun, self.sweep_dir, self.settings.directions, self.refits,
                             budget=self.settings.n_trials, plots=self.settings.plots,
                             stopped_by=self.stopped_by.as_dict() if self.stopped_by else None)
        if self.tracking:
            try:
                finished = {t.number: "INTERRUPTED" if INTERRUPTED_ATTR in t.user_attrs else t.state.name
                            for t in self.study.get_trials(deepcopy=False) if t.state.is_finished()}
            except Exception:  # noqa: BLE001 - the storage is gone: the runs stay as they are
                finished = {}
            from .._tracking._record import StudyBest

            self.tracking.close(finished, "FINISHED", StudyBest.of(self.study))
