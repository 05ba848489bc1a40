"""Global rank 0's :class:`StudyService` with trial groups: the study's one owner for a launch, serving every group.

With ``n_jobs=K`` trial groups (docs/design.md, "One sampler" and "Trial groups") the service holds the
:class:`._driver.Driver` and answers each group's first rank, one request at a time, under its lock: group 0's
in-process, every other group's through torchrun's store (``queue_push``/``queue_pop``) to its daemon thread. So
asks are serialised in one process (the budget is exact; TPE's constant liar sees every running trial).
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import threading
import time
from typing import Any, Callable, Sequence

from .._errors import RemoteError
from .._comm import _wire
from .._comm._long_waits import POLL_S, mark_results_written
from ._agree import Verdict
from ._messages import Command, CommandKind, Setup, TrialPayload
from ._refit import RefitQueue, RefitRuns

log = logging.getLogger(__name__)

#: The ``optuna.Trial`` calls a task's trial handle makes on another group's behalf (``StudyTrial``).
TRIAL_CALLS = ("report", "should_prune", "suggest_float", "suggest_int", "suggest_categorical", "set_user_attr",
               "params", "trial_id")
#: The storage calls of Optuna's artifact API on a group's open trial (``"storage.<name>"`` trial calls, case C53).
STORAGE_CALLS = ("storage.set_trial_system_attr", "storage.get_trial_system_attrs")
_STOP_SERVING = "stop serving"
#: The requests another group's first rank may send (``RemoteStudy._call``), by method name.
REQUESTS = ("next", "tell", "abandon", "trial_call", "refit_next", "refit_record", "done")


class StudyService:
    """The study's one owner for a launch, on global rank 0. ``driver``: ``None`` when rank 0's set-up failed
    (every request then answers STOP); ``world_store``: torchrun's store under this attempt's prefix."""

    def __init__(self, driver: Any, n_groups: int, world_store: Any) -> None:
        self.driver = driver
        self.n_groups = int(n_groups)
        self.world_store = world_store
        self.cond = threading.Condition(threading.RLock())
        self._owned: dict[int, set[int]] = {g: set() for g in range(self.n_groups)}
        self._beats: dict[int, Any] = {}  # group -> the open Heartbeat of its round (groups other than 0)
        self._done: dict[int, str] = {}  # group -> why it left
        self._searching = set(range(self.n_groups))  # groups still in their search loop
        self._refit: RefitQueue | None = None
        self._pending: list[tuple[str, int, int]] = []  # deferred requests: (name, group, request number)
        self._waiting: set[int] = set()  # groups whose ask waits for another group's trial (:meth:`next`)
        self.stopping: str | None = None  # why the launch stops (rank 0 unwinds): every later ask gets STOP
        self._thread: threading.Thread | None = None
        self._store: Any = None  # the serving thread's own client
        self._serving = threading.Event()  # cleared by stop()

    def next(self, group: int) -> Command | None:
        """The group's next round, its trials recorded as the group's; or ``None`` (ask again after the next state
        change) while the budget is spent but another group runs a trial that may pause and be continued
        (:attr:`._messages.Command.waits`): the group waits instead of leaving the population to the others (PBT)."""
        with self.cond:
            if self.driver is None or self.stopping:
                return Command(CommandKind.STOP, error=RemoteError(
                    "SweepStoppedError", f"the launch is stopping ({self.stopping or 'rank 0 could not start'})", 0))
            command = self.driver.next_command(group)
            if command.waits and any(numbers for g, numbers in self._owned.items() if g != group):
                if group not in self._waiting:
                    self._waiting.add(group)
                    log.info("trial group %d waits: %s, but a trial of another group may still pause and be "
                             "continued", group, command.reason)
                return None
            self._waiting.discard(group)
            numbers = [p.number for p in command.payloads]
            self._owned[group].update(numbers)
            if numbers and group != 0:  # group 0's runner holds its own round's heartbeat (Launch)
                beat = self.driver.heartbeat(numbers)
                beat.__enter__()
                self._beats[group] = beat
            return command

    def tell(self, group: int, verdicts: Sequence[Verdict]) -> None:
        """Tell the group's verdicts; a trial closed while it ran (:meth:`abandon`) keeps the state it got then."""
        with self.cond:
            self._end_beat(group)
            open_ = [v for v in verdicts if v.number in self._owned[group]]
            for v in verdicts:
                if v not in open_:
                    log.info("trial %d ended %s after it was closed (the launch stops); it stays closed", v.number,
                             v.state.name)
            self._owned[group].difference_update(v.number for v in verdicts)
            if self.driver is not None and open_:
                self.driver.tell(open_)

    def abandon(self, group: int | None, why: str, retry: bool = True) -> None:
        """Close the open trials of ``group`` (``None``: of every group)."""
        with self.cond:
            groups = list(self._owned) if group is None else [group]
            numbers = {n for g in groups for n in self._owned[g]}
            for g in groups:
                self._end_beat(g)
                self._owned[g].clear()
            if self.driver is not None and numbers:
                self.driver.abandon_open(why, retry=retry, numbers=numbers)

    def trial_call(self, group: int, number: int, name: str, args: tuple, kwargs: dict) -> Any:
        """``optuna.Trial.<name>(*args, **kwargs)`` on the group's open trial ``number`` (``params``: the attribute;
        ``trial_id``: its storage id); ``"storage.<name>"``: ``trial.storage.<name>(trial's id, *args)``.

        Raises:
            KeyError: the trial is not this group's open trial.
            ValueError: ``name`` is not one of :data:`TRIAL_CALLS` or :data:`STORAGE_CALLS`.
            Whatever Optuna raises (``ValueError`` for a bad ``suggest_*`` range...).
        """
        if name not in TRIAL_CALLS and name not in STORAGE_CALLS:
            raise ValueError(f"{name!r} is not a trial call the sweeper forwards ({TRIAL_CALLS + STORAGE_CALLS})")
        with self.cond:
            if number not in self._owned.get(group, ()):
                raise KeyError(f"trial {number} is not an open trial of trial group {group}")
            trial = self.driver.asked_trial(number)
        if name == "trial_id":
            return trial._trial_id
        if name in STORAGE_CALLS:
            return getattr(trial.storage, name.split(".", 1)[1])(trial._trial_id, *args, **kwargs)
        attr = getattr(trial, name)
        return attr if name == "params" else attr(*args, **kwargs)

    def refit_next(self, group: int) -> Command | None:
        """The group's next refit run; ``None`` (ask again later) until every group's search is over and while runs
        handed to other groups may still fail."""
        with self.cond:
            self._searching.discard(group)
            self.cond.notify_all()
            if self._searching:
                return None
            if self._refit is None:
                if self.driver is None:
                    return Command(CommandKind.STOP, reason="nothing to refit")
                self._refit = RefitQueue(RefitRuns(self.driver))
            return self._refit.next()

    def refit_record(self, group: int, payload: TrialPayload, verdict: Verdict) -> None:
        """Keep one refit run's outcome."""
        with self.cond:
            if self._refit is not None:
                self._refit.record(payload, verdict)
            self.cond.notify_all()

    def done(self, group: int, why: str) -> None:
        """The group left the sweep (``why``: its leaving record); its open trials are closed."""
        with self.cond:
            if self._owned.get(group):
                self.abandon(group, f"trial group {group} left the sweep ({why})")
            self._done[group] = why
            self._searching.discard(group)
            self.cond.notify_all()

    def _end_beat(self, group: int) -> None:
        beat = self._beats.pop(group, None)
        if beat is not None:
            beat.__exit__(None, None, None)

    def wait(self, ready: Callable[[], Any]) -> Any:
        """Wait (rank 0's main thread) until ``ready()`` returns something other than ``None``, while the
        serving thread answers the other groups."""
        with self.cond:
            while True:
                got = ready()
                if got is not None:
                    return got
                self.cond.wait(POLL_S)

    def done_reasons(self) -> dict[int, str]:
        """``{group: why it left}`` of the groups that said done."""
        with self.cond:
            return dict(self._done)

    def all_done(self) -> bool | None:
        """``True`` once every group left (for :meth:`wait`), else ``None``."""
        return True if len(self._done) >= self.n_groups else None

    def publish_setup(self, setup: Setup) -> None:
        """Put rank 0's :class:`Setup` in the store for every other group's first rank."""
        self.world_store.set(_wire.SETUP, pickle.dumps(setup))

    def start(self) -> None:
        """Start the serving thread."""
        from datetime import timedelta

        from ._joblog import remember_sweep_console

        self._store = self.world_store.clone()
        self._store.set_timeout(timedelta(days=1))  # stopped by a request of its own (stop), never by a timeout
        remember_sweep_console()  # the service's lines keep the sweep's format while rank 0's own job runs
        self._serving.set()
        self._thread = threading.Thread(target=self._serve, name="ds-optuna-study-service", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """After a state change made by rank 0's own group: let the serving thread answer deferred requests."""
        if self._thread is not None and self._serving.is_set():
            with contextlib.suppress(Exception):
                self.world_store.queue_push(_wire.REQUEST_QUEUE, pickle.dumps((0, -1, "poke", ())))

    def stop(self) -> None:
        """Stop the serving thread. Never raises."""
        if self._thread is not None:
            self._serving.clear()
            with contextlib.suppress(Exception):
                self.world_store.queue_push(_wire.REQUEST_QUEUE, pickle.dumps((-1, -1, _STOP_SERVING, ())))
            self._thread.join(timeout=10)

    def _serve(self) -> None:
        while True:
            try:
                group, seq, name, args = pickle.loads(self._store.queue_pop(_wire.REQUEST_QUEUE))
            except Exception:  # the store went away (torchrun is stopping the launch), or a day without requests
                log.debug("the study service's look at its requests failed", exc_info=True)
                if not self._serving.wait(0) or not self._serving.is_set():
                    return
                time.sleep(1.0)
                continue
            if name == _STOP_SERVING:
                return
            if name in ("refit_next", "next"):  # answered once they can be (None: not yet)
                self._pending.append((name, group, seq))
            elif name != "poke":  # poke: nothing but a look at the deferred requests
                try:
                    if name not in REQUESTS:
                        raise ValueError(f"unknown request {name!r}")
                    reply: tuple = ("ok", getattr(self, name)(group, *args))
                except BaseException as e:  # noqa: BLE001 - the group raises it
                    reply = ("error", RemoteError.from_exception(e, 0))
                self._reply(group, seq, reply)
            self._flush_pending()

    def _flush_pending(self) -> None:
        """Answer every deferred request (``next``, ``refit_next``) that can be answered now."""
        for name, group, seq in list(self._pending):
            try:
                command = getattr(self, name)(group)
            except BaseException as e:  # noqa: BLE001
                command = Command(CommandKind.STOP, error=RemoteError.from_exception(e, 0))
            if command is None:
                continue
            self._pending.remove((name, group, seq))
            self._reply(group, seq, ("ok", command))

    def _reply(self, group: int, seq: int, reply: tuple) -> None:
        try:
            self._store.queue_push(_wire.reply_queue(group), pickle.dumps((seq, *reply)))
        except Exception:  # that group's rank gives up on its own timeout, naming rank 0
            log.warning("rank 0 could not answer trial group %d", group, exc_info=True)

    def mark_results_written(self) -> None:
        """Let every other rank of the launch leave (:func:`wait_for_results`)."""
        mark_results_written(self.world_store)
