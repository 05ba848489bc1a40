"""Rank 0's go/stop policy: before each round, may the sweep ask new trials, and how many?

The study's owner (``_loop/_driver.py``) asks :meth:`Policy.decide` before every round and turns a
:class:`Stop` into the STOP command that every rank and every trial group receives, so each rule is agreed by
construction. A rule is one class with ``decide(state, asks) -> int | Stop``: given the round's
:class:`RoundState` and the asks the rules before it allow (``hydra.sweeper.batch`` at first), it returns that
number (unchanged, or lower) or a :class:`Stop`; the first :class:`Stop` wins. To add a rule, write one class
here and put it at its place in :func:`default_rules`; the driver needs no change.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Protocol, Sequence

import optuna

from .._errors import RemoteError
from .._settings import Settings
from . import _abandon, _asha, _grid, _owners, _pbt, _queue, _retry
from ._command import resume_command
from ._stop import StopCheck, StopReason, StopRules


@dataclasses.dataclass(frozen=True)
class Stop:
    """The end of the search: a normal one (``reason``, exit 0) or an error every rank raises (``error``).

    Attributes:
        reason: why the search ended, for the log line ("the study holds 8 trials (n_trials=8)"; "the study holds
            9 trials, 8 of them counted (n_trials=8)" where retries or never-ran trials are not counted).
        error: the error every rank raises (exit status 1), with the resume command where one helps.
        waits: the budget is spent, but under a scheduler that pauses trials a trial still running in another
            trial group may pause and be continued: that group's ask waits for it instead of leaving
            (:meth:`.._loop._study_service.StudyService.next`). Ignored with one trial group (nothing else runs).
    """

    reason: str | None = None
    error: RemoteError | None = None
    waits: bool = False


@dataclasses.dataclass
class RoundState:
    """What the rules read before a round; the driver keeps it up to date.

    Attributes:
        settings: the checked ``hydra.sweeper`` settings.
        sweep_dir: rank 0's sweep dir (for the resume command).
        finished: trials this run told (any state).
        failed: trials this run told FAIL that were not preempted.
        first_ask_at: ``time.monotonic()`` of this launch's first ask, ``None`` before it (seconds).
        sampler_exhausted: a tell returned the sampler's stop.
        pending_error: why the last tell or re-queue failed, or ``None``.
    """

    study: optuna.Study
    settings: Settings
    sweep_dir: str
    finished: int = 0
    failed: int = 0
    first_ask_at: float | None = None
    sampler_exhausted: bool = False
    pending_error: str | None = None


class Rule(Protocol):
    """One go/stop rule (module docstring)."""

    def decide(self, state: RoundState, asks: int) -> "int | Stop":
        """The asks this rule allows (at most ``asks``), or :class:`Stop`."""


class StorageOutage:
    """Stop with the resumable :class:`.._errors.StorageUnavailableError` once the retry budget is spent (C35)."""

    def decide(self, state: RoundState, asks: int) -> int | Stop:
        outage = _retry.gave_up(state.study)
        if outage is None:
            return asks
        return Stop(error=RemoteError.from_exception(outage.with_resume(resume_command(state.sweep_dir)), 0))


class PendingError:
    """Stop with ``SweepStoppedError`` when the last round's tell or re-queue failed."""

    def decide(self, state: RoundState, asks: int) -> int | Stop:
        return Stop(error=RemoteError("SweepStoppedError", state.pending_error, 0)) if state.pending_error else asks


class FailureRate:
    """Stop with ``TrialFailedError`` once this run's failed share exceeds ``hydra.sweeper.max_failure_rate``."""

    def decide(self, state: RoundState, asks: int) -> int | Stop:
        s, failed, finished = state.settings, state.failed, state.finished
        rate = failed / finished if finished else 0.0
        if not failed or rate <= s.max_failure_rate:
            return asks
        return Stop(error=RemoteError("TrialFailedError", (
            f"{failed} of {finished} trials of this run failed (failure rate {rate:.2f} > "
            f"hydra.sweeper.max_failure_rate={s.max_failure_rate}); see the errors logged "
            f"above. The study keeps every trial, and failed ones count against hydra.sweeper.n_trials="
            f"{s.n_trials} (raise it to run as many new ones); fix the cause (in the task, its config or "
            f"this command's overrides) and resume with: {resume_command(state.sweep_dir)}"), 0))


class Timeout:
    """Stop once ``hydra.sweeper.timeout`` seconds have passed since this launch's first ask (as Optuna's
    ``study.optimize(timeout=...)`` counts from its trial loop's start)."""

    def decide(self, state: RoundState, asks: int) -> int | Stop:
        limit, t0 = state.settings.timeout_s, state.first_ask_at
        if limit is not None and t0 is not None and time.monotonic() - t0 >= limit:
            return Stop(reason=f"hydra.sweeper.timeout={limit:g} s reached")
        return asks


#: The reason of a grid whose every point was tried.
GRID_DONE = "the sampler has no point left (every grid point was tried)"


class SamplerExhausted:
    """Stop once a tell returned the sampler's stop (Optuna's ``GridSampler`` calls ``study.stop()`` once it has
    tried every point)."""

    def decide(self, state: RoundState, asks: int) -> int | Stop:
        return Stop(reason=GRID_DONE) if state.sampler_exhausted else asks


#: Seconds between two looks of :class:`CloseOrphans` for trials of dead launches and stale heartbeats.
ORPHAN_LOOK_S = 10.0


class CloseOrphans:
    """Never stops: closes the trials of launches that died (C54) and of stale heartbeats before the count, at the
    first round and then at most every ``every_s`` seconds (a dead launch's RUNNING trial counts against
    ``n_trials`` as a closed one would, and a stale heartbeat shows only after ``grace_period`` seconds anyway)."""

    def __init__(self, every_s: float | None = None) -> None:
        self.every_s = ORPHAN_LOOK_S if every_s is None else float(every_s)
        self._looked_at: float | None = None

    def decide(self, state: RoundState, asks: int) -> int:
        now = time.monotonic()
        if self._looked_at is None or now - self._looked_at >= self.every_s:
            self._looked_at = now
            _owners.close_orphans(state.study, state.settings.retry_failed_trials)
            _abandon.fail_stale(state.study)
        return asks


class StopRulesMet:
    """``hydra.sweeper.stop``: ``check`` (:class:`._stop.StopCheck`, built before the study opened); once met it
    stays met (``met``), as other trial groups ask after it."""

    def __init__(self, check: StopCheck | None = None) -> None:
        self.check = check or StopCheck(StopRules(), "minimize")
        #: The rule that ended the search (``stopped_by:`` in optimization_results.yaml), or ``None``.
        self.met: StopReason | None = None

    def decide(self, state: RoundState, asks: int) -> int | Stop:
        self.met = self.met or self.check.reason(state.study)
        return Stop(reason=self.met.text) if self.met is not None else asks


class Promote:
    """``hydra/sweeper/scheduler=pbt``: once ``n_trials`` members started, queue the next continuation
    (:func:`._pbt.continue_next`). ``asha``: apply ``keep_paused`` (:func:`._asha.drop_over_cap`) and re-queue the
    paused trial that promotion ASHA promotes (:func:`._asha.promotion`); Optuna's next ask takes it before the
    sampler proposes a new configuration. Never stops; a promoted trial and its continuation count once against
    ``n_trials``, so a study whose budget is spent goes on while a paused trial can be promoted."""

    def decide(self, state: RoundState, asks: int) -> int:
        scheduler = state.settings.scheduler
        if not scheduler.pauses:
            return asks
        finishing = _queue.counted_trials(state.study) >= state.settings.n_trials  # no new configuration comes
        if scheduler.name == "pbt":  # every member started: the paused one furthest behind continues (_pbt)
            if finishing:
                _pbt.continue_next(state.study, scheduler, state.settings.sampler_seed)
            return asks
        _asha.drop_over_cap(state.study, scheduler)
        number = _asha.promotion(state.study, scheduler, finishing)
        if number is not None:
            _abandon.requeue_interrupted(state.study, number)
        return asks


class Budget:
    """At most ``n_trials`` counted trials in the study (queued retries and warm starts included, :mod:`._queue`)."""

    def decide(self, state: RoundState, asks: int) -> int | Stop:
        n_trials = state.settings.n_trials
        stored = _queue.counted_trials(state.study)
        if stored >= n_trials:
            held = f"{stored} trial" + ("" if stored == 1 else "s")
            total = len(state.study.get_trials(deepcopy=False))
            if total > stored:  # a retry replaces its attempt; a trial no rank ran is none (_queue.counted_trials)
                held = f"{total} trials, {stored} of them counted"
            return Stop(reason=f"the study holds {held} (n_trials={n_trials})", waits=state.settings.scheduler.pauses)
        return min(asks, n_trials - stored)


class GridPoints:
    """On a grid: at most the points nobody holds (at least 1: queued trials), so no point is asked twice in one
    round, and stop on a done grid (C32)."""

    def decide(self, state: RoundState, asks: int) -> int | Stop:
        left = _grid.points_left(state.study)
        if left is None:
            return asks
        if left == 0 and state.study.sampler.is_exhausted(state.study):
            return Stop(reason=GRID_DONE)
        return min(asks, max(left, 1))


def default_rules(stop_rules: StopRulesMet) -> tuple[Rule, ...]:
    """The rules in order: :class:`StorageOutage` first (a trial that failed on the outage must not count as a
    failure of its own), :class:`CloseOrphans` before the rules that count the study."""
    return (StorageOutage(), PendingError(), FailureRate(), Timeout(), SamplerExhausted(), CloseOrphans(),
            stop_rules, Promote(), Budget(), GridPoints())


class Policy:
    """The ordered rules of one sweep; ``stop``: ``hydra.sweeper.stop``'s check, for :class:`StopRulesMet`;
    ``rules``: the rules in order (``None``: :func:`default_rules`)."""

    def __init__(self, stop: StopCheck | None = None, rules: Sequence[Rule] | None = None) -> None:
        self.stop_rules = StopRulesMet(stop)
        self.rules = tuple(rules) if rules is not None else default_rules(self.stop_rules)

    @property
    def stopped_by(self) -> StopReason | None:
        """The ``hydra.sweeper.stop`` rule that ended the search, or ``None``."""
        return self.stop_rules.met

    def decide(self, state: RoundState) -> int | Stop:
        """The number of trials to ask this round (>= 1), or the :class:`Stop` of the first rule that stops; a
        rule's storage error propagates (the driver turns it into a STOP with the error)."""
        asks: int | Stop = state.settings.batch
        for rule in self.rules:
            asks = rule.decide(state, asks)
            if isinstance(asks, Stop):
                return asks
        return asks
