"""The study handle of a trial group's first rank in groups other than 0: :class:`RemoteStudy`, requests to global
rank 0's :class:`._study_service.StudyService` through torchrun's store, and :class:`StudyTrial`, the
``optuna.Trial`` its task handle calls. Every reply comes within ``rank_timeout``; a long wait (the set-up, refit
runs, the results) lasts until it is over (:mod:`.._comm._long_waits`).

Optuna's artifact API gets a :class:`ForwardedTrial`: ``optuna.artifacts.upload_artifact(study_or_trial=trial)`` and
``get_all_artifact_meta(trial)`` use only the trial's ``storage`` (``set_trial_system_attr``,
``get_trial_system_attrs``) and ``_trial_id`` (optuna/artifacts/_upload.py and _list_artifact_meta.py, Optuna 4-5),
so its ``storage`` sends those calls to global rank 0's study service, for this trial only (case C53, optuna#6015);
the artifact's bytes are written by the caller's own artifact store.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import time
from typing import Any, Callable, Sequence

import optuna

from .._comm import _wire
from .._comm._long_waits import wait_for_results, wait_until
from .._errors import PeerLostError, RankTimeoutError, RemoteError
from ._agree import Verdict
from ._messages import WAIT, Command, Launch, Setup, TrialPayload
from ._study_service import TRIAL_CALLS

log = logging.getLogger(__name__)


def ask_wait_s(rank_timeout_s: float) -> float:
    """Seconds a trial group's first rank waits for an ask rank 0 holds before it orders its ranks round the loop
    (:data:`._messages.WAIT`): a third of ``rank_timeout``, within 0.5 to 10 s, well inside the broadcast's timeout."""
    return min(max(rank_timeout_s / 3, 0.5), 10.0)


class RemoteStudy:
    """Requests to rank 0's service. ``world_store``: torchrun's store under this attempt's prefix; ``timeout_s``:
    seconds a reply may take (``hydra.sweeper.rank_timeout``); ``pauses``: an ask may wait for another group's
    trial to pause (:meth:`next_command`)."""

    def __init__(self, world_store: Any, group: int, timeout_s: float, pauses: bool = False) -> None:
        from datetime import timedelta

        self.group = group
        self.pauses = pauses
        self._asked: tuple[int, float] | None = None  # the ask still awaiting its answer: (request, sent at)
        self.timeout_s = float(timeout_s)
        self.sweep_dir = ""
        self._started = False  # rank 0's set-up reached this group without an error
        self._look = world_store.clone()  # long waits (this thread), apart from the request client
        self._store = world_store.clone()
        self._store.set_timeout(timedelta(seconds=self.timeout_s))
        self._seq = 0

    def _call(self, name: str, *args: Any, trial: int | None = None, long: bool = False) -> Any:
        """One request to rank 0 and its reply (raised here when rank 0 raised); ``RankTimeoutError`` when none
        comes within ``rank_timeout`` (a ``long`` call's may take as long as the other groups' trials)."""
        start = time.monotonic()
        what = f"{name}" + (f" for trial {trial}" if trial is not None else "")
        seq = self._send(name, *args, what=what)
        if long:
            wait_until(lambda: self._look.queue_len(_wire.reply_queue(self.group)) > 0, self._who, what)
        return self._receive(seq, what, start)

    def _send(self, name: str, *args: Any, what: str = "") -> int:
        """Queue request ``name`` for rank 0's service; its number (``RankTimeoutError``: the store refused it)."""
        self._seq += 1
        try:
            self._store.queue_push(_wire.REQUEST_QUEUE, pickle.dumps((self.group, self._seq, name, args)))
        except Exception as e:
            raise RankTimeoutError(f"trial group {self.group}'s first rank could not send {what or name} to global "
                                   f"rank 0 through torchrun's store ({type(e).__name__}: {e})") from e
        return self._seq

    def _receive(self, seq: int, what: str, start: float) -> Any:
        """The reply to request ``seq`` (raised here when rank 0 raised); ``RankTimeoutError`` when none comes within
        ``rank_timeout`` or another request's comes."""
        try:
            raw = self._store.queue_pop(_wire.reply_queue(self.group))
        except (RankTimeoutError, PeerLostError):
            raise
        except Exception as e:
            raise RankTimeoutError(
                f"trial group {self.group}'s first rank waited {time.monotonic() - start:.1f} s (limit "
                f"{self.timeout_s:g} s) for global rank 0's answer to {what} ({type(e).__name__}: {e}). Global rank "
                "0 owns the study for every trial group: see its log; raise hydra.sweeper.rank_timeout if it is busy."
            ) from e
        got_seq, kind, value = pickle.loads(raw)
        if got_seq != seq:
            raise RankTimeoutError(f"trial group {self.group}: global rank 0 answered request {got_seq} where {seq} "
                                   "was awaited (an earlier reply came after its timeout)")
        if kind == "error":
            raise value.to_exception(wide=True)
        return value

    @property
    def _who(self) -> str:
        return f"trial group {self.group}'s first rank"

    def setup_message(self, failure: RemoteError | None = None) -> Setup:
        """Rank 0's :class:`Setup` from the store (rank 0 opens the study first)."""
        store = self._look
        wait_until(lambda: bool(store.check([_wire.SETUP])), self._who, "the sweep's set-up")
        setup: Setup = pickle.loads(store.get(_wire.SETUP))
        self.sweep_dir = str(setup.sweep_dir or "")
        self._started = setup.error is None
        return setup

    def next_command(self) -> Command:
        """Rank 0's next round for this group. Under a scheduler that pauses trials, rank 0 may hold the answer:
        after :func:`ask_wait_s` this returns :data:`._messages.WAIT`, and the next call waits for the same answer."""
        if not self.pauses:
            return self._call("next")
        if self._asked is None:
            self._asked = (self._send("next"), time.monotonic())
        seq, start = self._asked
        end = time.monotonic() + ask_wait_s(self.timeout_s)
        while self._look.queue_len(_wire.reply_queue(self.group)) == 0:
            if time.monotonic() >= end:
                return WAIT
            time.sleep(0.05)
        self._asked = None
        return self._receive(seq, "next", start)

    def launch(self, payloads: Sequence[TrialPayload]) -> Launch:
        return Launch.of(payloads, optuna_trials={p.number: StudyTrial(self, p.number) for p in payloads})

    def tell(self, verdicts: Sequence[Verdict]) -> None:
        self._call("tell", tuple(verdicts), trial=verdicts[0].number if verdicts else None)

    def abandon_open(self, why: str, *, retry: bool = True, everyone: bool = False, signalled: bool = False) -> None:
        """Ask rank 0 to close this group's open trials; rank 0 closes every group's when it leaves anyway, so a
        rank 0 that does not answer is only logged. ``signalled`` (a signal reaches every rank): nothing is asked.
        ``everyone`` is rank 0's alone."""
        if signalled:
            log.info("trial group %d leaves at once (%s): global rank 0 closes its open trial", self.group, why)
            return
        try:
            self._call("abandon", why, retry)
        except RankTimeoutError as e:
            log.warning("trial group %d could not have its open trial closed (%s); global rank 0 closes it when "
                        "it leaves, or a restarted launch does", self.group, e)

    def trial_call(self, number: int, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._call("trial_call", number, name, args, kwargs, trial=number)

    def refit_next(self) -> Command:
        return self._call("refit_next", long=True)

    def refit_record(self, payload: TrialPayload, verdict: Verdict) -> None:
        self._call("refit_record", payload, verdict, trial=payload.number)

    def finish(self, why: str, *, wait: bool = True, wait_s: float | None = None) -> None:
        """Tell rank 0 this group left, then wait until rank 0 wrote the results (``wait=False``: leave at
        once, this rank was interrupted). ``wait_s`` is rank 0's (see :meth:`LocalStudy.finish`)."""
        if self._started and wait:  # after a failed set-up rank 0 serves nothing and writes no results
            with contextlib.suppress(RankTimeoutError):
                self._call("done", why)
            wait_for_results(self._look, self._who)


class StudyTrial:
    """The ``optuna.Trial`` a trial group's task handle (``RankTrial`` on the group's first rank) calls:
    each call runs on global rank 0's trial through the group's :class:`RemoteStudy`."""

    def __init__(self, study: RemoteStudy, number: int) -> None:
        self._study = study
        self.number = number

    @property
    def params(self) -> dict:
        return dict(self._study.trial_call(self.number, "params"))

    def optuna_trial(self) -> Any:
        """An ``optuna.Trial`` for Optuna's artifact API (:class:`ForwardedTrial`, case C53)."""
        trial_id = self._study.trial_call(self.number, "trial_id")
        return ForwardedTrial(self.number, trial_id, lambda name, *args: self._study.trial_call(self.number, name, *args))

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name not in TRIAL_CALLS or name == "trial_id":
            raise AttributeError(name)
        return lambda *args, **kwargs: self._study.trial_call(self.number, name, *args, **kwargs)


#: The storage calls of Optuna's artifact API, forwarded to global rank 0 (``storage.<name>`` trial calls).
ARTIFACT_STORAGE_CALLS = ("set_trial_system_attr", "get_trial_system_attrs")


class ForwardedStorage:
    """The calls of :data:`ARTIFACT_STORAGE_CALLS` on trial ``trial_id`` (the only id accepted); ``call(name,
    *args)`` runs ``storage.<name>(trial_id, *args)`` on global rank 0 and returns its result."""

    def __init__(self, trial_id: int, call: Callable[..., Any]) -> None:
        self._trial_id = int(trial_id)
        self._call = call

    def _check(self, trial_id: int) -> None:
        if int(trial_id) != self._trial_id:
            raise ValueError(f"this trial's storage forwards calls on its own trial (id {self._trial_id}) only, "
                             f"not on trial id {trial_id}")

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        """``BaseStorage.set_trial_system_attr`` of this trial, on global rank 0."""
        self._check(trial_id)
        self._call("storage.set_trial_system_attr", key, value)

    def get_trial_system_attrs(self, trial_id: int) -> dict[str, Any]:
        """``BaseStorage.get_trial_system_attrs`` of this trial, on global rank 0."""
        self._check(trial_id)
        return dict(self._call("storage.get_trial_system_attrs"))

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"a trial group's trial forwards only Optuna's artifact calls {ARTIFACT_STORAGE_CALLS} to global rank 0, "
            f"not storage.{name}: report, prune and suggest through current_trial()")


class ForwardedTrial(optuna.trial.Trial):
    """An ``optuna.Trial`` for Optuna's artifact API whose ``storage`` is a :class:`ForwardedStorage`; only
    ``number``, ``storage`` and ``_trial_id`` are set (``optuna.Trial.__init__`` would read the study)."""

    def __init__(self, number: int, trial_id: int, call: Callable[..., Any]) -> None:  # noqa: D107 (class docstring)
        self._number = int(number)
        self._trial_id = int(trial_id)
        self.storage = ForwardedStorage(trial_id, call)
        self.study = None

    @property
    def number(self) -> int:
        """The trial's number."""
        return self._number

    def __repr__(self) -> str:
        return f"ForwardedTrial(number={self._number}, trial_id={self._trial_id})"
