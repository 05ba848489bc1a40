"""Rank 0 only: the study's one owner. Ask -> :class:`Command`, tell verdicts, close, finish.

A :class:`Driver` exists on global rank 0 and is ``None`` on every other rank, so "only rank 0
touches the study" is a fact of the structure (docs/design.md, "One sampler"). Nothing here communicates
between ranks: the loop in ``_sweep.py`` broadcasts what the driver decides.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import optuna
from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf
from optuna.trial import TrialState

from .. import _upstream as upstream
from .._errors import DSOptunaSweeperError, RemoteError, StorageUnavailableError, SweeperConfigError
from .._setting_keys import warn_misplaced_keys
from .._settings import Settings
from .._study import _grid, _retry, _study
from .._study import _abandon, _heartbeat, _queue, _tell, _trial_log
from .._study import _plots as plots
from .._study import _results as results
from .._study._command import resume_command
from .._study._search_space import SearchSpace, build_search_space, span_warnings
from .._study._space_checks import check_group_options, check_param_keys
from .._study._storage import redact_url
from .._study._stored import (
    FIXED_OVERRIDES_ATTR,
    GPU_PEAK_ATTR,
    GROUP_ATTR,
    OVERRIDE_PARAMS_ATTR,
    SEED_VALUES_ATTR,
    TRIAL_GROUP_ATTR,
)
from .._study._warm_start import warm_start_params
from ._agree import Verdict
from ._launch import Launch
from ._messages import Command, CommandKind, Setup
from ._payload import TrialPayload

log = logging.getLogger(__name__)


class Driver:
    """The study's owner on rank 0 for one sweep. Build it with :func:`start_driver`.

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

    def setup_message(self) -> Setup:
        """The :class:`Setup` every rank needs before the first trial."""
        cache = OmegaConf.get_cache(self.config)
        return Setup(self.sweep_dir, dict(cache) if cache else {})

    # --- one round ------------------------------------------------------------------------------

    def next_command(self, group: int | None = None) -> Command:
        """Decide the next round: stop (error, failure rate, timeout, grid done, budget) or run trials.

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
                    "above. The study keeps every trial; fix the cause and resume with: "
                    f"{resume_command(self.sweep_dir)}"
                ), 0),
            )
        if s.timeout_s is not None and self._t0 is not None and time.monotonic() - self._t0 >= s.timeout_s:
            return Command(CommandKind.STOP, reason=f"hydra.sweeper.timeout={s.timeout_s:g} s reached")
        if self._sampler_requested_stop:
            return Command(CommandKind.STOP, reason="the sampler has no point left (every grid point was tried)")
        _abandon.fail_stale(self.study)
        stored = _queue.counted_trials(self.study)
        remaining = s.n_trials - stored
        if remaining <= 0:
            return Command(CommandKind.STOP, reason=f"the study holds {stored} trials (n_trials={s.n_trials})")
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
        if self.group_id is not None:
            trial.set_user_attr(GROUP_ATTR, self.group_id)
        if group is not None:
            trial.set_user_attr(TRIAL_GROUP_ATTR, int(group))
            self._groups[trial.number] = int(group)
        trial.set_user_attr(FIXED_OVERRIDES_ATTR, list(self.space.fixed))  # for its rerun line
        try:
            if self._custom is not None:
                self._custom(self.config, trial)
                added = sorted(set(trial.params) - set(self.space.params))
                if added:  # config overrides too (not params the task suggests): for rerun lines
                    trial.set_user_attr(OVERRIDE_PARAMS_ATTR, added)
            params = dict(trial.params)
        except Exception as e:
            for number in list(self._asked):  # asked but never run: do not leave them RUNNING
                self.study.tell(self._asked.pop(number), state=TrialState.FAIL)
            raise DSOptunaSweeperError(f"custom_search_space failed for trial {trial.number}: {e}") from e
        self._started[trial.number] = time.monotonic()
        return TrialPayload(trial.number, params, self.space.overrides(params))

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
        """The asked, not yet told ``optuna.Trial`` numbered ``number``.

        Raises:
            KeyError: no such trial is open (told, closed, or never asked by this driver).
        """
        try:
            return self._asked[number]
        except KeyError:
            raise KeyError(f"trial {number} is not open on rank 0 (open: {sorted(self._asked)})") from None

    @property
    def open_trials(self) -> list[int]:
        """Numbers of the trials asked and not yet told or closed."""
        return sorted(self._asked)

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
        if verdict.state == TrialState.FAIL:
            self._failed += 1
        if not self._tell_study(trial, verdict):
            return
        self._busy_s += elapsed
        _trial_log.log_progress(self.study, self._report(trial, verdict, elapsed, group))
        every = self.settings.plot_every
        if self.settings.plots and every > 0 and self._finished % every == 0:
            plots.write_plots(self.study, self.sweep_dir)

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
                log.error("Trial %d could not be told %s: it stays RUNNING in the study until a heartbeat check "
                          "closes it (grace_period)", verdict.number, verdict.state.name)
            else:
                log.exception("study.tell failed for trial %d", verdict.number)
            return False
        return True

    def _report(self, trial: optuna.trial.Trial, verdict: Verdict, elapsed: float,
                group: int | None = None) -> _trial_log.TrialReport:
        """The told trial's log line: budget and ETA (this run's mean seconds per finished trial, over the
        trial groups that run at once), its trial group, and the GPU peak rank 0's task stored on the trial
        (:mod:`._gpu_peak`)."""
        done = _queue.counted_trials(self.study)
        left = max(self.settings.n_trials - done, 0)
        eta = self._busy_s / self._finished * left / self.settings.trial_groups if self._finished else None
        gpu_peak = upstream.stored_trial(self.study, trial).user_attrs.get(GPU_PEAK_ATTR)
        return _trial_log.TrialReport(verdict.number, trial.params, verdict.state, verdict.values, elapsed,
                                   verdict.error, _trial_log.Progress(done, self.settings.n_trials, eta), gpu_peak,
                                   group=group)

    @property
    def hydra_overrides(self) -> tuple[str, ...]:
        """The run's ``hydra.*`` command-line overrides (for rerun lines)."""
        return tuple(str(o) for o in self.config.hydra.overrides.get("hydra", []))

    # --- the end ----------------------------------------------------------------------------------

    def abandon_open(self, why: str, *, retry: bool = True, numbers: Sequence[int] | None = None) -> None:
        """Close (FAIL, or re-queue with ``retry_failed_trials``) every asked trial not yet told.

        Called when the sweep leaves with a trial still asked (a peer timed out, an interrupt,
        SIGTERM), so the study holds no RUNNING trial that nobody runs. ``retry=False`` never re-queues:
        for a trial whose task raised (case C45), which the same params would fail again. ``numbers``
        limits it to those trials (one trial group's); ``None``: all.
        """
        chosen = [n for n in self._asked if numbers is None or n in numbers]
        if not chosen:
            return
        try:
            _abandon.abandon(
                self.study, chosen, self.settings.retry_failed_trials if retry else 0, why,
                self.settings.storage_url(self.sweep_dir),
            )
            for number in chosen:  # closed (or found closed already): nothing of this run holds them any more
                self._asked.pop(number, None)
                self._groups.pop(number, None)
                self._started.pop(number, None)
        except Exception as e:
            if _retry.gave_up(self.study) is None:
                raise
            log.error("Trial(s) %s could not be closed, the storage is unreachable (%s: %s); they stay RUNNING "
                      "in the study until a heartbeat check closes them (grace_period)", chosen,
                      type(e).__name__, str(e).splitlines()[0] if str(e) else "")

    def finish(self) -> None:
        """Log the trials table, write ``optimization_results.yaml`` and the plots. Never raises."""
        try:
            log.info("Trials of study '%s':\n%s", self.study.study_name, results.summary_table(self.study))
            rerun = results.RerunContext(self.space, self.hydra_overrides, self.sweep_dir)
            results.write_results(self.study, rerun, self.sweep_dir, self.settings.directions, self.refits,
                                  budget=self.settings.n_trials)
            if self.settings.plots:
                plots.write_plots(self.study, self.sweep_dir)
        except Exception:  # never mask the sweep's own outcome
            outage = _retry.gave_up(self.study)
            if outage is not None:  # C35: no traceback, and how to write them later
                log.error("Writing the results failed: %s. Once the storage answers again, the same command "
                          "writes them (a study that holds n_trials runs no new trial):\n%s",
                          outage, resume_command(self.sweep_dir))
                return
            log.exception("Writing the results failed")


def start_driver(
    settings: Settings, config: DictConfig, arguments: Sequence[str],
    group_options: Callable[[str], list[str]] | None = None, *, group_id: str | None = None,
    restarted: bool = False,
) -> Driver:
    """Rank 0: resolve the sweep dir, build the search space, open the study and queue the warm starts.

    Args:
        settings: the checked settings.
        config: Hydra's master config (``hydra.sweep.dir``, ``hydra.job.name``).
        arguments: the command line's task overrides.
        group_options: ``group -> [options]`` from Hydra's config repository, to check config-group
            choices before trial 0 (case C22); ``None`` skips the check.
        group_id: this torchrun group's identity (``RankComm.group_id``), tagged on its trials.
        restarted: torchrun restarted this group: close its RUNNING trials (case C09).

    Raises:
        SearchSpaceError: a malformed or impossible sweep expression.
        SweeperConfigError: see :func:`_study.open_study`, :func:`.._study._queue.enqueue_warm_starts`, a warm
            start that is no grid point on a grid sampler (:func:`_grid.warm_starts_on_grid`), or a
            ``seed_key`` that is also searched.
    """
    sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    space = _checked_space(settings, config, arguments, group_options)
    storage_label = settings.storage_label(str(sweep_dir))  # the URL, or a _target_ node's text
    study_name = settings.study_name or str(config.hydra.job.name)
    try:
        study = _study.open_study(
            settings, space, storage_url=storage_label, study_name=study_name,
            restarted_group=group_id if restarted else None,
        )
    except StorageUnavailableError as e:  # an outage during set-up (C35): say how to resume
        raise e.with_resume(resume_command(str(sweep_dir))) from e
    log.info(
        "Study '%s' in %s, direction(s) %s, sampler %s, pruner %s; budget n_trials=%d (%d already counted)",
        study.study_name,
        redact_url(storage_label),
        list(settings.directions),
        _grid.sampler_name(study.sampler),
        type(study.pruner).__name__,
        settings.n_trials,
        _queue.counted_trials(study),
    )
    log.info("Sweep dir: %s", sweep_dir)
    driver = Driver(settings, config, study, space, str(sweep_dir), group_id)
    warn_misplaced_keys(config, settings.directions, study.study_name)
    lines = space.describe() or ["(no searched params: every trial runs the fixed overrides)"]
    log.info("Search space:\n  %s", "\n  ".join(lines))
    if space.fixed:
        log.info("Fixed overrides: %s", space.fixed)
    return driver

def _checked_space(
    settings: Settings, config: DictConfig, arguments: Sequence[str], group_options: Callable[[str], list[str]] | None,
) -> SearchSpace:
    """The search space, checked before the study is opened (cases C22, C32, C33); logs span warnings.

    Raises:
        SearchSpaceError: a malformed or impossible sweep expression.
        SweeperConfigError: a warm start that is no grid point, or a ``seed_key`` that is also searched.
    """
    space = build_search_space(settings.params, arguments)
    if group_options is not None:
        check_group_options(space, group_options)
    check_param_keys(space, config, group_options)
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
