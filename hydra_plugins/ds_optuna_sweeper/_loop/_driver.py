"""Rank 0 only: the study's one owner. Ask -> :class:`Command`, tell verdicts, close, finish.

A :class:`Driver` exists on global rank 0 and is ``None`` on every other rank, so "only rank 0
touches the study" is a fact of the structure (docs/design.md, "One sampler"). Nothing here communicates
between ranks: the loop in ``_sweep.py`` broadcasts what the driver decides.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Sequence

import optuna
from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf
from optuna.trial import FrozenTrial, TrialState

from .. import _upstream as upstream
from .._errors import DSOptunaSweeperError, RemoteError, StorageUnavailableError
from .._settings import Settings
from .._study import _abandon, _heartbeat, _queue, _tell, _trial_checkpoints, _trial_log
from .._study import _plots as plots
from .._study import _results as results
from .._study._command import RerunContext, trial_rerun_line
from .._study._override_text import command_line_overrides
from .._study._search_space import SearchSpace
from .._study._policy import Policy, RoundState, Stop, StorageOutage
from .._study._stored import (
    GPU_PEAK_ATTR,
    OVERRIDE_PARAMS_ATTR,
    SEED_VALUES_ATTR,
)
from .._tracking._record import StudyBest, TrialRecord, TrialStart, trial_record
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
        #: What the go/stop rules read (this run's counts, the first ask's time, a failed tell).
        self.state = RoundState(study, settings, sweep_dir)
        self._busy_s = 0.0  # seconds of this run's finished trials, for the ETA
        #: Trials another worker closed before this group could tell them (counted, never fatal).
        self.closed_elsewhere = 0
        #: The refit runs' records (``refit:`` in optimization_results.yaml).
        self.refits: list[dict[str, Any]] = []
        self._custom = get_method(settings.custom_search_space) if settings.custom_search_space else None
        #: The sweep's trackers (``hydra.sweeper.tracking``; none unless :func:`._driver_start.start_driver` opens them).
        self.tracking = Tracking([])
        #: The go/stop rules (:mod:`.._study._policy`; :func:`._driver_start.start_driver` gives it ``hydra.sweeper.stop``).
        self.policy = Policy()

    def setup_message(self) -> Setup:
        """The :class:`Setup` every rank needs before the first trial."""
        cache = OmegaConf.get_cache(self.config)
        return Setup(self.sweep_dir, dict(cache) if cache else {})

    # --- one round ------------------------------------------------------------------------------

    def next_command(self, group: int | None = None) -> Command:
        """Decide the next round with the go/stop rules (:mod:`.._study._policy`): stop, or ask and run trials.

        ``group``: the trial group that asks (``hydra.sweeper.n_jobs`` inside a torchrun world), stored with
        each trial it gets (:data:`._stored.TRIAL_GROUP_ATTR`); ``None`` for the whole world.

        Never raises: a failure here becomes a STOP command with an error, so that the other ranks,
        waiting for the broadcast, learn it too.
        """
        try:
            decision = self.policy.decide(self.state)
            if not isinstance(decision, Stop):
                return Command(CommandKind.RUN, tuple(self._ask(group) for _ in range(decision)))
        except Exception as e:
            decision = StorageOutage().decide(self.state, 0)  # the storage stayed away past its retry budget (C35)
            if not isinstance(decision, Stop):
                log.exception("Rank 0 could not prepare the next trial")
                return Command(CommandKind.STOP, error=RemoteError(
                    "SweepStoppedError", f"rank 0 could not prepare the next trial: {type(e).__name__}: {e}", 0))
        return Command(CommandKind.STOP, reason=decision.reason, error=decision.error, waits=decision.waits)

    def _ask(self, group: int | None = None) -> TrialPayload:
        """Ask one trial, run ``custom_search_space`` on it, and turn it into a payload.

        Raises:
            DSOptunaSweeperError: ``custom_search_space`` failed; every trial asked so far in this
                round is told FAIL first, so none is left RUNNING.
        """
        if self.state.first_ask_at is None:  # the timeout's clock starts at this launch's first ask, not at set-up
            self.state.first_ask_at = time.monotonic()
        trial = _tell.ask(self.study, self.space.distributions(), launch_group=self.group_id, trial_group=group,
                          fixed=self.space.fixed)
        self._asked[trial.number] = trial
        if group is not None:
            self._groups[trial.number] = int(group)
        # A retry holds the params of the trial it retries, those its task suggested too (replayed by
        # suggest_*, not config overrides) and those custom_search_space added (listed in the copied attribute).
        before = set(trial.params)
        stored = upstream.asked_trial_frozen(trial)  # a retry's copied attributes and intermediate values
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
        start = TrialStart(trial.number, ckpt.first, config_params,
                           tuple(self.space.fixed), group, written_steps=tuple(ckpt.inherited_steps))
        return TrialPayload(trial.number, params, self.space.overrides(config_params), checkpoint_dir=ckpt.directory,
                            resume_from=ckpt.resume_from, continues=ckpt.continues, inherited_steps=ckpt.inherited_steps,
                            tracking_env=self.tracking.trial_env(start),
                            pause_at=self.settings.scheduler.pause_step(max(ckpt.inherited_steps, default=None)))

    def launch(self, payloads: Sequence[TrialPayload]) -> Launch:
        """Rank 0's :class:`Launch` of a round of asked trials: their ``optuna.Trial`` objects (for the
        task's :class:`RankTrial`) and a heartbeat that records Optuna heartbeats while they run."""
        numbers = [p.number for p in payloads]
        return Launch.of(payloads, optuna_trials={n: self._asked[n] for n in numbers},
                         heartbeat=self.heartbeat(numbers))

    def heartbeat(self, numbers: Sequence[int]) -> _heartbeat.Heartbeat:
        """A :class:`._heartbeat.Heartbeat` (context manager) for the asked trials ``numbers``."""
        return _heartbeat.Heartbeat(self.study, [upstream.trial_id(self._asked[n]) for n in numbers])

    def is_open(self, number: int) -> bool:
        """Whether trial ``number`` was asked by this driver and is not yet told or closed."""
        return number in self._asked

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
        trial = self._asked[verdict.number]  # kept until told: a SIGTERM before that leaves it to abandon_open
        group = self._groups.pop(verdict.number, None)  # (the group that asked it; the tell's is the same)
        elapsed = time.monotonic() - self._started.pop(verdict.number, time.monotonic())
        self.state.finished += 1
        self.state.failed += int(verdict.state == TrialState.FAIL and not verdict.preempted)  # a preemption is none
        _tell.mark_stop(trial, (verdict.error or "preempted (SIGTERM)") if verdict.preempted else None, verdict.paused_at)
        told = self._tell_study(trial, verdict)
        self._asked.pop(verdict.number)
        if told is None:
            return
        if verdict.preempted:
            verdict = dataclasses.replace(verdict, error=f"{verdict.error}; {self._requeue(verdict.number)}")
        if self.tracking:
            self._track_end(trial, verdict, elapsed)
        s = self.settings
        _trial_checkpoints.retain(self.study, verdict.number, keep_best=s.keep_best, keep_pruned=s.keep_pruned,
                                  retried=verdict.preempted or verdict.paused_at is not None, told=told)
        self._busy_s += elapsed
        _trial_log.log_progress(self.study, self._report(trial, verdict, elapsed, group, told))
        every = self.settings.plot_every
        if self.settings.plots and every > 0 and self.state.finished % every == 0:
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
            self.state.pending_error = f"re-queueing interrupted trial {number} failed: {type(e).__name__}: {e}"
            log.exception("re-queueing interrupted trial %d failed", number)
            return "NOT re-queued (see the error above)"
        return f"re-queued as trial {retry}, which resumes from the trial's newest checkpoint"

    def _tell_study(self, trial: optuna.trial.Trial, verdict: Verdict) -> FrozenTrial | None:
        """Tell the verdict (and the per-seed values) to the study; the trial as stored after the tell, or
        ``None`` when there is nothing to log: another worker closed the trial, or the tell failed (kept to
        stop the sweep at the next command)."""
        try:
            if verdict.seed_values:
                trial.set_user_attr(SEED_VALUES_ATTR, {str(k): list(v) for k, v in verdict.seed_values.items()})
            values = list(verdict.values) if verdict.state == TrialState.COMPLETE and verdict.values else None
            told, stored = _tell.tell(self.study, trial, verdict.state, values)
            if told == _tell.TellResult.SAMPLER_STOP:
                self.state.sampler_exhausted = True
            elif told == _tell.TellResult.CLOSED_ELSEWHERE:
                self.closed_elsewhere += 1
                return None
        except Exception as e:
            self.state.pending_error = f"study.tell failed for trial {verdict.number}: {type(e).__name__}: {e}"
            if isinstance(e, StorageUnavailableError):  # the sweep stops at the next command (C35)
                log.error("Trial %d could not be told %s: it stays RUNNING in the study until a later launch "
                          "opens it (this launch's owner lock ends with it) or a heartbeat check closes it (grace_period)", verdict.number, verdict.state.name)
            else:
                log.exception("study.tell failed for trial %d", verdict.number)
            return None
        return stored

    def _report(self, trial: optuna.trial.Trial, verdict: Verdict, elapsed: float,
                group: int | None, stored: FrozenTrial) -> _trial_log.TrialReport:
        """The told trial's log line: budget and ETA (this run's mean seconds per finished trial, over the
        trial groups that run at once; at most the ``timeout`` left), its trial group, and the GPU peak rank 0's task stored on the trial
        (:mod:`._gpu_peak`), read from ``stored``, the trial as the tell stored it."""
        done = _queue.counted_trials(self.study) - len(self._asked)  # running trials (other groups, a batch) are not done
        left = max(self.settings.n_trials - done, 0)
        eta = None if self.settings.scheduler.pauses else _trial_log.eta_s(  # paused trials: the work left is unknown
            self._busy_s, self.state.finished, left, self.settings.trial_groups, self.settings.timeout_s,
            self.state.first_ask_at)
        gpu_peak = stored.user_attrs.get(GPU_PEAK_ATTR)
        return _trial_log.TrialReport(verdict.number, trial.params, verdict.state, verdict.values, elapsed,
                                   verdict.error, _trial_log.Progress(done, self.settings.n_trials, eta), gpu_peak,
                                   group=group, interrupted=verdict.preempted, paused=verdict.paused_at is not None)

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
                             stopped_by=self.policy.stopped_by.as_dict() if self.policy.stopped_by else None)
        if self.tracking:
            self.tracking.close(results.finished_states(self.study), "FINISHED", StudyBest.of(self.study))
