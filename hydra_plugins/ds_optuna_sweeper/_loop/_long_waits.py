"""Long waits between trial groups (the set-up, the refit runs, the results): no thread, no liveness counter.

These waits have no fixed limit: the set-up lasts as long as rank 0 takes to open the study, a refit run waits for
the other groups' trials, the results for the last group. What ends them when the other side dies is torchrun,
which owns process failure (issue 40): a worker that exits, on any node, makes the agents stop every worker of the
launch (SIGTERM, then SIGKILL), so a waiter never outlives the process it waits for. The liveness thread this
module held before counted beats that a hung process kept sending (its beat was a thread of its own), so it never
caught more than torchrun does. A waiter says every :data:`SAY_EVERY_S` seconds what it still waits for.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from .._comm import _wire

log = logging.getLogger(__name__)

#: Seconds between two looks while a long wait (set-up, refit runs, results) is not over.
POLL_S = 0.2
#: Seconds between two "still waits" lines of one wait.
SAY_EVERY_S = 60.0


def wait_until(ready: Callable[[], bool], who: str, what: str) -> None:
    """Poll ``ready()`` every :data:`POLL_S` seconds until it is true; log every :data:`SAY_EVERY_S` seconds
    (``who``: the waiting process, ``what``: what it waits for). Raises what ``ready`` raises (a store gone)."""
    start = said = time.monotonic()
    while not ready():
        now = time.monotonic()
        if now - said >= SAY_EVERY_S:
            log.info("%s still waits for %s (%.0f s); torchrun ends the launch if the process it waits for dies",
                     who, what, now - start)
            said = now
        time.sleep(POLL_S)


def wait_for_results(store: Any, who: str) -> None:
    """Hold this rank until global rank 0 wrote the launch's results (trial groups). Never raises: a store that
    went away (torchrun is stopping the launch) ends the wait."""
    try:
        wait_until(lambda: bool(store.check([_wire.WORLD_RESULTS_WRITTEN])), who, "the results")
    except Exception as e:  # noqa: BLE001 - leaving matters more than waiting
        log.warning("%s stopped waiting for the results: %s", who, e)
