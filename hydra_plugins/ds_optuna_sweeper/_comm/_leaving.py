"""Why each rank leaves the sweep, recorded in torchrun's store (case C41), and rank 0's "results written"
mark that holds the other ranks until rank 0 wrote its results.

No collective here: each call is one store read or write, and none raises.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from ._launcher import launcher_gone
from . import _wire

#: The logger's name from before the module moved into ``_comm/`` (users filter by it).
log = logging.getLogger("hydra_plugins.ds_optuna_sweeper._loop._leaving")


#: Key prefix, in an attempt's store (:attr:`._ranks.RankComm.store`), of each rank's record of why it leaves the sweep.
#: The reason a rank records (and a trial group reports to global rank 0) when its sweep ran to its end.
FINISHED = "finished the sweep"


def record_leaving(store: Any, rank: int, why: str) -> None:
    """Record in torchrun's store why this rank is leaving the sweep, before it exits (case C41).

    A peer whose wait on the control plane breaks reads it (:func:`leaving_records`) and says what
    happened instead of guessing that a rank died. The first record of a rank stays (the signal handler
    writes "was interrupted by SIGINT" before the sweep unwinds and writes its outcome). Never raises, and
    does nothing without a store (world size 1, or a default group the task created).

    Args:
        store: the attempt's store (:attr:`._ranks.RankComm.store`), or ``None``.
        rank: this process's global rank.
        why: a verb phrase after "rank N": ``"was interrupted by SIGINT"``, ``"was interrupted by SIGTERM"``,
            ``"stopped: <TypeName: first line>"``, :data:`FINISHED`.
    """
    if store is None or launcher_gone():  # torchrun's agent, which holds the store, is gone (C55)
        return
    key = _wire.leaving_key(rank)
    try:
        if not store.check([key]):
            store.set(key, why)
    except Exception:  # leaving matters more than the record (torchrun may already be gone)
        log.debug("could not record why rank %d leaves", rank, exc_info=True)


def leaving_records(store: Any, world_size: int) -> dict[int, str] | None:
    """``{rank: why}`` of the ranks that recorded why they left (:func:`record_leaving`); ``None`` without a
    store or when it does not answer. No waiting: a rank with no record is absent."""
    if store is None:
        return None
    out: dict[int, str] = {}
    try:
        for r in range(world_size):
            key = _wire.leaving_key(r)
            if store.check([key]):
                out[r] = store.get(key).decode()
    except Exception:
        return None
    return out


def interruption(records: dict[int, str] | None) -> tuple[int, list[int]] | None:
    """``(signal number, [ranks])`` of the first signal the records name ("was interrupted by SIGINT"), or ``None``."""
    import re
    import signal

    found: dict[int, list[int]] = {}
    for r, why in sorted((records or {}).items()):
        m = re.match(r"was interrupted by (SIG[A-Z]+)", why)
        if m and hasattr(signal, m.group(1)):
            found.setdefault(int(getattr(signal, m.group(1))), []).append(r)
    if not found:
        return None
    signum = next(iter(found))
    return signum, found[signum]


def wait_for_rank0_results(ctx: Any, *, is_done: bool, timeout_s: float = 120.0) -> None:
    """Hold the other ranks until rank 0 wrote the results and plots (or ``timeout_s`` passed).

    When a sweep stops with an error, every rank raises at once; a rank that exits non-zero makes
    torchrun stop the others with SIGTERM, which cut rank 0's results and plots short. Rank 0 calls
    this with ``is_done=True`` after writing them; the others wait for that mark in the store. No
    collective: a dead rank 0 only costs the others ``timeout_s`` (torchrun stops them sooner).
    """
    if ctx.store is None or not ctx.distributed or launcher_gone():
        return
    key = _wire.RESULTS_WRITTEN
    try:
        if is_done:
            ctx.store.set(key, "1")
        else:
            ctx.store.wait([key], timedelta(seconds=timeout_s))
    except Exception:  # leaving matters more than waiting
        log.debug("waiting for rank 0's results ended early", exc_info=True)
