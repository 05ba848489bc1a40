"""The channel's arrival check: before a collective, the ranks meet in torchrun's store (never in gloo), so a rank
that does not come is named instead of stalling the collective until ``rank_timeout`` (keys: :mod:`._wire`).

- **The trial result's gather** (``RankComm.all_gather`` with ``patient``): each rank marks its arrival
  (:func:`mark_arrival`); a rank whose task failed waits for every mark at most a grace (:func:`absent_after`,
  case C45), and a timed-out gather names the ranks that never came.
- **The trial calls** (:class:`CallCheck`): ``report``, ``should_prune``, ``should_preempt``, ``suggest_*`` and
  ``set_user_attr`` are collectives every rank must make in the same order (optuna/optuna#1417, case C34). Each
  rank writes which call it is at and waits until every rank is there; a rank at a *different* call at the
  same position, or whose task ended before making it, is an error at once; one still elsewhere after
  ``rank_timeout`` seconds is named with the call it last made. A rank's place is ``"<n>|<call>|<how>"``; its
  arrival marks are deleted two calls later (every peer is past them by then).

Without a store (world size 1, or a default group the task created itself) nothing is checked. Only the
standard library at module level (the package root imports the trial handle, which imports this).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Iterator

from . import _wire
from ._launcher import stop_if_lost
from ._whoami import host_label, rank_label
from .._errors import CallMismatchError

log = logging.getLogger(__name__)

#: Seconds between two looks at a gather's arrival marks in :func:`absent_after`.
ARRIVAL_POLL_S = 0.1

#: Seconds between two looks at where the late ranks are (the wait itself polls ``check`` faster).
LOOK_S = 0.5
#: Longest sleep between two ``check`` calls while a peer is late (seconds): short for the first :data:`FAST_S`
#: seconds (rank 0 writing the report to storage makes the others wait milliseconds), then longer.
FAST_POLL_S, MAX_POLL_S, FAST_S = 0.002, 0.02, 0.25
#: Seconds between two "rank R waits at <call>" log lines while a peer is late (the wait lasts up to rank_timeout).
NOTE_EVERY_S = 30.0
#: Why a call mismatch is a task bug, for the messages.
WHY = ("Every rank must make report/should_prune/suggest_* in the same order; one made on some ranks only (e.g. a "
       "metric logged on rank 0 only, so the pruning callback reports there alone: optuna/optuna#1417) is a bug in "
       "the task, and the trial fails")


class CallCheck:
    """One task run's rank-consistent calls on one rank (module docstring); ``run``: the index of this task run
    in the sweep, equal on every rank; ``timeout_s``: seconds a rank waits for late peers (``rank_timeout``)."""

    def __init__(self, store: Any, rank: int, world_size: int, trial: int, run: int, timeout_s: float) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.trial = trial
        self.timeout_s = float(timeout_s)
        self._ns = _wire.calls_namespace(trial, run)
        self._n = 0
        self._labels: list[str] = []  # this rank's calls so far, in order
        self._off = False  # the store failed: the gloo collective alone decides (as without a store)
        self._next_note_s = NOTE_EVERY_S  # seconds of waiting at one call before the next "waits at" line

    @classmethod
    def for_task(cls, ctx: Any, trial: int, run: int) -> "CallCheck | None":
        """The check for one task run on ``ctx``'s rank, or ``None`` (world size 1, or no store)."""
        if not ctx.distributed or ctx.store is None:
            return None
        return cls(ctx.store, ctx.rank, ctx.world_size, trial, run, ctx.timeout_s)

    def _at(self, rank: int) -> str:
        return _wire.call_at_key(self._ns, rank)

    def _mark(self, n: int, label: str, rank: int) -> str:
        return _wire.call_mark_key(self._ns, n, label, rank)

    def before(self, label: str) -> None:
        """Wait until every rank is at this same call (its n-th in the task), ``label`` e.g. ``"report(step=3)"``.

        Raises:
            CallMismatchError: a rank is at another call at this position, its task ended before making
                it, or it did not reach it within ``timeout_s``; names the rank, the call and the trial.
        """
        label = label.replace("|", "/")  # "|" separates the fields of a rank's ``at`` value
        self._n += 1
        n = self._n
        self._labels.append(label)
        if self._off:
            return
        try:
            self.store.multi_set([self._at(self.rank), self._mark(n, label, self.rank)], [f"{n}|{label}|", "1"])
            if n > 2:
                self.store.delete_key(self._mark(n - 2, self._labels[n - 3], self.rank))
        except Exception:
            self._stand_aside()
            return
        others = [r for r in range(self.world_size) if r != self.rank]
        marks = [self._mark(n, label, r) for r in others]
        start = time.monotonic()
        self._next_note_s = NOTE_EVERY_S
        next_look, pause = start + LOOK_S, 0.0002
        while True:
            try:
                if self.store.check(marks):
                    return
            except Exception:
                self._stand_aside()
                return
            now = time.monotonic()
            if now >= next_look:
                next_look = now + LOOK_S
                error = self._look(n, label, others, waited_s=now - start)
                if error is not None:
                    raise error
            time.sleep(pause)
            pause = min(pause * 2, FAST_POLL_S if now - start < FAST_S else MAX_POLL_S)

    def _look(self, n: int, label: str, others: list[int], waited_s: float) -> CallMismatchError | None:
        """The error to raise now, or ``None`` to keep waiting (see the module docstring)."""
        where: dict[int, tuple[int, str, str]] = {}  # rank -> (calls made, its last call, how its task ended or "")
        for r in others:
            try:
                raw = self.store.get(self._at(r)).decode() if self.store.check([self._at(r)]) else "0||"
            except Exception:
                return None
            count, last, how = (raw.split("|", 2) + ["", ""])[:3]
            where[r] = (int(count), last, how)
        for r, (count, last, how) in where.items():
            if count == n and last != label:
                a, b = sorted([(self.rank, label), (r, last)])
                return CallMismatchError(
                    f"trial {self.trial}: the ranks made different calls at call #{n} of the task: rank {a[0]} "
                    f"{a[1]}, rank {b[0]} {b[1]}. {WHY}", rank=r, call=label, trial=self.trial)
        for r, (count, last, how) in where.items():
            if how and count < n:
                return CallMismatchError(
                    f"rank {r} never called {label} in trial {self.trial}; rank {self.rank} did (call #{n} of the "
                    f"task): rank {r}'s task {how} after {count} of these calls. {WHY}",
                    rank=r, call=label, trial=self.trial)
        late = [r for r, (count, _, _) in where.items() if count < n]
        if late and waited_s < self.timeout_s and waited_s >= self._next_note_s:
            self._next_note_s += NOTE_EVERY_S
            log.warning("%s waits at %s (call #%d of trial %d's task) for %.0f s: %s; it gives up after "
                        "rank_timeout=%g s", rank_label(self.rank, self.world_size), label, n, self.trial, waited_s,
                        "; ".join(f"rank {r} is at call #{where[r][0]} {where[r][1]}".rstrip() if where[r][0] else
                                  f"rank {r} made no such call yet" for r in late), self.timeout_s)
        if waited_s < self.timeout_s or not late:
            return None
        r = late[0]
        count, last, _ = where[r]
        last_text = f"its last was call #{count}, {last}" if count else "it made no such call in this task"
        return CallMismatchError(
            f"rank {rank_on_host(self.store, r)} never called {label} in trial {self.trial} within rank_timeout="
            f"{self.timeout_s:g} s; rank {self.rank} did (call #{n} of the task). Rank {r} has not ended its task as "
            f"far as torchrun's store knows ({last_text}): it skipped the call and went on (e.g. into a training "
            f"collective), it is stuck, or its process or node is gone (killed, a lost host, a cut link). {WHY}",
            rank=r, call=label, trial=self.trial)

    def _stand_aside(self) -> None:
        """The store failed: leave the decision to the gloo collective from now on (logged once)."""
        if not self._off:
            self._off = True
            if stop_if_lost():  # torchrun's agent died: no sweep goes on unchecked (C55)
                return
            log.warning("rank %d: torchrun's store did not answer; trial %d's calls are no longer checked for a rank "
                        "that skipped one", self.rank, self.trial, exc_info=True)

    @contextlib.contextmanager
    def task(self) -> Iterator[None]:
        """Around the task call: when the task ends, record how (so peers waiting at a call learn it at once)."""
        how = "returned"
        try:
            yield
        except BaseException as e:
            how = "was pruned" if type(e).__name__ == "TrialPruned" else f"raised {type(e).__name__}"
            raise
        finally:
            with contextlib.suppress(Exception):
                if not self._off:
                    last = self._labels[-1] if self._labels else ""
                    self.store.set(self._at(self.rank), f"{self._n}|{last}|{how}")


def mark_arrival(store: Any, what: str, trial: Any, rank: int) -> str | None:
    """Mark ``rank``'s arrival at the gather ``what`` of ``trial``; the gather's key, or ``None`` without a store
    or when the store did not answer (the gather itself decides; if torchrun's agent is gone,
    :func:`._launcher.stop_if_lost` ends the process: C55)."""
    if store is None:
        return None
    key = _wire.arrival_key(what, trial)
    try:
        store.set(_wire.arrival_mark(key, rank), "1")
    except Exception:
        stop_if_lost()
        return None
    return key


def absent_after(store: Any, key: str, world_size: int, grace_s: float) -> list[int]:
    """The ranks still without an arrival mark under ``key`` after at most ``grace_s`` seconds (polled every
    :data:`ARRIVAL_POLL_S`; empty as soon as all came, or when the store does not answer: the gather decides)."""
    deadline = time.monotonic() + grace_s
    missing = list(range(world_size))
    while True:
        try:
            missing = [r for r in missing if not store.check([_wire.arrival_mark(key, r)])]
        except Exception:
            return []
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(ARRIVAL_POLL_S)


def announce_host(store: Any, rank: int) -> None:
    """Record where ``rank`` runs (:func:`._whoami.host_label`) for :func:`ranks_on_hosts`; never raises (naming a
    host is a courtesy)."""
    with contextlib.suppress(Exception):
        store.set(_wire.host_key(rank), host_label())


def ranks_on_hosts(store: Any, ranks: list[int]) -> str:
    """``"[2, 3] on node 1 (b, 198.18.250.2)"``: the ranks grouped by the host each announced (``"[1]"`` where the
    store does not answer or holds none; several hosts joined by ``", "``)."""
    by_host: dict[str | None, list[int]] = {}
    for r in ranks:
        by_host.setdefault(_host(store, r), []).append(r)
    return ", ".join(f"{sorted(rs)}" + (f" on {host}" if host else "") for host, rs in by_host.items())


def rank_on_host(store: Any, rank: int) -> str:
    """``"2 on node 1 (b, 198.18.250.2)"``, or ``"2"`` without an announced host."""
    host = _host(store, rank)
    return f"{rank} on {host}" if host else str(rank)


def _host(store: Any, rank: int) -> str | None:
    """What ``rank`` announced (:func:`announce_host`), or ``None``; a ``check`` first (``get`` waits for a key)."""
    try:
        key = _wire.host_key(rank)
        return store.get(key).decode() if store is not None and store.check([key]) else None
    except Exception:
        return None
