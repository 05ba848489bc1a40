"""The trial a task is running, seen from inside the task function on every rank.

The sweeper sets a slot around each task call; :func:`current_trial` reads it. The slot is the only
module-level state of this package; :func:`_reset_for_tests` clears it.
"""


import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator


@dataclass(frozen=True)
class TrialPayload:
    """What rank 0 broadcasts for one trial; equal (``==``) on every rank.

    Attributes:
        number: the Optuna trial number (also Hydra's ``job.num`` and the job dir's name).
        params: ``{param name: value}`` as sampled on rank 0 (exact Python values, float64).
        overrides: the resolved Hydra override list the task config is composed from.
        sweep_dir: rank 0's absolute sweep dir.
    """

    number: int
    params: dict[str, Any] = field(default_factory=dict)
    overrides: list[str] = field(default_factory=list)
    sweep_dir: str = ""


@dataclass
class RankTrial:
    """The running trial, as the task sees it on any rank.

    Attributes:
        number: the Optuna trial number, equal on every rank.
        params: the sampled params, equal on every rank.
        rank: this process's global rank.
        world_size: number of ranks taking part in the trial.
    """

    number: int
    params: dict[str, Any]
    rank: int
    world_size: int


_current: RankTrial | None = None


def current_trial() -> RankTrial:
    """The trial the calling task is running.

    Returns:
        A :class:`RankTrial` with the same ``number`` and ``params`` on every rank.

    Raises:
        RuntimeError: if called outside a task launched by ``hydra/sweeper=ds_optuna``.
    """
    if _current is None:
        raise RuntimeError(
            "current_trial() is only available inside a task run by hydra/sweeper=ds_optuna "
            "(run with -m and hydra/sweeper=ds_optuna)."
        )
    return _current


def in_trial() -> bool:
    """True inside a task run by the sweeper."""
    return _current is not None


@contextlib.contextmanager
def trial_slot(trial: RankTrial) -> Iterator[RankTrial]:
    """Make ``trial`` the current trial for the duration of the ``with`` block."""
    global _current
    previous, _current = _current, trial
    try:
        yield trial
    finally:
        _current = previous


def _reset_for_tests() -> None:
    global _current
    _current = None
