"""Long waits with no fixed limit, and the one "results written" mark.

The set-up between trial groups, a refit run waiting for the other groups' trials, and the results wait as long as
the other side takes. What ends such a wait when the other side dies is torchrun, which owns process failure
(issue 40): a worker that exits makes the agents stop every worker of the launch, so a waiter never outlives the
process it waits for. A waiter says every :data:`SAY_EVERY_S` seconds what it still waits for.

At the end, the study owner writes the results and plots, then sets :data:`._wire.RESULTS_WRITTEN`; every other rank
waits for it before it leaves (a rank that exits makes torchrun stop the others, which would cut the owner's results
short). The mark lives in the attempt store (``RankComm.store``) with one trial group, the world store with several.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from . import _wire
from ._launcher import launcher_gone

log = logging.getLogger(__name__)

#: Seconds between two looks while a long wait (set-up, refit runs, results) is not over.
POLL_S = 0.2
#: Seconds between two "still waits" lines of one wait.
SAY_EVERY_S = 60.0


def wait_until(ready: Callable[[], bool], who: str, what: str, timeout_s: float | None = None) -> bool:
    """Poll ``ready()`` every :data:`POLL_S` seconds until it is true, at most ``timeout_s`` seconds (``None``: no
    limit); log every :data:`SAY_EVERY_S` seconds (``who``: the waiting process, ``what``: what it waits for).
    True once ready, False when ``timeout_s`` passed first; what ``ready`` raises (a store gone) propagates.
    """
    start = said = time.monotonic()
    while not ready():
        now = time.monotonic()
        if timeout_s is not None and now - start >= timeout_s:
            return False
        if now - said >= SAY_EVERY_S:
            log.info("%s still waits for %s (%.0f s); torchrun ends the launch if the process it waits for dies",
                     who, what, now - start)
            said = now
        time.sleep(POLL_S)
    return True


def mark_results_written(store: Any) -> None:
    """On the study owner, after the results and plots: let every other rank leave. Never raises (``store`` may be
    ``None``: world size 1, or a default group the task made)."""
    if store is None:
        return
    try:
        store.set(_wire.RESULTS_WRITTEN, "1")
    except Exception:  # leaving matters more than the mark (torchrun may already be stopping the launch)
        log.debug("could not mark the results written", exc_info=True)


def wait_for_results(store: Any, who: str, timeout_s: float | None = None) -> None:
    """Hold this rank until the study owner marked the results written (:func:`mark_results_written`), at most
    ``timeout_s`` seconds (``None``: until torchrun ends the launch). Never raises: no store, torchrun's agent
    gone (C55) or a store that went away (torchrun is stopping the launch) end the wait."""
    if store is None or launcher_gone():
        return
    try:
        wait_until(lambda: bool(store.check([_wire.RESULTS_WRITTEN])), who, "the results", timeout_s)
    except Exception as e:  # noqa: BLE001 - leaving matters more than waiting
        log.warning("%s stopped waiting for the results: %s", who, e)
