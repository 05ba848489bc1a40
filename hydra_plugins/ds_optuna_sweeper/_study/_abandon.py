"""How trials of a dead or preempted worker are found and closed (rank 0).

- A RUNNING trial whose launch is gone (its owner lock is free) is closed when the study is opened
  (:mod:`._owners`, case C54); the rules below are for trials without an owner record.
- RDB storages carry Optuna's heartbeat: rank 0 records one for each running trial every ``heartbeat_interval``
  seconds from a daemon thread (:class:`Heartbeat`); ``optuna.storages.fail_stale_trials`` marks RUNNING trials
  whose heartbeat is older than ``grace_period`` FAIL (Optuna's RDBStorage documentation), in whichever worker
  looks next (:func:`fail_stale`).
- Every trial is tagged with its torchrun group's identity (``_loop._group._group_identity``, case C29). A group
  that torchrun restarted (``--max-restarts``) fails its own abandoned trial at once instead of waiting out the
  grace period (case C09); nobody else's.
- ``retry_failed_trials > 0`` re-queues such abandoned trials with the same params through
  ``optuna.storages.RetryHeartbeatStaleTrialCallback``. Trials that failed by raising are not
  retried: the same params would fail again.
"""

from __future__ import annotations

import copy
import logging
import threading
import warnings
from typing import Any, Callable, Iterable, Optional

from .. import _upstream as upstream
from ._stored import (FAILED_TRIAL_ATTR, FIXED_PARAMS_ATTR, GROUP_ATTR, INTERRUPTED_ATTR, NEVER_RAN_ATTR, OWNER_ATTR,
                      RETRY_HISTORY_ATTR)
from ._storage_text import first_line, is_rdb_url

#: _storage's logger: tests and users filter by it.
log = logging.getLogger(__package__ + "._storage")


def retry_callback(max_retry: Optional[int]) -> Optional[Callable[[Any, Any], None]]:
    """``RetryHeartbeatStaleTrialCallback(max_retry, inherit_intermediate_values=True)``, or ``None`` when
    ``max_retry`` is 0 (``None``: no limit, for a preempted trial). The retry keeps the params, the user attributes
    (the checkpoint directory) and the intermediate values (optuna/storages/_callbacks.py)."""
    if max_retry is not None and max_retry <= 0:
        return None
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry, inherit_intermediate_values=True)


#: One attempt's own marks: Optuna's retry callback copies every user attribute into the retry, which has not been
#: interrupted (a retry that then failed for real was shown INTERRUPTED) and may well run.
_ATTEMPT_MARKS = (INTERRUPTED_ATTR, NEVER_RAN_ATTR)


def _unshared(trial: Any) -> Any:
    """A deep copy for Optuna's retry callback, which appends to the trial's own ``retry_history`` list when the
    trial is itself a retry (optuna 5.0.0, optuna/storages/_callbacks.py), without :data:`_ATTEMPT_MARKS`."""
    copied = copy.deepcopy(trial)
    copied.user_attrs = {k: v for k, v in copied.user_attrs.items() if k not in _ATTEMPT_MARKS}
    return copied


def requeue_interrupted(study: Any, number: int) -> Optional[int]:
    """Re-queue the told (FAIL) trial ``number`` that stopped on ``should_preempt()``, whatever
    ``retry_failed_trials`` says (a preemption is not a failure); return the retry's number, or ``None``."""
    callback = retry_callback(None)
    assert callback is not None
    callback(study, _unshared(upstream.stored_trial_by_number(study, number)))
    retries = [t.number for t in study.get_trials(deepcopy=False) if number in t.system_attrs.get(RETRY_HISTORY_ATTR, ())]
    return retries[-1] if retries else None


def fail_stale(study: Any) -> None:
    """Fail RUNNING trials whose heartbeat is older than the grace period (and re-queue them when
    retries are on); a no-op for storages without heartbeat."""
    if not upstream.storage_heartbeat_interval(study):
        return
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def close_never_ran(study: Any, number: int) -> Optional[int]:
    """Close RUNNING trial ``number`` that no rank ran (rank 0 stopped before its payload left, on a signal or an
    error in its ask, ``custom_search_space`` or its round's next ask): mark it :data:`._stored.NEVER_RAN_ATTR`,
    so ``n_trials`` does not count it and nothing reads it as a continuation (:func:`._queue.counted_trials`,
    :func:`._queue.continued_trials`), and tell it FAIL. When the ask took it from the queue (a retry, a
    promotion's continuation, a PBT interval, a warm start: Optuna's ``fixed_params``, ``failed_trial`` or
    ``retry_history``), a WAITING copy goes back there whatever ``retry_failed_trials`` says: the same params,
    values, user attributes and lineage, so the copy continues what the trial was to continue and the closed
    trial drops out of every lineage (a SIGTERM during the ask of ASHA's promoted trial left its configuration
    neither counted nor continued, and the resumed command sampled a fifth). Returns the copy's number, or
    ``None``. A finished trial is left as it is.

    Raises:
        optuna.exceptions.StorageInternalError: (or the storage's own error) the storage failed.
    """
    import optuna
    from optuna.trial import TrialState

    frozen = upstream.stored_trial_by_number(study, number)
    if frozen.state != TrialState.RUNNING:
        return None
    optuna.trial.Trial(study, upstream.trial_id(frozen)).set_user_attr(NEVER_RAN_ATTR, True)
    study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
    if not _from_queue(frozen):
        return None
    return upstream.create_trial_from_template(study, optuna.trial.create_trial(
        state=TrialState.WAITING, params=frozen.params, distributions=frozen.distributions,
        user_attrs=_unshared(frozen).user_attrs, intermediate_values=frozen.intermediate_values,
        system_attrs={k: v for k, v in frozen.system_attrs.items() if k != OWNER_ATTR},
    ))


def _from_queue(trial: Any) -> bool:
    """Whether the ask took ``trial`` from the queue: it carries what Optuna's ``enqueue_trial`` and retry callback
    store (``fixed_params``, ``failed_trial``, ``retry_history``; :mod:`._pbt` stores the same)."""
    return any(trial.system_attrs.get(k) not in (None, []) for k in (FIXED_PARAMS_ATTR, FAILED_TRIAL_ATTR,
                                                                      RETRY_HISTORY_ATTR))


def abandon(
    study: Any, numbers: Iterable[int], max_retry: int, why: str, storage_url: Optional[str] = None,
    *, say: bool = True, never_ran: Iterable[int] = (),
) -> list[int]:
    """Tell FAIL for RUNNING trials this group can no longer finish, re-queueing them when asked; return the
    numbers actually closed (those still RUNNING).

    Args:
        numbers: trial numbers to close.
        max_retry: ``retry_failed_trials``; 0 closes them for good.
        why: logged reason (``"SIGTERM"``, ``"restarted by torchrun"``).
        storage_url: the study's storage URL; when the study's own session is unusable (an
            exception interrupted a commit), a fresh connection is opened from it.
        say: log the one "Trial(s) ... marked FAIL" line; ``False`` for a caller that logs each trial itself.
        never_ran: those of ``numbers`` that no rank ran: closed by :func:`close_never_ran` unless ``max_retry``
            re-queues them anyway.
    """
    import optuna
    from optuna.trial import TrialState

    closed, copies = [], {}  # copies: never-ran trial -> its copy in the queue (close_never_ran)
    callback = retry_callback(max_retry)
    numbers, never_ran = list(numbers), set(never_ran)

    def close_all(target: Any) -> None:
        for number in numbers:
            if number in closed:
                continue
            try:
                frozen = upstream.stored_trial_by_number(target, number)
                if frozen.state != TrialState.RUNNING:
                    continue
                # never ran: closed as such, unless a retry re-queues its sampled params anyway (one taken from
                # the queue goes back as it was, without spending a retry: close_never_ran)
                own = number in never_ran and (callback is None or _from_queue(frozen))
                if own:
                    copies[number] = close_never_ran(target, number)
                else:
                    target.tell(number, state=TrialState.FAIL)
            except (optuna.exceptions.UpdateFinishedTrialError, ValueError, KeyError):
                continue
            closed.append(number)
            if callback is not None and not own:
                callback(target, _unshared(upstream.stored_trial_by_number(target, number)))

    try:
        close_all(study)
    except Exception:
        if storage_url is None or not is_rdb_url(storage_url):
            raise
        log.warning("closing trial(s) %s on a fresh connection to the storage", numbers)
        close_all(optuna.load_study(study_name=study.study_name, storage=storage_url))
    if closed and say:
        _say_closed(closed, why, copies, max_retry if callback else None)
    return closed


def _say_closed(closed: list[int], why: str, copies: dict[int, Optional[int]], max_retry: Optional[int]) -> None:
    """Log :func:`abandon`'s one line: the closed trials, those that never ran (``copies``: each one's copy in the
    queue, ``None`` for none) and those re-queued by ``retry_failed_trials`` (``max_retry``; ``None``: off)."""
    retried = [n for n in closed if n not in copies] if max_retry is not None else []
    queued = sorted(c for c in copies.values() if c is not None)
    log.warning(
        "Trial(s) %s marked FAIL (%s)%s%s%s",
        closed,
        why,
        f"; {sorted(copies)} never ran (not counted in n_trials)" if copies else "",
        f", queued again as trial(s) {queued}" if queued else "",
        f"; {'' if retried == closed else f'{retried} '}re-queued with the same params "
        f"(retry_failed_trials={max_retry})" if retried else "",
    )


def own_running_trials(study: Any, group: Optional[str]) -> list[int]:
    """Numbers of RUNNING trials tagged with this torchrun group's id (none without an id); only a group that
    torchrun restarted may close these (``RankComm.restarted``)."""
    if group is None:
        return []
    from optuna.trial import TrialState

    return [
        t.number
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if t.user_attrs.get(GROUP_ATTR) == group
    ]


def abandon_or_log(study: Any, numbers: list[int], max_retry: int, why: str, storage_url: Optional[str],
                   never_ran: Iterable[int] = ()) -> bool:
    """:func:`abandon`, except that a storage the retries gave up on (case C35) is logged, not raised; ``True``
    when the trials were closed (or found closed), ``False`` when the storage was unreachable (they stay RUNNING
    until a later launch opens the study, :mod:`._owners`, or a heartbeat check closes them).

    Raises:
        Whatever :func:`abandon` raises while the storage still answers.
    """
    from . import _retry

    try:
        abandon(study, numbers, max_retry, why, storage_url, never_ran=never_ran)
        return True
    except Exception as e:
        if _retry.gave_up(study) is None:
            raise
        log.error("Trial(s) %s could not be closed, the storage is unreachable (%s: %s); they stay RUNNING "
                  "in the study until a later launch opens it (this launch's owner lock ends with it) or a heartbeat "
                  "check closes them (grace_period)", numbers,
                  type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return False


class Heartbeat:
    """Record Optuna heartbeats of the running trials ``trial_ids`` (storage ids) of ``study`` from a daemon thread
    (rank 0, during a trial). Use as a context manager; a no-op when the storage has no heartbeat."""

    def __init__(self, study: Any, trial_ids: Iterable[int]) -> None:
        self._storage: Any = upstream.study_storage(study)
        self._ids = list(trial_ids)
        self._interval = upstream.storage_heartbeat_interval(study) or None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._missed = 0  # beats missed in a row (the first of a streak is logged as a warning)

    def _beat(self) -> None:
        for trial_id in self._ids:
            try:
                self._storage.record_heartbeat(trial_id)
                self._missed = 0
            except Exception as e:  # a missed beat only risks a late stale check; the next one may pass
                self._missed += 1
                (log.warning if self._missed == 1 else log.debug)(
                    "Heartbeat of trial id %d missed (%s); the next one is due in %s s", trial_id, first_line(e),
                    self._interval)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._beat()

    def __enter__(self) -> "Heartbeat":
        if self._interval:
            self._beat()
            self._thread = threading.Thread(target=self._run, name="ds-optuna-heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
