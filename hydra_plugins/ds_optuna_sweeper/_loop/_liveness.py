"""Liveness between the processes of a launch with trial groups: a counter each side bumps in torchrun's store,
and the waits it bounds.

A long wait between trial groups (another group's trials before the refit starts, the results at the end)
has no fixed limit: it lasts as long as the waited-for side shows signs of life. Each side's daemon
:class:`Beat` bumps ``alive/<group>`` every :data:`ALIVE_S` seconds; a waiter gives up when the counter stood
still for ``rank_timeout`` seconds (a counter, not a time stamp: clocks of different nodes may differ).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Callable

from .._comm import _wire
from .._errors import PeerLostError

log = logging.getLogger(__name__)

#: Seconds between two beats of a liveness counter (``alive/<group>`` in the launch's store).
ALIVE_S = 2.0
#: Seconds between two looks while a long wait (refit runs, results) is not over.
POLL_S = 0.2
#: The launch's store key rank 0 sets once the results are written (every other rank may leave then).


def wait_while_alive(store: Any, ready: Callable[[], bool], timeout_s: float, who: str, what: str) -> None:
    """Poll ``ready()`` every :data:`POLL_S` s while rank 0's liveness counter (``alive/0``) moves.

    Raises:
        PeerLostError: the counter stood still for ``timeout_s`` seconds (rank 0 is gone or stuck).
    """
    last, moved = None, time.monotonic()
    while not ready():
        beat = int(store.add(_wire.alive_key(0), 0))
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
        wait_while_alive(store, lambda: bool(store.check([_wire.WORLD_RESULTS_WRITTEN])), timeout_s, who, "the results")
    except Exception as e:  # leaving matters more than waiting
        log.warning("%s", e)


class Beat:
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
                self.store.add(_wire.alive_key(self.group), 1)
            if self._stop.wait(ALIVE_S):
                return

    def silent_s(self, group: int) -> float:
        """Seconds since ``group``'s counter last moved, as seen by this process's looks."""
        now = time.monotonic()
        try:
            with self._lock:
                beat = int(self.store.add(_wire.alive_key(group), 0))
        except Exception:
            return 0.0
        last = self._seen.get(group)
        if last is None or last[0] != beat:
            self._seen[group] = (beat, now)
            return 0.0
        return now - last[1]

    def stop(self) -> None:
        self._stop.set()
