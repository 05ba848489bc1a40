"""A finished trial replayed, for a refit or a pasted rerun line: the trial handle whose ``suggest_*`` give back
the values the trial drew, with nothing reported or stored.

Only the standard library at module level: the package root imports :mod:`._slot`, which imports this.
"""

import os
from typing import TYPE_CHECKING, Any, Optional, Sequence

if TYPE_CHECKING:
    import optuna


#: Environment variable of a rerun line: ``{"number": n, "params": {name: value}}`` of the trial whose
#: params suggested inside the task :func:`._slot.current_trial` replays outside a sweep (case C19).
REPLAY_ENV = "DS_OPTUNA_TRIAL"


class ReplayedTrial:
    """A finished trial replayed: by the sweeper's runner in a refit, or by :func:`._slot.current_trial` outside
    a sweep from a rerun line's :data:`REPLAY_ENV`.

    ``suggest_*`` return the value the trial drew (like ``optuna.trial.FixedTrial``), on every rank
    alike with no message exchanged; ``report`` and ``set_user_attr`` do nothing and ``should_prune``
    is False, so the task runs to its end as the trial did. One part of a PBT schedule's replay
    (``hydra.sweeper.refit.schedule``) has ``pause_at``: ``should_preempt()`` answers True from the first
    call after a ``report`` (or :meth:`note_step`) at or past that step, as a live trial at its rung does, so
    the task saves its checkpoint and returns; the next part resumes from it with the next params.

    Attributes:
        number: the replayed trial's number.
        params: its params.
        refit: True in the sweeper's refit (of a trial or a baseline); False for a rerun line.
        baseline: the ``refit.baselines`` name this refit run trains; ``""`` otherwise.
        checkpoint_dir, resume_from: a refit's own checkpoint directory, and the trial's newest checkpoint
            (``refit.from_checkpoint``).
        n_objectives: 1 (nothing is reported).
    """

    replayed = True

    def __init__(self, number: int, params: dict, *, checkpoint_dir: Optional[str] = None,
                 resume_from: Optional[str] = None, refit: bool = False, baseline: str = "",
                 pause_at: Optional[int] = None) -> None:
        self.number = int(number)
        self.params = dict(params)
        self.refit = refit
        self.baseline = baseline
        self.checkpoint_dir = checkpoint_dir
        self.resume_from = resume_from
        self.preempted = False
        #: ``should_preempt()`` answered True because the run reached ``pause_at`` (a replayed schedule's part).
        self.paused = False
        self.pause_at = pause_at
        self.n_objectives = 1
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.last_step: Optional[int] = None

    def __repr__(self) -> str:
        return f"ReplayedTrial(number={self.number}, params={self.params})"

    def _value(self, name: str) -> Any:
        if name in self.params:
            return self.params[name]
        if self.baseline:
            raise KeyError(
                f"baseline {self.baseline} answers suggest_* only with its own values {sorted(self.params)}, but the "
                f"task asked for '{name}': give it a value in the baseline, e.g. "
                f"hydra.sweeper.refit.baselines.{self.baseline}={{+{name}:<value>}} ('+' adds a key the config lacks)")
        what = "the refit of trial" if self.refit else f"{REPLAY_ENV} replays trial"
        raise KeyError(
            f"{what} {self.number} with params {sorted(self.params)}, but the task asked for '{name}', which the "
            f"trial never suggested: the task's suggest_* calls changed since the sweep")

    def suggest_float(self, name: str, low: float, high: float, *, step: Optional[float] = None, log: bool = False) -> float:
        """The value trial ``number`` drew for ``name`` (range arguments ignored)."""
        return float(self._value(name))

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        """The value trial ``number`` drew for ``name`` (range arguments ignored)."""
        return int(self._value(name))

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        """The value trial ``number`` drew for ``name``."""
        return self._value(name)

    def report(self, value: float, step: int) -> None:
        """Nothing is stored; the step is kept (:meth:`should_preempt` of a replayed schedule's part)."""
        self.note_step(step)

    def note_step(self, step: int) -> None:
        """The task's progress, in the unit it reports in: a pruning glue that stands aside in a refit still
        says its step, so a replayed schedule's part pauses where the trial did."""
        self.last_step = int(step)

    def should_prune(self) -> bool:
        """Never: a replayed trial runs to its end."""
        return False

    def prune_if_needed(self) -> None:
        """Never prunes."""

    def should_preempt(self) -> bool:
        """True once the run reported a step at or past ``pause_at`` (the same on every rank, which report the
        same steps); else False: a replayed trial is not re-queued."""
        if self.pause_at is not None and self.last_step is not None and self.last_step >= self.pause_at:
            self.preempted = self.paused = True
        return self.preempted

    def set_user_attr(self, key: str, value: Any) -> None:
        """Nothing is stored outside a sweep."""

    def record_on_rank0(self, key: str, value: Any) -> None:
        """Nothing is stored outside a sweep."""

    def optuna_trial(self) -> "optuna.trial.Trial":
        """No ``optuna.Trial``: a replayed trial's run stores nothing in the study.

        Raises:
            GlueUsageError: always (guard with ``if not trial.replayed:``).
        """
        from .._errors import GlueUsageError

        raise GlueUsageError(
            f"{'the refit of ' if self.refit else ''}trial {self.number} is replayed (a refit or a rerun line), not a "
            "live trial of the sweep: it has no optuna.Trial to store into; guard with 'if not trial.replayed:'")
