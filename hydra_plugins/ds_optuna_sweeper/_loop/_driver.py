"""Rank 0 only: the study's one owner. Set up (:func:`start_driver`), ask -> :class:`Command`, tell verdicts, close,
finish.

A :class:`Driver` exists on global rank 0 alone (docs/design.md, "One sampler"); nothing here communicates between
ranks: the loop in ``_sweep.py`` broadcasts what the driver decides.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import optuna
from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf
from optuna.trial import FrozenTrial, TrialState

from .. import _upstream as upstream
from .._errors import DSOptunaSweeperError, RemoteError, StorageUnavailableError, SweeperConfigError
from .._setting_keys import warn_misplaced_keys
from .._settings import Settings
from .._study import _abandon, _grid, _queue, _study, _tell, _trial_checkpoints
from .._study import _plots as plots
from .._study import _results as results
from .._study._command import RerunContext, resume_command, trial_rerun_line
from .._study._override_text import command_line_overrides
from .._study._search_space import SearchSpace, build_search_space, span_warnings
from .._study._policy import Policy, RoundState, Stop, StorageOutage
from .._study._space_checks import check_baseline_keys, check_group_options, check_mutations, check_param_keys
from .._study._stop import StopCheck
from .._study._storage_text import redact_url
from .._study._queue import warm_start_params
from .._study._stored import GPU_PEAK_ATTR, OVERRIDE_PARAMS_ATTR, SEED_VALUES_ATTR
from .._tracking._record import StudyBest, TrialRecord, TrialStart, trial_record
from .._tracking._tracking import Tracking
from ._agree import Verdict
from ._messages import Command, CommandKind, Launch, Setup, TrialPayload

log = logging.getLogger(__name__)


class Driver:
    """The study's owner on rank 0 for one sweep (``sweep_dir``: absolute; ``custom``: the
    ``custom_search_space`` function or ``None``). Built by :func:`start_driver`."""

    def __init__(
        self, settings: Settings, config: DictConfig, study: optuna.Study, space: SearchSpace, sweep_dir: str,
        group_id: str | None = None, custom: Callable[[DictConfig, optuna.trial.Trial], Any] | None = None,
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
        self._handed_out: set[int] = set()  # asked trials whose payload left next_command (a rank may run them)
        self.state = RoundState(study, settings, sweep_dir)  # what the go/stop rules read
        self._busy_s = 0.0  # seconds of this run's finished trials, for the ETA
        self.closed_elsewhere = 0  # trials another worker closed before this group could tell them (never fatal)
        self.refits: list[dict[str, Any]] = []  # the refit runs' records (``refit:`` in the results)
        self._custom = custom  # hydra.sweeper.custom_search_space, imported by start_driver
        self.tracking = Tracking([])  # the sweep's trackers, opened by start_driver
        self.policy = Policy()  # the go/stop rules; start_driver gives it hydra.sweeper.stop

    def setup_message(self) -> Setup:
        """The :class:`Setup` every rank needs before the first trial."""
        cache = OmegaConf.get_cache(self.config)
        return Setup(self.sweep_dir, dict(cache) if cache else {})

    def next_command(self, group: int | None = None) -> Command:
        """Decide the next round with the go/stop rules (:mod:`.._study._policy`): stop, or ask and run trials.
        ``group``: the trial group that asks, stored with each trial it gets; ``None`` for the whole world.

        Never raises: a failure becomes a STOP command with an error, so the ranks waiting for it learn it too.
        """
        try:
            decision = self.policy.decide(self.state)
            if not isinstance(decision, Stop):
                payloads = tuple(self._ask(group) for _ in range(decision))
                self._handed_out.update(p.number for p in payloads)
                return Command(CommandKind.RUN, payloads)
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
        # a retry holds the params of the trial it retries, custom_search_space's among them (the copied attribute)
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
            for number in [n for n in self._asked if n not in self._handed_out]:  # asked, never run: not RUNNING
                self._asked.pop(number)
                _abandon.close_never_ran(self.study, number)
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
        """Rank 0's :class:`Launch` of a round of asked trials, with their ``optuna.Trial`` objects and heartbeat."""
        numbers = [p.number for p in payloads]
        return Launch.of(payloads, optuna_trials={n: self._asked[n] for n in numbers},
                         heartbeat=self.heartbeat(numbers))

    def heartbeat(self, numbers: Sequence[int]) -> _abandon.Heartbeat:
        """A :class:`._abandon.Heartbeat` (context manager) for the asked trials ``numbers``."""
        return _abandon.Heartbeat(self.study, [upstream.trial_id(self._asked[n]) for n in numbers])

    def is_open(self, number: int) -> bool:
        """Whether trial ``number`` was asked by this driver and is not yet told or closed."""
        return number in self._asked

    def asked_trial(self, number: int) -> optuna.trial.Trial:
        """The asked, not yet told ``optuna.Trial`` numbered ``number`` (``KeyError`` when it is not open)."""
        return self._asked[number]

    def tell(self, verdicts: Sequence[Verdict]) -> None:
        """Tell each verdict to the study, log it, count failures, refresh plots when due. A storage error is not
        raised here: it stops the sweep at the next :meth:`next_command`, on every rank."""
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
        self._handed_out.discard(verdict.number)
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
        results.log_progress(self.study, self._report(trial, verdict, elapsed, group, told))
        every = self.settings.plot_every
        if self.settings.plots and every > 0 and self.state.finished % every == 0:
            plots.write_plots(self.study, self.sweep_dir)

    def _track_end(self, trial: optuna.trial.Trial, verdict: Verdict, elapsed: float) -> None:
        """Write the told trial's end, as the study holds it, into its tracker runs."""
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
        """Tell the verdict (and the per-seed values) to the study; the trial as stored after the tell, or ``None``
        when another worker closed it or the tell failed (kept to stop the sweep at the next command)."""
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
                          "opens it (this launch's owner lock ends with it) or a heartbeat check closes it "
                          "(grace_period)", verdict.number, verdict.state.name)
            else:
                log.exception("study.tell failed for trial %d", verdict.number)
            return None
        return stored

    def _report(self, trial: optuna.trial.Trial, verdict: Verdict, elapsed: float,
                group: int | None, stored: FrozenTrial) -> results.TrialReport:
        """The told trial's log line: budget and ETA, its trial group, and the GPU peak its task stored (read from
        ``stored``, the trial as the tell stored it)."""
        done = _queue.counted_trials(self.study) - len(self._asked)  # running trials (other groups, a batch) are not done
        left = max(self.settings.n_trials - done, 0)
        eta = None if self.settings.scheduler.pauses else results.eta_s(  # paused trials: the work left is unknown
            self._busy_s, self.state.finished, left, self.settings.trial_groups, self.settings.timeout_s,
            self.state.first_ask_at)
        gpu_peak = stored.user_attrs.get(GPU_PEAK_ATTR)
        return results.TrialReport(verdict.number, trial.params, verdict.state, verdict.values, elapsed,
                                   verdict.error, results.Progress(done, self.settings.n_trials, eta), gpu_peak,
                                   group=group, interrupted=verdict.preempted, paused=verdict.paused_at is not None)

    @property
    def hydra_overrides(self) -> tuple[str, ...]:
        """The run's ``hydra.*`` command-line overrides (for rerun lines)."""
        return tuple(command_line_overrides(self.config))

    def abandon_open(self, why: str, *, retry: bool = True, numbers: Sequence[int] | None = None) -> None:
        """Close (FAIL, or re-queue with ``retry_failed_trials``) every asked trial not yet told.

        Called when the sweep leaves with a trial still asked, so the study holds no RUNNING trial that nobody
        runs. ``retry=False`` never re-queues (a task that raised, case C45). ``numbers``: only those trials. A trial
        whose payload never left :meth:`next_command` (a signal during its ask, ``custom_search_space`` or the next
        ask of its round) is marked :data:`.._study._stored.NEVER_RAN_ATTR`, so the budget does not count it.
        """
        chosen = [n for n in self._asked if numbers is None or n in numbers]
        never_ran = [n for n in chosen if n not in self._handed_out]
        if chosen and _abandon.abandon_or_log(self.study, chosen, self.settings.retry_failed_trials if retry else 0,
                                              why, self.settings.storage_url(self.sweep_dir), never_ran=never_ran):
            for number in chosen:  # closed (or found closed already): nothing of this run holds them any more
                self._asked.pop(number, None)
                self._handed_out.discard(number)
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


def start_driver(
    settings: Settings, config: DictConfig, arguments: Sequence[str],
    group_options: Callable[[str], list[str]] | None = None, *, group_id: str | None = None,
    restarted: bool = False,
) -> Driver:
    """Rank 0: resolve the sweep dir, build the search space, open the study and queue the warm starts.

    ``arguments``: the command line's task overrides; ``group_options``: ``group -> [options]`` from Hydra's config
    repository, to check config-group choices before trial 0 (case C22; ``None`` skips it); ``group_id``: this
    torchrun group's identity, tagged on its trials; ``restarted``: close its RUNNING trials (case C09).

    Raises:
        SearchSpaceError: a malformed or impossible sweep expression.
        SweeperConfigError: a stop terminator that cannot be built, a refused study (:func:`_study.open_study`),
            or a refused search space (:func:`_checked_space`).
    """
    sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
    space = _checked_space(settings, config, arguments, group_options)
    stop = StopCheck(settings.stop, settings.directions[0])  # a terminator that cannot be built fails here
    custom = _custom_search_space(settings.custom_search_space)
    sweep_dir.mkdir(parents=True, exist_ok=True)  # after the checks: a refused command line leaves no sweep dir
    storage_label = settings.storage_label(str(sweep_dir))  # the URL, or a _target_ node's text
    study_name = settings.study_name or str(config.hydra.job.name)
    try:
        study = _study.open_study(
            settings, space, storage_url=storage_label, study_name=study_name,
            restarted_group=group_id if restarted else None,
        )
    except StorageUnavailableError as e:  # an outage during set-up (C35): say how to resume
        raise e.with_resume(resume_command(str(sweep_dir))) from e
    log.info("Study '%s' in %s, direction(s) %s, sampler %s, pruner %s; budget n_trials=%d (%d already counted)",
             study.study_name, redact_url(storage_label), list(settings.directions), _grid.sampler_name(study.sampler),
             type(study.pruner).__name__, settings.n_trials, _queue.counted_trials(study))
    log.info("Sweep dir: %s", sweep_dir)
    driver = Driver(settings, config, study, space, str(sweep_dir), group_id, custom=custom)
    driver.policy = Policy(stop)
    if settings.stop:
        log.info("Stop rules: %s (checked before each ask)", settings.stop.describe())
    if settings.tracking.report_to:
        driver.tracking = Tracking.open(settings.tracking, sweep_dir=str(sweep_dir), study_name=study.study_name,
                                        study_key=redact_url(storage_label))
    warn_misplaced_keys(config, settings.directions, study.study_name)
    lines = space.describe() or ["(no searched params: every trial runs the fixed overrides)"]
    log.info("Search space:\n  %s", "\n  ".join(lines))
    if space.fixed:
        log.info("Fixed overrides: %s", space.fixed)
    return driver


def _custom_search_space(path: str | None) -> Callable[[DictConfig, optuna.trial.Trial], Any] | None:
    """The ``hydra.sweeper.custom_search_space`` function, imported before the study is opened (``None`` unset).

    Raises:
        SweeperConfigError: the dotted path names nothing that can be called (a newcomer's ``space.spac``
            left an empty study behind when the driver imported it after opening the study).
    """
    if not path:
        return None
    try:
        return get_method(path)
    except Exception as e:  # Hydra's get_method: "Error loading '<path>':", then the import's own error and a hint
        lines = str(e).splitlines()
        why = " ".join(lines[1:] if len(lines) > 1 else lines) or type(e).__name__
        raise SweeperConfigError(f"hydra.sweeper.custom_search_space={path!r} cannot be imported: {why} Give the "
                                 "dotted path of a function fn(cfg, trial), importable from the app's folder.") from None


def _checked_space(
    settings: Settings, config: DictConfig, arguments: Sequence[str], group_options: Callable[[str], list[str]] | None,
) -> SearchSpace:
    """The search space, checked before the study is opened (cases C22, C32, C33); logs span warnings.

    Raises:
        SearchSpaceError: a malformed or impossible sweep expression.
        SweeperConfigError: a warm start that is no grid point, a ``seed_key`` that is also searched, or a
            ``refit.baselines`` key the config does not have.
    """
    space = build_search_space(settings.params, arguments)
    if group_options is not None:
        check_group_options(space, group_options)
    check_param_keys(space, config, group_options)
    check_mutations(space, settings.scheduler.mutations)
    if settings.refit_enabled:
        check_baseline_keys(settings.refit_baselines, config, group_options)
    warm = warm_start_params(space, settings.enqueue_trials)  # checked before the study is opened (C33)
    grid = _grid.grid_of(settings.sampler, space)
    if grid is not None:
        _grid.warm_starts_on_grid(grid, warm)  # a warm start on a grid is a grid point (C32)
    if settings.repeats > 1 and str(settings.seed_key) in space.params:
        raise SweeperConfigError(
            f"hydra.sweeper.seed_key={settings.seed_key} is also searched; the repeats set it, so it "
            "cannot be a param of the study. Remove it from the search space."
        )
    for warning in span_warnings(space):
        log.warning(warning)
    return space
