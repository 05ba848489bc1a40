"""Every rank: learn within seconds that a peer's task failed, and end a group that cannot go on (case C45).

A rank whose task raises announces it at once in torchrun's store, outside the training group (which may
be NCCL, and busy): key ``ds_optuna/peer_watch_<attempt>/<round>/failed/<rank>`` (``<round>``:
``trial<first trial number>``, or ``refit<trial number>`` for a refit run) holds
``{"rank", "trial", "run", "error", "time"}``. While a round runs (the task and the gather of the
results after it), a daemon thread on every rank polls the store every :data:`POLL_S` seconds, logs a
peer's failure as soon as it sees it ("rank 1 failed trial 3: ValueError: ...; rank 0 is still in the
task"), and then:

- if this rank leaves the task within :data:`GRACE_S` seconds (its own collective raised, or it failed
  too, or the task had nothing left to wait for), nothing else happens: the ranks meet in the gather of
  the results and the trial is told FAIL as before;
- if it is still in the same task after :data:`GRACE_S` seconds, it is blocked (in the training framework's
  gradient all-reduce, typically: a peer that left the task never joins it, and only the training group's
  timeout, ``rank_timeout``, would release it). It marks the round ended in the store; every rank's watcher
  then ends the group: rank 0 closes the round's open trial(s) in the study (FAIL: the task raised, so the
  same params would fail again; :func:`.._study._abandon.abandon` with no re-queue) and logs the resume command
  on its own line, the other ranks wait up to :data:`CLOSE_WAIT_S` seconds for rank 0 to say it has
  closed them, and every rank leaves with status 1 through :func:`._process.exit_cleanly` (logs flushed,
  ``os._exit``). ``torchrun --max-restarts N`` then restarts the group, which resumes the study.

Why :data:`GRACE_S` is 10 s: ranks that fail the same way (a bad hyperparameter raising on each rank)
raise within a few seconds of each other, also on a loaded machine; a rank still inside the task 10 s after
a peer left it is, in practice, waiting for that peer. A group restart costs a few seconds of start-up; the
wait it replaces is ``rank_timeout`` (600 s by default), after which the group must restart anyway (gloo
cannot reuse a group after a timeout; NCCL's watchdog tears the process down).

A store that stops answering while no signal arrived means torchrun's agent is gone (case C55): the watcher
confirms it (:func:`.._comm._launcher.store_is_gone`) and stops the sweep with SIGTERM, as torchrun would have.

The watcher uses its own client of torchrun's store (``MASTER_ADDR``/``MASTER_PORT``), so it never
shares a connection with the control plane's calls in the main thread. With world size 1, or without a
store the sweeper made (the task's own default group), nothing runs: :data:`NO_WATCH`.

No torch at module level: the store client is made in :meth:`PeerChannel.open`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Iterator

from .._comm._launcher import launcher_gone, stop_for_lost_launcher, store_is_gone
from .._comm._whoami import rank_label
from .._comm import _wire

log = logging.getLogger(__name__)

#: Seconds a rank may stay in a task after a peer's task failed before the group is ended.
GRACE_S = 10.0
#: Seconds between two looks at the store.
POLL_S = 0.5
#: Seconds the other ranks wait for rank 0 to close the trial before they exit anyway.
CLOSE_WAIT_S = 15.0
#: Seconds after which a rank that started ending the group exits whatever it is doing.
END_LIMIT_S = CLOSE_WAIT_S + 15.0
#: Each rank's exit status when the group is ended after a failure (``128 + signal`` after an interruption).
EXIT_STATUS = 1
#: Seconds a rank may stay in a task after a peer was interrupted (Ctrl-C) before the group is ended: a
#: rank that got the signal too leaves at once; one that stays is blocked in a call the peer left (C41).
INTERRUPT_GRACE_S = 2.0
#: Seconds any single store call of the watcher may take.
STORE_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class PeerFailure:
    """One rank's announcement that its task failed.

    Attributes:
        rank: the failed rank.
        trial: the trial number whose task failed.
        run: the index of the task call within the round (every rank calls the tasks in the same order:
            one per trial, or one per seed with ``repeats``).
        error: ``"TypeName: first line of the message"``.
        time: the failing rank's ``time.time()`` when it announced (seconds since the epoch).
        signal: the signal number when the rank was interrupted (its ``KeyboardInterrupt`` came from
            SIGINT, Ctrl-C: case C41), else 0.
    """

    rank: int
    trial: int
    run: int
    error: str
    time: float
    signal: int = 0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: bytes | str) -> "PeerFailure":
        data = json.loads(text)
        return cls(int(data["rank"]), int(data["trial"]), int(data["run"]), str(data["error"]), float(data["time"]),
                   int(data.get("signal", 0)))


class PeerChannel:
    """This rank's own client of torchrun's store for failure announcements; one per sweep.

    Build it with :meth:`open`; :meth:`watch` makes one :class:`PeerWatch` per round.

    Args:
        store: a store with ``set``/``get``/``add``/``check``/``wait`` (a ``PrefixStore`` per torchrun attempt).
        rank: this process's global rank.
        world_size: number of ranks.
    """

    def __init__(self, store: Any, rank: int, world_size: int, signal_received: Callable[[], int | None] = lambda: None) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        #: the signal this process received (the sweep's ``SigtermGuard.received``), or ``None``.
        self.signal_received = signal_received

    @classmethod
    def open(cls, ctx: Any, signal_received: Callable[[], int | None] = lambda: None) -> "PeerChannel | None":
        """A channel for ``ctx`` (a :class:`.._comm._ranks.RankComm`), or ``None`` where nothing is watched.

        ``None`` with world size 1, when the sweeper did not create the group itself (``ctx.store`` is
        ``None``), or when the store cannot be reached (logged as a warning; the sweep goes on as
        without the watch: a blocked rank is released by ``rank_timeout``). Never raises.
        """
        if not ctx.distributed or ctx.store is None:
            return None
        try:
            import torch.distributed as dist

            client = dist.TCPStore(
                os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                timeout=timedelta(seconds=STORE_TIMEOUT_S),
            )
            store = dist.PrefixStore(_wire.peer_watch_prefix(ctx.attempt), client)
        except Exception:
            log.warning("rank %d cannot open its own client of torchrun's store: a failure on another rank is "
                        "learned only through rank_timeout", ctx.rank, exc_info=True)
            return None
        return cls(store, ctx.rank, ctx.world_size, signal_received)

    def watch(self, round_key: str, on_end: Callable[[str, int], None] | None) -> "PeerWatch":
        """A :class:`PeerWatch` for one round.

        Args:
            round_key: the round's key in the store, unique in the sweep (``"trial<first trial number>"``,
                ``"refit<trial number>"``).
            on_end: rank 0's clean-up before the group ends: called with the reason and the exit
                status (:data:`EXIT_STATUS`, or ``128 + signal`` for an interruption), it closes the
                round's open trials and logs the resume command. ``None`` on other ranks.
        """
        return PeerWatch(self, round_key, on_end)


class _NoWatch:
    """World size 1, or no store: the task runs as it would without a watch."""

    @contextlib.contextmanager
    def in_task(self, trial: int) -> Iterator[None]:
        yield

    def __enter__(self) -> "_NoWatch":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


#: The watch used where nothing is watched (world size 1, no store, outside a round).
NO_WATCH: Any = _NoWatch()


class PeerWatch:
    """One round's watcher on one rank (a daemon thread while the context is open); see the module docstring.

    Use it around the round's task calls and the gather of their results, and wrap each task call in
    :meth:`in_task`. Built by :meth:`PeerChannel.watch`.
    """

    def __init__(self, channel: PeerChannel, round_key: str, on_end: Callable[[str, int], None] | None) -> None:
        self._store = channel.store
        self._signal_received = channel.signal_received
        self._rank = channel.rank
        self._world = channel.world_size
        self._round = round_key
        self._on_end = on_end
        self._lock = threading.Lock()
        self._run = -1  # index of this rank's current (or last) task call in the round
        self._in_task = False
        self._trial: int | None = None
        self._seen: dict[int, tuple[PeerFailure, float]] = {}  # rank -> (failure, monotonic time seen)
        self._ending = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _key(self, *parts: Any) -> str:
        return _wire.round_key(self._round, *parts)

    # --- the main thread --------------------------------------------------------------------------

    @contextlib.contextmanager
    def in_task(self, trial: int) -> Iterator[None]:
        """Mark this rank as inside trial ``trial``'s task; announce at once if the task raises.

        A pruned trial (``optuna.TrialPruned``, agreed on every rank) and SIGTERM on rank 0
        (:class:`._errors.Preempted`) are not failures and are not announced. The exception is re-raised.
        """
        with self._lock:
            self._run += 1
            self._in_task = True
            self._trial = trial
            run = self._run
        try:
            yield
        except BaseException as e:
            with self._lock:
                self._in_task = False
            if not _is_agreed_exit(e):
                received = self._signal_received() if isinstance(e, KeyboardInterrupt) else None
                self._announce(PeerFailure(self._rank, trial, run, _describe(e), time.time(), received or 0))
            raise
        finally:
            with self._lock:
                self._in_task = False

    def _announce(self, failure: PeerFailure) -> None:
        try:
            self._store.set(self._key("failed", failure.rank), failure.to_json())
            self._store.add(self._key("events"), 1)
        except Exception:  # the agreed path still tells the trial FAIL; only the early warning is lost
            log.warning("rank %d could not announce its failure of trial %d to the other ranks", failure.rank,
                        failure.trial, exc_info=True)

    def __enter__(self) -> "PeerWatch":
        self._thread = threading.Thread(target=self._poll, name="ds-optuna-peer-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=END_LIMIT_S + STORE_TIMEOUT_S)
        # A peer that ended the group while this rank finished the round: end with it (never returns).
        ended = None if self._ending or launcher_gone() else self._ended_by()
        if ended is not None:
            self._end(*ended)

    # --- the watcher thread -----------------------------------------------------------------------

    def _poll(self) -> None:
        events = 0
        while not self._stop.wait(POLL_S):
            if launcher_gone():  # SIGTERM is on its way (C55); the store went with torchrun's agent
                return
            try:
                now_events = int(self._store.add(self._key("events"), 0))
                if now_events != events:
                    events = now_events
                    self._read_failures()
                    ended = self._ended_by()
                    if ended is not None:
                        self._end(*ended)
                        return
                blocked = self._blocked_reason()
            except Exception:  # store gone: torchrun's agent died (C55), or is stopping the group (SIGTERM comes)
                log.debug("rank %d stopped watching its peers", self._rank, exc_info=True)
                if self._signal_received() is None and (launcher_gone() or store_is_gone()):
                    stop_for_lost_launcher("torchrun's store does not answer: its agent is gone")
                return
            if blocked is not None:
                try:
                    self._store.set(self._key("ended"), json.dumps(blocked))
                    self._store.add(self._key("events"), 1)
                except Exception:
                    log.debug("could not mark the round ended", exc_info=True)
                self._end(*blocked, decided=True)
                return

    def _read_failures(self) -> None:
        for rank in range(self._world):
            if rank == self._rank:
                continue
            key = self._key("failed", rank)
            if not self._store.check([key]):
                continue
            failure = PeerFailure.from_json(self._store.get(key))
            known = self._seen.get(rank)
            if known is not None and known[0] == failure:
                continue
            self._seen[rank] = (failure, time.monotonic())
            with self._lock:
                in_task, run = self._in_task, self._run
            if run < failure.run:
                where = "has not reached the task yet"
            else:
                where = "is still in the task" if in_task and run == failure.run else "has left the task"
            what = (f"was interrupted by {signal_name(failure.signal)} in trial {failure.trial}" if failure.signal
                    else f"failed trial {failure.trial}: {failure.error}")
            log.warning("rank %d %s; rank %d %s (learned %.1f s after the failure)", failure.rank, what, self._rank,
                        where, max(time.time() - failure.time, 0.0))

    def _blocked_reason(self) -> tuple[str, int] | None:
        """Why this rank ends the group, and every rank's exit status: a peer failed this task over
        :data:`GRACE_S` s ago (status :data:`EXIT_STATUS`), or was interrupted by a signal over
        :data:`INTERRUPT_GRACE_S` s ago (status ``128 + signal``, case C41), and this rank is still in it."""
        with self._lock:
            in_task, run, trial = self._in_task, self._run, self._trial
        if not in_task:
            return None
        for failure, seen in self._seen.values():
            if failure.run != run:
                continue
            waited = time.monotonic() - seen
            if failure.signal and waited >= INTERRUPT_GRACE_S:
                return (
                    f"rank {failure.rank} was interrupted by {signal_name(failure.signal)} in trial {failure.trial} and rank {self._rank} "
                    f"was still in the task {INTERRUPT_GRACE_S:g} s later, waiting for it (a trial call or a "
                    "training collective the interrupted rank never joins)", 128 + failure.signal,
                )
            if not failure.signal and waited >= GRACE_S:
                return (
                    f"rank {failure.rank} failed trial {failure.trial} ({failure.error}) and rank {self._rank} was "
                    f"still in trial {trial}'s task {GRACE_S:g} s later, waiting for it (a training collective "
                    "the failed rank never joins)", EXIT_STATUS,
                )
        return None

    def _ended_by(self) -> tuple[str, int] | None:
        """The reason and exit status another rank (or this one) gave for ending the group, or ``None``."""
        try:
            key = self._key("ended")
            if self._store.check([key]):
                reason, status = json.loads(self._store.get(key))
                return str(reason), int(status)
        except Exception:
            log.debug("could not read the round's end mark", exc_info=True)
        return None

    def _end(self, reason: str, status: int = EXIT_STATUS, *, decided: bool = False) -> None:
        """End the group with exit ``status`` on every rank (see the module docstring); ``decided``: this
        rank is the blocked one. Never returns."""
        from .._task._process import exit_cleanly

        with self._lock:
            if self._ending:
                return
            self._ending = True
        backstop = threading.Timer(END_LIMIT_S, os._exit, (status,))
        backstop.daemon = True
        backstop.start()
        who = rank_label(self._rank, self._world)
        if decided:
            after = ("the signal's status (a stopped launch is resumed with the command rank 0 prints)" if status > 128
                     else "so that torchrun --max-restarts N restarts the group, which resumes the study")
            log.error("%s ends the torchrun group now: %s. Every rank exits with status %d: %s.", who, reason, status,
                      after)
        else:
            log.error("%s exits with status %d: the torchrun group ends (%s)", who, status, reason)
        if self._on_end is not None:
            try:
                self._on_end(reason, status)
            except Exception:  # a restarted group closes its own trial (by its group id) anyway
                log.exception("rank 0 could not close the trial before the group ends")
            with contextlib.suppress(Exception):
                self._store.set(self._key("closed"), "1")
        else:
            with contextlib.suppress(Exception):
                self._store.wait([self._key("closed")], timedelta(seconds=CLOSE_WAIT_S))
        exit_cleanly(status)


def _is_agreed_exit(exc: BaseException) -> bool:
    """True for exceptions every rank raises together (a pruned trial, an agreed preemption) or that stop the
    group anyway (SIGTERM)."""
    import optuna

    from .._errors import Preempted, TrialPreempted

    return isinstance(exc, (optuna.TrialPruned, Preempted, TrialPreempted))


def _describe(exc: BaseException) -> str:
    """``"TypeName: first line of the message"`` (as :func:`._runner.describe`, which imports this module)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def signal_name(signum: int) -> str:
    """``"SIGINT (Ctrl-C)"`` or the signal's name."""
    import signal

    return "SIGINT (Ctrl-C)" if signum == signal.SIGINT else signal.Signals(signum).name
