"""Every rank: one launch of the sweep loop as one frozen value, built by ``Sweep`` and read by ``Runner``.

A :class:`Launch` carries everything the runner needs for one round (the trials' payloads, whether they
are trials of the search or refit runs, rank 0's asked ``optuna.Trial`` objects, the heartbeat that keeps
them alive in the storage). ``Sweep`` holds the driver and builds it; the
runner keeps it in one slot for the duration of the round and never calls the driver, so the rule
"only rank-0 code talks to the study" holds by structure (docs/design.md, "One trial, by role").
"""

from __future__ import annotations

import contextlib
import enum
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ContextManager, Mapping, Sequence

from ._payload import TrialPayload

if TYPE_CHECKING:
    import optuna


class LaunchMode(enum.Enum):
    """What the payloads of a :class:`Launch` are."""

    #: trials of the search: the task's ``current_trial()`` is a live ``RankTrial``; the task returns the objective(s).
    TRIAL = "trial"
    #: refit runs after the search: the task's ``current_trial()`` replays the params; the task returns metrics.
    REFIT = "refit"


@dataclass(frozen=True)
class Launch:
    """One round of the loop, as the runner sees it; built on every rank by ``Sweep``.

    Attributes:
        payloads: the round's trials, equal on every rank (one when the world size is above 1).
        mode: :attr:`LaunchMode.TRIAL` or :attr:`LaunchMode.REFIT`.
        optuna_trials: rank 0's asked ``optuna.Trial`` per trial number; empty on every other rank
            and for a refit (the task's ``RankTrial`` on rank 0 decides with it).
        heartbeat: a context manager the runner holds open while the round runs (rank 0: Optuna
            heartbeats of the round's trials, :class:`.._study._heartbeat.Heartbeat`; elsewhere a no-op).
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
        """The payload of trial ``number`` (in a batch of consecutive trials the runner finds it by
        Hydra's ``job.num``: the launcher numbers the jobs from ``initial_job_idx``, the first trial).

        Raises:
            KeyError: no payload has that number.
        """
        for p in self.payloads:
            if p.number == number:
                return p
        raise KeyError(f"no trial {number} in this launch ({[p.number for p in self.payloads]})")
