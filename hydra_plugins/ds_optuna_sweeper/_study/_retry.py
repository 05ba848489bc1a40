"""Retry the study's storage calls through transient database errors (case C35, optuna/optuna#5600): a
PostgreSQL backend terminated by ``pg_terminate_backend``, a server restarting, MySQL's "server has gone away" or
SQLite's "database is locked" beyond its busy timeout (``pool_pre_ping`` already replaces a connection that died
between two calls).

:class:`RetryingRDBStorage` retries every transaction on a fresh connection, with jittered exponential backoff,
while the outage (time since the first failure with no success since) stays within ``retry_timeout_s``; then it
raises :class:`StorageUnavailableError` and keeps it in :attr:`RetryingRDBStorage.gave_up` so the driver stops
the sweep. Calls that are not idempotent (:data:`CHECKED`) are checked before they are repeated, because a
commit may have succeeded although its answer was lost: a new trial carries a random token (:data:`TOKEN_ATTR`)
looked for first, also in Optuna's own retries of the creation; a state change is not repeated when the trial
has the new state; a study found under its name after a failed ``create_new_study`` is used; a study gone after
a failed ``delete_study`` counts as deleted.
"""

from __future__ import annotations

import copy
import datetime
import functools
import json
import logging
import time
import uuid
from typing import Any, Callable, NoReturn, Optional, Sequence, TypeVar

from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState
from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential_jitter

from .._errors import StorageUnavailableError
from .._upstream import rdb_models, storage_backend
from ._stored import TOKEN_ATTR
from ._storage_text import first_line, is_transient, redact_url

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds before the first retry; each further wait doubles, up to :data:`MAX_DELAY_S`, plus up to
#: :data:`FIRST_DELAY_S` at random (jitter, so several groups do not reconnect in step): tenacity's
#: ``wait_exponential_jitter``, the backoff AWS's "Exponential Backoff And Jitter" recommends.
FIRST_DELAY_S = 0.5
MAX_DELAY_S = 8.0
try:  # tenacity 9.2 names the first wait ``multiplier`` and warns on ``initial``, which older releases take
    BACKOFF = wait_exponential_jitter(multiplier=FIRST_DELAY_S, max=MAX_DELAY_S, jitter=FIRST_DELAY_S)
except TypeError:
    BACKOFF = wait_exponential_jitter(initial=FIRST_DELAY_S, max=MAX_DELAY_S, jitter=FIRST_DELAY_S)


def _trial_with_token(session: Any, study_id: int, token: str) -> Any:
    """The trial model of ``study_id`` whose :data:`TOKEN_ATTR` is ``token``, or ``None`` (in ``session``)."""
    models: Any = rdb_models()
    attr = (
        session.query(models.TrialSystemAttributeModel)
        .join(models.TrialModel)
        .filter(models.TrialModel.study_id == study_id)
        .filter(models.TrialSystemAttributeModel.key == TOKEN_ATTR)
        .filter(models.TrialSystemAttributeModel.value_json == json.dumps(token))
        .first()
    )
    return attr.trial if attr is not None else None


def _with_token(template: Optional[FrozenTrial], token: str) -> FrozenTrial:
    """The template Optuna would use for a new trial (a bare RUNNING one when ``None``), plus the token."""
    if template is None:
        return FrozenTrial(
            number=-1, state=TrialState.RUNNING, value=None, datetime_start=datetime.datetime.now(),
            datetime_complete=None, params={}, distributions={}, user_attrs={}, system_attrs={TOKEN_ATTR: token},
            intermediate_values={}, trial_id=-1,
        )
    tagged = copy.deepcopy(template)
    tagged.system_attrs = {**template.system_attrs, TOKEN_ATTR: token}
    return tagged


class RetryingRDBStorage(RDBStorage):
    """Optuna's ``RDBStorage`` that retries its transactions through transient errors (module docstring); the
    constructor (schema, version check) is not retried, so a wrong URL fails at once.

    Args:
        retry_timeout_s: seconds an outage may last before :class:`StorageUnavailableError`; 0 makes
            every transient error fatal at once.
        **kwargs: passed to ``RDBStorage`` (``engine_kwargs``, ``heartbeat_interval``...).

    Attributes:
        gave_up: the first :class:`StorageUnavailableError` this storage raised, or ``None``; never cleared.
    """

    def __init__(self, url: str, *, retry_timeout_s: float, **kwargs: Any) -> None:
        self.retry_timeout_s = float(retry_timeout_s)
        self.gave_up: Optional[StorageUnavailableError] = None
        self._outage_since: Optional[float] = None  # monotonic time of the outage's first failure
        self._outage_attempts = 0
        self._prepared = 0  # trials Optuna prepared inside the current _create_new_trial
        self._bare_token: Optional[str] = None  # the token of the current creation without a template (an ask)
        super().__init__(url, **kwargs)

    def _call(self, what: str, fn: Callable[[], T], recover: Optional[Callable[[], tuple[bool, Any]]] = None) -> T:
        """``fn()`` (one transaction; ``what`` names it in the log), repeated through transient errors within the
        outage budget. ``recover`` is called before each repetition: ``(True, value)`` when the failed attempt took
        effect after all (``value`` is returned), ``(False, None)`` to repeat ``fn``.

        Raises:
            StorageUnavailableError: the outage outlasted ``retry_timeout_s``.
            Exception: any error :func:`._storage_text.is_transient` rejects, unchanged.
        """
        retrying = Retrying(retry=retry_if_exception(is_transient), after=self._note_failure,
                            stop=self._outage_spent, wait=self._backoff,
                            before_sleep=functools.partial(self._before_retry, what),
                            retry_error_callback=functools.partial(self._give_up, what))
        for attempt in retrying:
            with attempt:
                repeated = attempt.retry_state.attempt_number > 1
                found, value = recover() if (repeated and recover is not None) else (False, None)
                result = value if found else fn()
        if self._outage_since is not None:
            log.warning("The Optuna storage answers again (%s succeeded after an outage of %.1f s)",
                        what, time.monotonic() - self._outage_since)
            self._outage_since = None
        return result

    def _note_failure(self, state: RetryCallState) -> None:
        """tenacity's ``after``: the outage starts at its first failure (an earlier call's, when that call gave
        up) and counts its attempts."""
        if self._outage_since is None:
            self._outage_since, self._outage_attempts = time.monotonic(), 0
        self._outage_attempts += 1

    def _outage_spent(self, state: RetryCallState) -> bool:
        """tenacity's stop test: the outage has used ``retry_timeout_s``."""
        assert self._outage_since is not None  # set by _note_failure, which tenacity calls first
        return time.monotonic() - self._outage_since >= self.retry_timeout_s

    def _backoff(self, state: RetryCallState) -> float:
        """Seconds before the next attempt: :data:`BACKOFF`, never past the end of the outage budget."""
        assert self._outage_since is not None  # set by _note_failure, which tenacity calls first
        return max(0.0, min(BACKOFF(state), self.retry_timeout_s - (time.monotonic() - self._outage_since)))

    def _before_retry(self, what: str, state: RetryCallState) -> None:
        """Log the failure and the wait, and drop every connection so the next attempt connects anew."""
        assert state.outcome is not None and state.next_action is not None and self._outage_since is not None
        error = state.outcome.exception()
        log.warning("Optuna storage call %s failed (%s); retrying on a fresh connection in %.1f s "
                    "(outage %.1f s of hydra.sweeper.storage_retry_timeout=%g s)", what, first_line(error),
                    state.next_action.sleep, time.monotonic() - self._outage_since, self.retry_timeout_s)
        self._fresh_connection()

    def _give_up(self, what: str, state: RetryCallState) -> NoReturn:
        """tenacity's callback once :meth:`_outage_spent` said stop: raise (and keep) the outage's error."""
        assert state.outcome is not None and self._outage_since is not None
        cause = state.outcome.exception()
        error = StorageUnavailableError(redact_url(self.url), time.monotonic() - self._outage_since,
                                        self._outage_attempts, first_line(cause))
        (log.error if self.gave_up is None else log.debug)("%s failed: %s", what, error)
        self.gave_up = self.gave_up or error
        raise error from cause

    def _fresh_connection(self) -> None:
        """Drop this thread's session and every pooled connection: the next call connects anew."""
        try:
            self.scoped_session.remove()
            self.engine.dispose()
        except Exception:  # a dead connection may fail to close; it is dropped either way
            log.debug("disposing the storage's connections failed", exc_info=True)

    def create_new_study(self, directions: Sequence[Any], study_name: Optional[str] = None) -> int:
        """``RDBStorage.create_new_study``; a study found under ``study_name`` after a failed attempt is used."""
        def recover() -> tuple[bool, Any]:
            if study_name is None:
                return False, None
            try:
                return True, RDBStorage.get_study_id_from_name(self, study_name)
            except KeyError:
                return False, None

        return self._call("create_new_study", lambda: RDBStorage.create_new_study(self, directions, study_name), recover)

    def delete_study(self, study_id: int) -> None:
        """``RDBStorage.delete_study``; a study gone after a failed attempt counts as deleted."""
        def recover() -> tuple[bool, Any]:
            try:
                RDBStorage.get_study_name_from_id(self, study_id)
            except KeyError:
                return True, None
            return False, None

        self._call("delete_study", lambda: RDBStorage.delete_study(self, study_id), recover)

    def _get_prepared_new_trial(self, study_id: int, template_trial: Any, session: Any) -> Any:
        """Optuna's step that adds the new trial inside ``_create_new_trial``'s transaction, once per attempt of
        Optuna's own retry loop: from the second on, a trial an earlier attempt committed (found by its token) is
        returned. A trial asked without a template takes Optuna's plain path, plus its token's row."""
        self._prepared += 1
        token = template_trial.system_attrs.get(TOKEN_ATTR) if template_trial is not None else None
        if self._prepared > 1 and token is not None:
            existing = _trial_with_token(session, study_id, token)
            if existing is not None:
                log.warning("Trial %d was created by an attempt whose answer was lost; it is used as is",
                            existing.number)
                return existing
        if token is None or token != self._bare_token:
            return super()._get_prepared_new_trial(study_id, template_trial, session)
        # The token's row added to the plain path's transaction: the template path's SELECT and per-attribute
        # upsert cost about two thirds of what the token added to an ask on SQLite (tests/test_retry_token_row.py).
        trial = super()._get_prepared_new_trial(study_id, None, session)
        models: Any = rdb_models()
        session.add(models.TrialSystemAttributeModel(
            trial_id=trial.trial_id, key=TOKEN_ATTR, value_json=json.dumps(token)))
        return trial

    def _create_new_trial(self, study_id: int, template_trial: Optional[FrozenTrial] = None) -> FrozenTrial:
        """``RDBStorage._create_new_trial`` with a token, so a repeated creation never makes two trials."""
        token = uuid.uuid4().hex
        tagged = _with_token(template_trial, token)
        self._bare_token = token if template_trial is None else None

        def recover() -> tuple[bool, Any]:
            found = [t for t in RDBStorage._get_trials(self, study_id, None, set(), -1)
                     if t.system_attrs.get(TOKEN_ATTR) == token]
            if found:
                log.warning("Trial %d was created by an attempt whose answer was lost; it is used as is",
                            found[0].number)
            return (True, found[0]) if found else (False, None)

        def create() -> FrozenTrial:
            self._prepared = 0
            return RDBStorage._create_new_trial(self, study_id, tagged)

        return self._call("create_new_trial", create, recover)

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Optional[Sequence[float]] = None) -> bool:
        """``RDBStorage.set_trial_state_values``, not repeated when the trial already has ``state``; taking a
        WAITING trial whose failed attempt took effect returns whether its start time is this call's (it is ours).
        """
        started = datetime.datetime.now() - datetime.timedelta(seconds=1)

        def recover() -> tuple[bool, Any]:
            trial = RDBStorage.get_trial(self, trial_id)
            if state == TrialState.RUNNING:
                if trial.state == TrialState.WAITING:
                    return False, None
                mine = trial.state == TrialState.RUNNING and (trial.datetime_start or started) >= started
                return True, mine
            if trial.state == state and (values is None or list(trial.values or []) == list(values)):
                return True, True
            return False, None

        return self._call("set_trial_state_values",
                          lambda: RDBStorage.set_trial_state_values(self, trial_id, state, values), recover)


def _retried(name: str) -> Callable[..., Any]:
    real = getattr(RDBStorage, name)

    @functools.wraps(real)
    def method(self: RetryingRDBStorage, *args: Any, **kwargs: Any) -> Any:
        return self._call(name, lambda: real(self, *args, **kwargs))

    return method


#: RDBStorage methods that run one transaction and may simply run again: reads, and writes that
#: overwrite (attributes, intermediate values) or ignore a duplicate (params).
IDEMPOTENT = (
    "get_study_id_from_name", "get_study_name_from_id", "get_study_directions", "get_study_user_attrs",
    "get_study_system_attrs", "get_trial_user_attrs", "get_trial_system_attrs", "get_all_studies",
    "get_trial_param", "get_trial_id_from_study_id_trial_number", "get_trial", "_get_trials",
    "_get_best_trial_id", "_get_stale_trial_ids", "set_study_user_attr", "set_study_system_attr",
    "_set_trial_param", "set_trial_intermediate_value", "set_trial_user_attr", "set_trial_system_attr",
)
#: Retried with a check first (methods of :class:`RetryingRDBStorage`).
CHECKED = ("create_new_study", "delete_study", "_create_new_trial", "set_trial_state_values")
#: Not retried: the heartbeat thread's call (a missed beat is made up by the next one, and the
#: thread must not hold the outage budget the main thread counts).
NOT_RETRIED = ("record_heartbeat",)
#: RDBStorage methods that only call the ones above.
DELEGATING = ("create_new_trial", "set_trial_param", "get_all_trials", "get_best_trial")

for _name in IDEMPOTENT:
    setattr(RetryingRDBStorage, _name, _retried(_name))


def gave_up(study: Any) -> Optional[StorageUnavailableError]:
    """The outage that made ``study``'s storage (under Optuna's cache) give up (:attr:`RetryingRDBStorage.gave_up`),
    or ``None``."""
    storage = storage_backend(study)
    return storage.gave_up if isinstance(storage, RetryingRDBStorage) else None

