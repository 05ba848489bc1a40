"""Rank 0 only: Optuna's ask-and-tell on the study: asking a trial tagged with its owners (closing the orphan a
raising ``ask`` leaves), and telling it (``study.tell`` through sampler stops and trials another worker closed).
"""

from __future__ import annotations

import enum
import logging
import warnings
from typing import Any, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from .. import _upstream as upstream
from . import _abandon, _owners
from .._task import _checkpoints
from ._stored import (CHECKPOINT_DIR_ATTR, FIXED_OVERRIDES_ATTR, GROUP_ATTR, INTERRUPTED_ATTR, PAUSED_ATTR,
                      TRIAL_GROUP_ATTR)

#: _study's logger: tests and users filter by it.
log = logging.getLogger(__package__ + "._study")


def ask(study: optuna.Study, distributions: dict[str, Any], *, launch_group: str | None, trial_group: int | None,
        fixed: Sequence[str]) -> optuna.trial.Trial:
    """``study.ask(fixed_distributions=distributions)``, the trial tagged with what later launches and its rerun
    line read: this launch's owner lock (:func:`._owners.record_owner`, case C54), the torchrun group id of a
    shared study (:data:`._stored.GROUP_ATTR`), the trial group that runs it (:data:`._stored.TRIAL_GROUP_ATTR`,
    ``None``: the whole world) and the fixed overrides.

    Raises:
        Whatever the sampler or the storage raises, and a signal's exception (Ctrl-C, SIGTERM on rank 0) that lands
        here: the RUNNING trial the ask left is failed first (:func:`close_orphan`), else it would stay RUNNING
        for good, with no owner record, counted in ``n_trials``.
    """
    known = len(study.get_trials(deepcopy=False))
    trial = None
    try:
        with warnings.catch_warnings():
            # We record heartbeats ourselves (_abandon.Heartbeat) outside Study.optimize.
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
            trial = study.ask(fixed_distributions=distributions)
        _owners.record_owner(study, trial)
        if launch_group is not None:
            trial.set_user_attr(GROUP_ATTR, launch_group)
        if trial_group is not None:
            trial.set_user_attr(TRIAL_GROUP_ATTR, int(trial_group))
        trial.set_user_attr(FIXED_OVERRIDES_ATTR, list(fixed))  # for its rerun line
    except BaseException as e:
        why = ("the sampler raised while it was asked" if isinstance(e, Exception)
               else f"its ask was interrupted ({type(e).__name__})")
        close_orphan(study, known, why, trial.number if trial is not None else None)
        raise
    return trial


def tell(study: optuna.Study, trial: optuna.trial.Trial, state: TrialState,
         values: list[float] | None) -> tuple[TellResult, FrozenTrial]:
    """``study.tell`` that survives samplers asking to stop and trials closed by another worker. ``GridSampler``
    and ``BruteForceSampler`` call ``Study.stop()`` from ``after_trial`` once every point was tried, and
    ``Study.stop()`` raises ``RuntimeError`` outside ``Study.optimize`` (optuna/samplers/_grid.py,
    optuna/study/study.py). Optuna stores the trial's state before that (optuna/study/_tell.py), so the error only
    means "no point left".

    Another worker may have failed the trial already (its heartbeat looked stale to it, case C20,
    optuna/optuna#5470); ``skip_if_finished`` then leaves the stored state alone instead of raising
    "Cannot tell a FAIL trial".

    Returns:
        What happened (:attr:`TellResult.TOLD`, :attr:`TellResult.SAMPLER_STOP` or
        :attr:`TellResult.CLOSED_ELSEWHERE`) and the trial as stored afterwards (what ``study.tell`` returns).

    Raises:
        RuntimeError: any other failure, or if the trial is still RUNNING afterwards.
    """
    before: FrozenTrial = upstream.stored_trial(study, trial)  # type: ignore[assignment]
    stored = before.state
    if stored.is_finished():
        log.warning(
            "Trial %d was already closed (%s) by another worker of the study, which took its heartbeat for "
            "stale; this group's result (%s) is not stored. The sweep goes on. Check that every worker uses "
            "the same hydra.sweeper.heartbeat_interval and grace_period", trial.number, stored.name, state.name,
        )
        return TellResult.CLOSED_ELSEWHERE, before
    try:
        if state == TrialState.COMPLETE:
            after = study.tell(trial, values, skip_if_finished=True)
        else:
            after = study.tell(trial, state=state, skip_if_finished=True)
    except RuntimeError:
        after = upstream.stored_trial(study, trial)  # type: ignore[assignment]
        if after.state == TrialState.RUNNING:
            raise
        return TellResult.SAMPLER_STOP, after
    return TellResult.TOLD, after


class TellResult(enum.Enum):
    """What :func:`tell` did."""

    TOLD = "told"
    #: The sampler has no point left (grid or brute force done); the state was stored.
    SAMPLER_STOP = "sampler stop"
    #: The trial was already finished by another worker; nothing was stored.
    CLOSED_ELSEWHERE = "closed elsewhere"


def close_orphan(study: optuna.Study, known: int, why: str = "the sampler raised while it was asked",
                 number: int | None = None) -> None:
    """Fail the trial a raising ``study.ask`` left RUNNING (rank 0): ``number`` when the ask returned it (its tags
    failed), else the one found below; ``why`` goes into the log line.

    Optuna creates the trial before the sampler runs (optuna/study/study.py ``ask``); a sampler that raises then
    leaves a RUNNING trial whose number nobody learned, with no heartbeat. The orphan is the RUNNING trial numbered
    ``known`` (the number of trials before the ask) or later that no group tagged yet; with several candidates
    (another group asked at the same instant) none is touched and a warning names them. The trial is marked
    :data:`._stored.NEVER_RAN_ATTR` first: it never ran, so the budget does not count it (a SIGTERM in rank 0's ask
    under ``--max-restarts`` left one FAIL trial counted, and the restarted launch ran one configuration short);
    one the ask took from the queue goes back there (:func:`._abandon.close_never_ran`).
    """
    try:
        candidates = [number] if number is not None else [
            t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if t.number >= known and GROUP_ATTR not in t.user_attrs
        ]
        if len(candidates) == 1:
            again = _abandon.close_never_ran(study, candidates[0])
            log.warning("Trial %d marked FAIL (%s)%s", candidates[0], why,
                        "" if again is None else f"; its work is queued again (trial {again})")
        elif candidates:
            log.warning("The sampler raised while asking; RUNNING trials %s may be left open", candidates)
    except Exception:  # the ask's own error matters more
        log.debug("closing the trial of a failed ask failed", exc_info=True)


def mark_stop(trial: optuna.trial.Trial, interrupted: str | None, paused_at: int | None) -> None:
    """Before the tell, record how an agreed stop ended the trial: ``interrupted`` (why SIGTERM stopped it: stored
    FAIL and re-queued, :data:`._stored.INTERRUPTED_ATTR`) or ``paused_at`` (the ASHA rung it paused at: stored
    PRUNED and kept for promotion, :data:`._stored.PAUSED_ATTR`; a warning when its checkpoint directory holds no
    checkpoint, since it can then never be continued); nothing when both are ``None``."""
    if interrupted is not None:
        trial.set_user_attr(INTERRUPTED_ATTR, interrupted)
    if paused_at is not None:
        trial.set_user_attr(PAUSED_ATTR, int(paused_at))
        directory = trial.user_attrs.get(CHECKPOINT_DIR_ATTR)
        if not (directory and _checkpoints.checkpoints(directory)):
            log.warning(
                "Trial %d paused at its rung (step %d), but %s holds no checkpoint the sweeper recognises (a "
                "non-empty *.ckpt file such as step=<n>.ckpt, or a checkpoint-<step> directory with "
                "trainer_state.json): it can never be continued, so it is never promoted. Save one there when "
                "should_preempt() answers True, then return (docs/how-to/checkpoints.md)", trial.number, int(paused_at),
                directory)
