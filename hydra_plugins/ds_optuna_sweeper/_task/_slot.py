"""The process slot: which trial the task running in this process sees.

The sweeper's runner puts the running trial in the slot around each task call (:func:`trial_slot`);
:func:`current_trial` reads the slot, then a rerun line's ``DS_OPTUNA_TRIAL`` (:data:`._replayed.REPLAY_ENV`).

Only the standard library at module level: the package root imports this module, and Hydra's plugin scanner
imports the root in every Hydra app.
"""

import contextlib
import json
import os
from typing import Iterator, Optional

from ._handle import TrialHandle
from ._replayed import REPLAY_ENV, ReplayedTrial

#: The trial of the task the sweeper is running in this process, or ``None`` (set by :func:`trial_slot`).
_current: Optional[TrialHandle] = None


def _replayed() -> Optional[ReplayedTrial]:
    """The trial a rerun line replays (``DS_OPTUNA_TRIAL``), or ``None`` when the variable is unset or empty.

    Raises:
        RuntimeError: if the variable is not ``{"number": n, "params": {...}}``.
    """
    text = os.environ.get(REPLAY_ENV)
    if not text:
        return None
    try:
        data = json.loads(text)
        return ReplayedTrial(int(data["number"]), dict(data["params"]))
    except (ValueError, KeyError, TypeError) as e:
        raise RuntimeError(f"{REPLAY_ENV} must be {{\"number\": n, \"params\": {{...}}}} (a rerun line's), got {text!r}") from e


def current_trial() -> TrialHandle:
    """The trial the calling task is running.

    Inside a sweep, the :class:`~._handle.RankTrial` of the running trial (in a refit, a
    :class:`~._replayed.ReplayedTrial`). Outside a sweep, when a rerun line set ``DS_OPTUNA_TRIAL``, a
    :class:`~._replayed.ReplayedTrial` that gives back the params the trial suggested inside the task.

    Returns:
        A :class:`~._handle.TrialHandle` with the same ``number`` and ``params`` on every rank.

    Raises:
        RuntimeError: if called outside a task launched by ``hydra/sweeper=ds_optuna`` and outside a
            rerun line, or if ``DS_OPTUNA_TRIAL`` is malformed.
    """
    if _current is not None:
        return _current
    replayed = _replayed()
    if replayed is None:
        raise RuntimeError(
            "current_trial() is only available inside a task run by hydra/sweeper=ds_optuna "
            "(run with -m and hydra/sweeper=ds_optuna), or in a rerun line that sets "
            f"{REPLAY_ENV}."
        )
    return replayed


def in_trial() -> bool:
    """True inside a task run by the sweeper, or replaying a trial from a rerun line (``DS_OPTUNA_TRIAL``):
    whenever :func:`current_trial` returns a trial instead of raising (a malformed variable aside)."""
    return _current is not None or bool(os.environ.get(REPLAY_ENV))


def run_by_sweeper() -> bool:
    """True inside a task (trial or refit) run by the sweeper; False in a plain run and in a rerun line."""
    return _current is not None


#: The trial user attribute of the optimizer steps the trial ran (an int), written by :func:`record_optimizer_steps`;
#: defined on the task side, which imports nothing of the study side (:mod:`.._study._stored` lists it).
STEPS_ATTR = "optimizer_steps"


def record_optimizer_steps(steps: int) -> None:
    """Store :data:`STEPS_ATTR` = ``steps`` on the running live trial (a collective; rank 0's value is
    kept), whatever its number of objectives; nothing in a refit, a rerun line or a plain run."""
    if in_trial() and not current_trial().replayed:
        current_trial().set_user_attr(STEPS_ATTR, int(steps))


@contextlib.contextmanager
def trial_slot(trial: TrialHandle) -> Iterator[TrialHandle]:
    """Make ``trial`` the current trial for the duration of the ``with`` block (the previous one after it)."""
    global _current
    previous, _current = _current, trial
    try:
        yield trial
    finally:
        _current = previous


def _reset_for_tests() -> None:
    global _current
    _current = None
