"""Who talks to the study: one :class:`StudyService` on global rank 0, one study handle per trial group.

Global rank 0 alone opens the study, for the whole launch (docs/design.md, "One sampler"). The service
holds the :class:`._driver.Driver` and answers each trial group's first rank, one request at a time:

- the whole world as one group (``n_jobs=1`` under torchrun, or world size 1): rank 0 calls the service
  in-process through :class:`LocalStudy`; nothing else runs;
- ``n_jobs=K`` trial groups inside the world (:mod:`._trial_groups`): group 0's first rank *is* global
  rank 0 and uses :class:`LocalStudy` too; the first rank of every other group uses :class:`RemoteStudy`,
  whose requests travel through torchrun's store (``queue_push``/``queue_pop`` of ``torch.distributed.Store``)
  to a daemon thread of the service that serves them under the service's lock. So asks are serialised in
  one process (the budget is exact: ``n_trials=7`` with 2 groups asks 7 trials; TPE's constant liar sees
  every running trial), and the default SQLite storage has one writer process, whatever ``n_jobs`` is.

What a group asks: the next round (:meth:`StudyService.next`), the tell of its verdicts, closing its open
trials, its task's trial calls (``report``, ``should_prune``, ``suggest_*``, ``set_user_attr``), refit
runs once every group's search is over, and "done". Every wait is bounded: a reply within
``rank_timeout``; a long wait (refit runs, the results) as long as the other side's liveness counter in
the store moves (:data:`ALIVE_S`), at most ``rank_timeout`` without a beat.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import threading
import time
from typing import Any, Callable, Sequence

from .._errors import PeerLostError, RankTimeoutError, RemoteError
from ._agree import Verdict
from ._launch import Launch
from ._messages import Command, CommandKind, Setup
from ._payload import TrialPayload
from ._refit import RefitQueue, RefitRuns

log = logging.getLogger(__name__)

#: Seconds between two beats of a liveness counter (``alive/<group>`` in the launch's store).
ALIVE_S = 2.0
#: Seconds between two looks while a long wait (refit runs, results) is not over.
POLL_S = 0.2
#: The ``optuna.Trial`` calls a task's trial handle makes on another group's behalf (:class:`StudyTrial`).
TRIAL_CALLS = ("report", "should_prune", "suggest_float", "suggest_int", "suggest_categorical", "set_user_attr",
               "params")
_STOP_SERVING = "stop serving"
#: The requests another group's first rank may send (:meth:`RemoteStudy._call`), by method name.
REQUESTS = ("next", "tell", "abandon", "trial_call", "refit_next", "refit_record", "done", "poke")
#: The launch's store key rank 0 sets once the results are written (every other rank may leave then).
RESULTS_KEY = "results_written"
SETUP_KEY = "setup"


class StudyService:
    """The study's one owner for a launch, on global rank 0 (module docstring).

    Args:
        driver: the sweep's driver, or ``None`` when rank 0's set-up failed (every request then answers STOP).
        n_groups: trial groups of the launch (1: the whole world).
        rank_timeout_s: ``hydra.sweeper.rank_timeout``: a group silent that long is taken as gone.
        world_store: torchrun's store under this attempt's prefix (``None`` with one group).
    """

    def __init__(self, driver: Any, n_groups: int = 1, rank_timeout_s: float = 600.0, world_store: Any = None) -> None:
        self.driver = driver
        self.n_groups = int(n_groups)
        self.rank_timeout_s = float(rank_timeout_s)
        self.world_store = world_store
        self.cond = threading.Condition(threading.RLock())
        self._owned: dict[int, set[int]] = {g: set() for g in range(self.n_groups)}
        self._beats: dict[int, Any] = {}  # group -> the open Heartbeat of its round (groups other than 0)
        self._done: dict[int, str] = {}  # group -> why it left
        self._searching = set(range(self.n_groups))  # groups still in their search loop
        self._refit: RefitQueue | None = None
        self._pending: list[tuple[int, int]] = []  # deferred refit requests: (group, request number)
        self.stopping: str | None = None  # why the launch stops (rank 0 unwinds): every later ask gets STOP
        self._thread: threading.Thread | None = None
        self._alive: _Beat | None = None
        self._store: Any = None  # the serving thread's own client
        self._serving = threading.Event()  # cleared by stop()

    # --- the requests (every one under the lock) -------------------------------------------------------

    def next(self, group: int) -> Command:
        """The group's next round (:meth:`._driver.Driver.next_command`), its trials recorded as the group's."""
        with self.cond:
            if self.driver is None or self.stopping:
                return Command(CommandKind.STOP, error=RemoteError(
                    "SweepStoppedError", f"the launch is stopping ({self.stopping or 'rank 0 could not start'})", 0))
            command = self.driver.next_command(group if self.n_groups > 1 else None)
            numbers = [p.number for p in command.payloads]
            self._owned[group].update(numbers)
            if numbers and group != 0:  # group 0's runner holds its own round's heartbeat (Launch)
                beat = self.driver.heartbeat(numbers)
                beat.__enter__()
                self._beats[group] = beat
            return command

    def tell(self, group: int, verdicts: Sequence[Verdict]) -> None:
        """Tell the group's verdicts (:meth:`._driver.Driver.tell`); a trial closed while it ran (the launch
        stops, :meth:`abandon`) keeps the state it was closed with."""
        with self.cond:
            self._end_beat(group)
            open_ = [v for v in verdicts if v.number in self._owned[group]]
            for v in verdicts:
                if v not in open_:
                    log.info("trial %d ended %s after it was closed (the launch stops); it stays closed", v.number,
                             v.state.name)
            self._owned[group].difference_update(v.number for v in verdicts)
            if self.driver is not None and open_:
                self.driver.tell(open_, group=group if self.n_groups > 1 else None)

    def abandon(self, group: int | None, why: str, retry: bool = True) -> None:
        """Close the open trials of ``group`` (``None``: of every group) (:meth:`._driver.Driver.abandon_open`)."""
        with self.cond:
            groups = list(self._owned) if group is None else [group]
            numbers = {n for g in groups for n in self._owned[g]}
            for g in groups:
                self._end_beat(g)
                self._owned[g].clear()
            if self.driver is not None and numbers:
                self.driver.abandon_open(why, retry=retry, numbers=numbers)

    def trial_call(self, group: int, number: int, name: str, args: tuple, kwargs: dict) -> Any:
        """``optuna.Trial.<name>(*args, **kwargs)`` on the group's open trial ``number`` (``params``: the attribute).

        Raises:
            KeyError: the trial is not this group's open trial.
            ValueError: ``name`` is not one of :data:`TRIAL_CALLS`.
            Whatever Optuna raises (``ValueError`` for a bad ``suggest_*`` range...).
        """
        if name not in TRIAL_CALLS:
            raise ValueError(f"{name!r} is not a trial call the sweeper forwards ({TRIAL_CALLS})")
        with self.cond:
            if number not in self._owned.get(group, ()):
                raise KeyError(f"trial {number} is not an open trial of trial group {group}")
            trial = self.driver.asked_trial(number)
        attr = getattr(trial, name)
        return attr if name == "params" else attr(*args, **kwargs)

    def refit_next(self, group: int) -> Command | None:
        """The group's next refit run; ``None`` until every group's search is over and while runs handed to
        other groups may still fail (ask again after the next state change)."""
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
        """Keep one refit run's outcome (:meth:`._refit.RefitQueue.record`)."""
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

    def poke(self, group: int) -> None:
        """Nothing: a request that makes the serving thread look at its deferred requests again."""

    def _end_beat(self, group: int) -> None:
        beat = self._beats.pop(group, None)
        if beat is not None:
            beat.__exit__(None, None, None)

    # --- rank 0's own waits -------------------------------------------------------------------------------

    def wait(self, ready: Callable[[], Any]) -> Any:
        """Wait (rank 0's main thread) until ``ready()`` returns something other than ``None``, while the
        serving thread answers the other groups; a group silent for ``rank_timeout`` is taken as gone."""
        with self.cond:
            while True:
                got = ready()
                if got is not None:
                    return got
                self.cond.wait(POLL_S)
                self._forget_silent_groups()

    def all_done(self) -> bool | None:
        """``True`` once every group left (for :meth:`wait`), else ``None``."""
        return True if len(self._done) >= self.n_groups else None

    def _forget_silent_groups(self) -> None:
        if self._alive is None:
            return
        for g in range(1, self.n_groups):
            if g not in self._done and self._alive.silent_s(g) > self.rank_timeout_s:
                log.error("trial group %d gave no sign of life for %.0f s (rank_timeout): its open trials are closed "
                          "and rank 0 stops waiting for it", g, self._alive.silent_s(g))
                self.done(g, "gave no sign of life")

    # --- serving the other groups (trial groups only) -----------------------------------------------------

    def publish_setup(self, setup: Setup) -> None:
        """Every other group's first rank reads rank 0's :class:`Setup` (or set-up error) from the store."""
        if self.world_store is not None:
            self.world_store.set(SETUP_KEY, pickle.dumps(setup))

    def start(self) -> None:
        """Start the serving thread and rank 0's liveness beat (trial groups only)."""
        if self.world_store is None or self.n_groups <= 1:
            return
        from datetime import timedelta

        self._store = self.world_store.clone()
        self._store.set_timeout(timedelta(days=1))  # stopped by a request of its own (stop), never by a timeout
        self._alive = _Beat(self.world_store.clone(), 0, self.n_groups)
        self._alive.start()
        self._serving.set()
        self._thread = threading.Thread(target=self._serve, name="ds-optuna-study-service", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """After a state change made by rank 0's own group: let the serving thread answer deferred requests."""
        if self._thread is not None and self._serving.is_set():
            with contextlib.suppress(Exception):
                self.world_store.queue_push("rpc/req", pickle.dumps((0, -1, "poke", ())))

    def stop(self) -> None:
        """Stop the serving thread and the liveness beat. Never raises."""
        if self._thread is not None:
            self._serving.clear()
            with contextlib.suppress(Exception):
                self.world_store.queue_push("rpc/req", pickle.dumps((-1, -1, _STOP_SERVING, ())))
            self._thread.join(timeout=10)
        if self._alive is not None:
            self._alive.stop()

    def _serve(self) -> None:
        while True:
            try:
                group, seq, name, args = pickle.loads(self._store.queue_pop("rpc/req"))
            except Exception:  # the store went away (torchrun is stopping the launch), or a day without requests
                log.debug("the study service's look at its requests failed", exc_info=True)
                if not self._serving.wait(0) or not self._serving.is_set():
                    return
                time.sleep(1.0)
                continue
            if name == _STOP_SERVING:
                return
            if name == "refit_next":
                self._pending.append((group, seq))
            elif name != "poke":
                try:
                    if name not in REQUESTS:
                        raise ValueError(f"unknown request {name!r}")
                    reply: tuple = ("ok", getattr(self, name)(group, *args))
                except BaseException as e:  # noqa: BLE001 - the group raises it
                    reply = ("error", RemoteError.from_exception(e, 0))
                self._reply(group, seq, reply)
            self._flush_refits()

    def _flush_refits(self) -> None:
        """Answer every deferred refit request that can be answered now."""
        for group, seq in list(self._pending):
            try:
                command = self.refit_next(group)
            except BaseException as e:  # noqa: BLE001
                command = Command(CommandKind.STOP, error=RemoteError.from_exception(e, 0))
            if command is None:
                continue
            self._pending.remove((group, seq))
            self._reply(group, seq, ("ok", command))

    def _reply(self, group: int, seq: int, reply: tuple) -> None:
        try:
            self._store.queue_push(f"rpc/rep/{group}", pickle.dumps((seq, *reply)))
        except Exception:  # that group's rank gives up on its own timeout, naming rank 0
            log.warning("rank 0 could not answer trial group %d", group, exc_info=True)

    def mark_results_written(self) -> None:
        """Let every other rank of the launch leave (:func:`wait_for_results`)."""
        if self.world_store is not None:
            with contextlib.suppress(Exception):
                self.world_store.set(RESULTS_KEY, "1")


class LocalStudy:
    """Rank 0's own handle on the study (the whole world, or trial group 0): in-process calls of the service.

    The loop in ``_sweep.py`` uses this and :class:`RemoteStudy` alike (``study``, on a group's first rank).
    """

    def __init__(self, service: StudyService, group: int = 0) -> None:
        self.service = service
        self.group = group

    @property
    def driver(self) -> Any:
        return self.service.driver

    @property
    def sweep_dir(self) -> str:
        return self.driver.sweep_dir if self.driver is not None else ""

    def setup_message(self, failure: RemoteError | None = None) -> Setup:
        """Rank 0's :class:`Setup` (or ``failure``), also published to the other trial groups."""
        setup = self.driver.setup_message() if failure is None and self.driver is not None else Setup(None, error=failure)
        self.service.publish_setup(setup)
        if failure is None:
            self.service.start()
        return setup

    def next_command(self) -> Command:
        return self.service.next(self.group)

    def launch(self, payloads: Sequence[TrialPayload], watch: Any) -> Launch:
        return self.driver.launch(payloads, watch)

    def tell(self, verdicts: Sequence[Verdict]) -> None:
        self.service.tell(self.group, verdicts)

    def abandon_open(self, why: str, *, retry: bool = True, everyone: bool = False) -> None:
        """Close this group's open trials. With trial groups the launch then stops: every other group gets STOP
        at its next ask (its running trial ends first, :meth:`finish` waits for it). ``everyone``: this
        process leaves now (SIGTERM, a signal, the peer watch ending the group), so every group's open trial
        is closed too, as interrupted (re-queued with ``retry_failed_trials``)."""
        self.service.abandon(self.group, why, retry)
        if self.service.n_groups > 1:
            self.service.stopping = self.service.stopping or why
            if everyone:
                self.service.abandon(None, f"the launch stops: {why}", True)

    def refit_next(self) -> Command:
        def ready() -> Command | None:
            command = self.service.refit_next(self.group)
            self.service.wake()  # other groups' deferred requests may be answerable now
            return command

        return self.service.wait(ready)

    def refit_record(self, payload: TrialPayload, verdict: Verdict) -> None:
        self.service.refit_record(self.group, payload, verdict)
        self.service.wake()

    def finish(self, why: str, *, wait: bool = True) -> None:
        """Wait until every other group left (trial groups), then write the results and let every rank
        leave. A signal while waiting closes what is still open and writes the results all the same.

        ``wait=False`` (this rank was interrupted): close every group's open trials and write the results now.
        """
        service = self.service
        try:
            service.done(self.group, why)
            service.wake()
            if not wait:
                service.stopping = service.stopping or why
                service.abandon(None, f"the launch stops: {why}", True)
            elif self.driver is not None:  # a set-up that failed reached every group, none will say done
                service.wait(service.all_done)
        except BaseException:
            service.stopping = service.stopping or "rank 0 was interrupted"
            with contextlib.suppress(Exception):
                service.abandon(None, "rank 0 stops the launch", True)
            raise
        finally:
            if self.driver is not None:
                self.driver.finish()
            service.mark_results_written()
            service.stop()


class RemoteStudy:
    """The study handle of a trial group's first rank (groups other than 0): requests to rank 0's service.

    Args:
        world_store: torchrun's store under this attempt's prefix.
        group: this trial group.
        timeout_s: seconds a reply may take (``hydra.sweeper.rank_timeout``).
    """

    def __init__(self, world_store: Any, group: int, timeout_s: float) -> None:
        from datetime import timedelta

        self.group = group
        self.timeout_s = float(timeout_s)
        self.sweep_dir = ""
        self._started = False  # rank 0's set-up reached this group without an error
        self._look = world_store.clone()  # long waits (this thread), apart from the request client
        self._store = world_store.clone()
        self._store.set_timeout(timedelta(seconds=self.timeout_s))
        self._seq = 0
        self._alive = _Beat(world_store.clone(), group, group + 1)
        self._alive.start()

    def _call(self, name: str, *args: Any, trial: int | None = None, long: bool = False) -> Any:
        """One request to rank 0 and its reply (raised on this rank when rank 0 raised).

        Raises:
            RankTimeoutError: no reply within ``rank_timeout``; ``PeerLostError``: rank 0's beat stopped.
        """
        self._seq += 1
        seq = self._seq
        start = time.monotonic()
        what = f"{name}" + (f" for trial {trial}" if trial is not None else "")
        try:
            self._store.queue_push("rpc/req", pickle.dumps((self.group, seq, name, args)))
            if long:
                self._wait_long(lambda: self._look.queue_len(f"rpc/rep/{self.group}") > 0, what)
            raw = self._store.queue_pop(f"rpc/rep/{self.group}")
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

    def _wait_long(self, ready: Callable[[], bool], what: str) -> None:
        """Wait while rank 0's liveness counter moves (a long wait: other groups still run their trials)."""
        wait_while_alive(self._look, ready, self.timeout_s, f"trial group {self.group}'s first rank", what)

    def setup_message(self, failure: RemoteError | None = None) -> Setup:
        """Rank 0's :class:`Setup` from the store (rank 0 opens the study first: as long as rank 0 lives)."""
        store = self._look
        self._wait_long(lambda: bool(store.check([SETUP_KEY])), "the sweep's set-up")
        setup: Setup = pickle.loads(store.get(SETUP_KEY))
        self.sweep_dir = str(setup.sweep_dir or "")
        self._started = setup.error is None
        return setup

    def next_command(self) -> Command:
        return self._call("next")

    def launch(self, payloads: Sequence[TrialPayload], watch: Any) -> Launch:
        return Launch.of(payloads, optuna_trials={p.number: StudyTrial(self, p.number) for p in payloads}, watch=watch)

    def tell(self, verdicts: Sequence[Verdict]) -> None:
        self._call("tell", tuple(verdicts), trial=verdicts[0].number if verdicts else None)

    def abandon_open(self, why: str, *, retry: bool = True, everyone: bool = False) -> None:
        """Ask rank 0 to close this group's open trials; rank 0 closes every group's when it leaves anyway,
        so a rank 0 that does not answer is only logged. (``everyone`` is rank 0's alone.)"""
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

    def finish(self, why: str, *, wait: bool = True) -> None:
        """Tell rank 0 this group left, then wait until rank 0 wrote the results (as long as it lives;
        ``wait=False``: leave at once, this rank was interrupted)."""
        try:
            if self._started:  # after a failed set-up rank 0 serves nothing and writes no results
                with contextlib.suppress(RankTimeoutError):
                    self._call("done", why)
                if wait:
                    wait_for_results(self._look, self.timeout_s, f"trial group {self.group}'s first rank")
        finally:
            self._alive.stop()


class StudyTrial:
    """The ``optuna.Trial`` a trial group's task handle (``RankTrial`` on the group's first rank) calls:
    each call runs on global rank 0's trial through the group's :class:`RemoteStudy`."""

    def __init__(self, study: RemoteStudy, number: int) -> None:
        self._study = study
        self.number = number

    @property
    def params(self) -> dict:
        return dict(self._study.trial_call(self.number, "params"))

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name not in TRIAL_CALLS:
            raise AttributeError(name)
        return lambda *args, **kwargs: self._study.trial_call(self.number, name, *args, **kwargs)


def wait_while_alive(store: Any, ready: Callable[[], bool], timeout_s: float, who: str, what: str) -> None:
    """Poll ``ready()`` every :data:`POLL_S` s while rank 0's liveness counter (``alive/0``) moves.

    Raises:
        PeerLostError: the counter stood still for ``timeout_s`` seconds (rank 0 is gone or stuck).
    """
    last, moved = None, time.monotonic()
    while not ready():
        beat = int(store.add("alive/0", 0))
        now = time.monotonic()
        if beat != last:
            last, moved = beat, now
        elif now - moved > timeout_s:
            raise PeerLostError(f"{who} waited for {what}, but global rank 0 (the study owner) gave no sign of life "
                                f"for {now - moved:.0f} s (rank_timeout {timeout_s:g} s); see its log")
        time.sleep(POLL_S)


def wait_for_results(store: Any, timeout_s: float, who: str) -> None:
    """Hold this rank until rank 0 wrote the launch's results (trial groups), while rank 0 lives. Never raises."""
    try:
        wait_while_alive(store, lambda: bool(store.check([RESULTS_KEY])), timeout_s, who, "the results")
    except Exception as e:  # leaving matters more than waiting
        log.warning("%s", e)


class _Beat:
    """A daemon thread that bumps the liveness counter ``alive/<group>`` every :data:`ALIVE_S` seconds,
    and reads the others' (``silent_s``)."""

    def __init__(self, store: Any, group: int, n_groups: int) -> None:
        self.store = store
        self.group = group
        self._seen: dict[int, tuple[int, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ds-optuna-alive", daemon=True)
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while True:
            with contextlib.suppress(Exception), self._lock:
                self.store.add(f"alive/{self.group}", 1)
            if self._stop.wait(ALIVE_S):
                return

    def silent_s(self, group: int) -> float:
        """Seconds since ``group``'s counter last moved, as seen by this process's looks."""
        now = time.monotonic()
        try:
            with self._lock:
                beat = int(self.store.add(f"alive/{group}", 0))
        except Exception:
            return 0.0
        last = self._seen.get(group)
        if last is None or last[0] != beat:
            self._seen[group] = (beat, now)
            return 0.0
        return now - last[1]

    def stop(self) -> None:
        self._stop.set()
