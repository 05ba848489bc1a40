"""The values rank 0 hands to every rank: :class:`Setup` once per sweep, a :class:`Command` per round, carrying a
:class:`TrialPayload` per trial (and per refit run), and the :class:`Launch` each rank's runner reads.

Frozen values; ``Setup`` and ``Command`` are pickled by ``torch.distributed.broadcast_object_list`` over the gloo
control group (``_ranks.RankComm.broadcast``). Errors travel inside them as :class:`._errors.RemoteError`, so every
rank raises the same type and message (docs/design.md, "One trial, by role"). Only the standard library.
"""

from __future__ import annotations

import contextlib
import enum
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ContextManager, Mapping, Optional, Sequence

from .._errors import RemoteError

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True)
class TrialPayload:
    """What rank 0 broadcasts for one trial; equal (``==``) on every rank. Not what the task sees: the task sees
    a :class:`.._task._handle.RankTrial` built from it.

    Attributes:
        number: the Optuna trial number (also Hydra's ``job.num`` and the job dir's name).
        params: ``{param name: value}`` as sampled on rank 0 (exact Python values, float64).
        overrides: the resolved Hydra override list the task config is composed from.
        checkpoint_dir: the trial's checkpoint directory (absolute; the same for every retry of the trial),
            ``""`` when there is none (a refit without ``refit.from_checkpoint``).
        resume_from: the newest complete checkpoint in it when the trial was asked (``None``: start from step 0).
        continues: the number of the trial this one retries (and resumes), or ``None``.
        inherited_steps: the steps of the intermediate values the retried trial reported; they are kept in
            this trial and ``report`` at one of them again is skipped on every rank.
        tracking_env: environment variables the task runs with, so that its own logging joins the trial's
            tracker runs (:mod:`.._tracking._task_env`); empty without ``hydra.sweeper.tracking``.
        pause_at: the ASHA rung (a step) this trial pauses at, or ``None`` (``hydra/sweeper/scheduler``): at its
            first ``should_preempt()`` after reporting a step at or past it, every rank answers True.
        baseline: the name of a ``hydra.sweeper.refit.baselines`` config this refit run trains (``number`` is
            then negative, ``-1`` for the first baseline, and no trial of the study has it); ``""`` otherwise.
        part: ``"part k of n"`` for a refit that replays a PBT schedule in ``n`` parts (``.._loop._refit``);
            ``""`` otherwise.
    """

    number: int
    params: dict = field(default_factory=dict)
    overrides: list = field(default_factory=list)
    checkpoint_dir: str = ""
    resume_from: Optional[str] = None
    continues: Optional[int] = None
    inherited_steps: tuple = ()
    tracking_env: dict = field(default_factory=dict)
    baseline: str = ""
    pause_at: Optional[int] = None
    part: str = ""

    @property
    def what(self) -> str:
        """``trial <number>`` or ``baseline <name>``, for log lines and errors."""
        what = f"baseline {self.baseline}" if self.baseline else f"trial {self.number}"
        return f"{what} ({self.part})" if self.part else what


class CommandKind(str, enum.Enum):
    """What rank 0 orders for the next round."""

    RUN = "run"
    STOP = "stop"
    #: nothing yet (another trial group's trial may pause, ``Command.waits``): every rank goes round and asks again.
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


class LaunchMode(enum.Enum):
    """What the payloads of a :class:`Launch` are."""

    #: trials of the search: the task's ``current_trial()`` is a live ``RankTrial``; the task returns the objective(s).
    TRIAL = "trial"
    #: refit runs after the search: the task's ``current_trial()`` replays the params; the task returns metrics.
    REFIT = "refit"


@dataclass(frozen=True)
class Launch:
    """One round of the loop, as the runner sees it; built on every rank by ``Sweep`` and kept in one slot while
    the round runs: the runner never calls the driver, so "only rank-0 code talks to the study" holds by structure.

    Attributes:
        payloads: the round's trials, equal on every rank (one when the world size is above 1).
        mode: :attr:`LaunchMode.TRIAL` or :attr:`LaunchMode.REFIT`.
        optuna_trials: rank 0's asked ``optuna.Trial`` per trial number; empty on every other rank and for a refit.
        heartbeat: a context manager held open while the round runs (rank 0: the trials' Optuna heartbeats).
    """

    payloads: tuple[TrialPayload, ...]
    mode: LaunchMode = LaunchMode.TRIAL
    optuna_trials: Mapping[int, "optuna.trial.Trial"] = field(default_factory=lambda: types.MappingProxyType({}))
    heartbeat: ContextManager[Any] = field(default_factory=contextlib.nullcontext)

    @classmethod
    def of(
        cls, payloads: Sequence[TrialPayload], mode: LaunchMode = LaunchMode.TRIAL, *,
        optuna_trials: Mapping[int, "optuna.trial.Trial"] | None = None,
        heartbeat: ContextManager[Any] | None = None,
    ) -> "Launch":
        """A :class:`Launch` with its fields frozen (a tuple of payloads, a read-only trial mapping).

        Raises:
            ValueError: no payload, or a refit with optuna trials (a refit never touches the study).
        """
        if not payloads:
            raise ValueError("a launch needs at least one payload")
        trials = dict(optuna_trials or {})
        if mode is LaunchMode.REFIT and trials:
            raise ValueError("a refit launch carries no optuna trial (refit runs never touch the study)")
        return cls(tuple(payloads), mode, types.MappingProxyType(trials),
                   heartbeat if heartbeat is not None else contextlib.nullcontext())

    @property
    def refit(self) -> bool:
        """The payloads are refit runs."""
        return self.mode is LaunchMode.REFIT

    def payload(self, number: int) -> TrialPayload:
        """The payload of trial ``number``, Hydra's ``job.num`` in a batch (``KeyError`` when none has it)."""
        for p in self.payloads:
            if p.number == number:
                return p
        raise KeyError(f"no trial {number} in this launch ({[p.number for p in self.payloads]})")
