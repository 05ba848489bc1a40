"""The control messages rank 0 broadcasts: :class:`Setup` once per sweep, a :class:`Command` per round.

Frozen values, pickled by ``torch.distributed.broadcast_object_list`` over the gloo control group
(``_ranks.RankComm.broadcast``). Errors travel inside them as :class:`._errors.RemoteError`, so every
rank raises the same type and message (docs/design.md, "One trial, by role").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from .._errors import RemoteError
from ._payload import TrialPayload


class CommandKind(str, enum.Enum):
    """What rank 0 orders for the next round."""

    RUN = "run"
    STOP = "stop"
    #: nothing yet: the group's first rank waits for another trial group's trial to pause (``Command.waits``);
    #: every rank of the group goes round the loop and receives the next order (each wait stays within
    #: ``rank_timeout``).
    WAIT = "wait"


@dataclass(frozen=True)
class Command:
    """Rank 0's order for the next round, broadcast to every rank.

    Attributes:
        kind: :attr:`CommandKind.RUN` (run ``payloads``) or :attr:`CommandKind.STOP` (leave the loop).
        payloads: the trials to run; exactly one when the world size is above 1.
        error: with STOP, the error every rank raises (:meth:`._errors.RemoteError.raise_here`): failure
            rate (``TrialFailedError``), storage outage (``StorageUnavailableError``), a failed ask or tell
            (``SweepStoppedError``).
        reason: with STOP and no error, why the sweep ended (budget, timeout, grid done).
        waits: with STOP: the budget is spent but a trial running in another trial group may still pause and
            be continued (``hydra/sweeper/scheduler``), so the asking group waits (``_study_service``).
    """

    kind: CommandKind
    payloads: tuple[TrialPayload, ...] = ()
    error: RemoteError | None = None
    reason: str = ""
    waits: bool = False


#: The order every non-zero rank starts from before rank 0's command arrives.
STOP = Command(CommandKind.STOP)
#: "Ask again": the order a trial group's first rank gives its ranks while its ask waits (:attr:`CommandKind.WAIT`).
WAIT = Command(CommandKind.WAIT)


@dataclass(frozen=True)
class Setup:
    """Rank 0's sweep-level facts, broadcast once before the first trial.

    Attributes:
        sweep_dir: rank 0's absolute sweep dir (every rank's jobs go there, case C08).
        resolver_cache: rank 0's OmegaConf resolver cache, so ``${now:...}`` is equal on every rank.
        error: why rank 0 could not start; every rank then raises it (same type and message).
    """

    sweep_dir: str | None
    resolver_cache: Any = None
    error: RemoteError | None = None
