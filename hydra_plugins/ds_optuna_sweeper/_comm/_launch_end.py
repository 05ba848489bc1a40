"""Why the launch ends, said once in torchrun's store (cases C41, C45).

The first rank that stops the launch records it under :data:`._wire.LAUNCH_END` (a :class:`LaunchEnd`): the rank
whose task failed while its peers were blocked (``_loop._exits.end_the_launch``), the first rank a signal reached,
or a rank that stopped on an error the others did not see. Rank 0 closes the running trial from it, every rank
leaves with its exit status, and a peer whose wait breaks says what happened instead of guessing that a rank died.
One record per torchrun attempt, the first kept, except that the same rank may complete its own record (a
signal, then the trial it interrupted). Each call is one store read or write, and none raises.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from ._launcher import launcher_gone
from ._signals import signal_name
from . import _wire

#: Users filter by this logger name.
log = logging.getLogger("hydra_plugins.ds_optuna_sweeper._loop._leaving")

#: How a rank that ran the search to its end leaves (no record is written for it).
FINISHED = "finished the sweep"


@dataclasses.dataclass(frozen=True)
class LaunchEnd:
    """Why the launch ends, as the first rank that stopped it recorded.

    Attributes:
        rank: the rank that recorded it (its global rank in its world).
        status: the exit status every rank then leaves with: 1, or ``128 + signal`` (130 for SIGINT).
        error: ``"TypeName: first line"`` of what stopped it, or the signal's name.
        trial: the trial it happened in, or ``None`` (between trials, at set-up).
        ended: the rank ended the launch itself after its task failed while its peers were blocked.
    """

    rank: int
    status: int
    error: str
    trial: int | None = None
    ended: bool = False

    @property
    def signal(self) -> int | None:
        """The signal number when a signal stopped it, else ``None``."""
        return self.status - 128 if self.status > 128 else None

    @property
    def what(self) -> str:
        """A verb phrase after "rank N": ``"was interrupted by SIGINT (Ctrl-C) in trial 3"``, ``"failed trial 3
        (ValueError: ...)"``, ``"stopped: ControlPlaneError: ..."``."""
        where = f" in trial {self.trial}" if self.trial is not None else ""
        if self.signal is not None:
            return f"was interrupted by {signal_name(self.signal)}{where}"
        if self.trial is not None and self.ended:
            return f"failed trial {self.trial} ({self.error})"
        return f"stopped: {self.error}"


def record_end(store: Any, end: LaunchEnd) -> None:
    """Record ``end`` unless a record is there already (:data:`._wire.LAUNCH_END`); the same rank's record is
    replaced only by one that ends the launch (its signal, then the trial it interrupted). Never raises, and
    does nothing without a store (world size 1, or a default group the task created) or with torchrun's agent
    gone (C55: the store went with it)."""
    if store is None or launcher_gone():
        return
    try:
        known = launch_end(store)
        if known is None or (end.ended and known.rank == end.rank):
            store.set(_wire.LAUNCH_END, json.dumps(dataclasses.asdict(end)))
    except Exception:  # leaving matters more than the record (torchrun may already be gone)
        log.debug("could not record why rank %d stops the launch", end.rank, exc_info=True)


def launch_end(store: Any) -> LaunchEnd | None:
    """The recorded :class:`LaunchEnd`, or ``None`` (none, no store, or a store that does not answer). Never raises."""
    if store is None:
        return None
    try:
        if not store.check([_wire.LAUNCH_END]):
            return None
        return LaunchEnd(**json.loads(store.get(_wire.LAUNCH_END)))
    except Exception:
        return None

