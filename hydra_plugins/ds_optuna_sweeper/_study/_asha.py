"""Promotion ASHA on rank 0: which paused trial continues next (``hydra/sweeper/scheduler=asha``).

The rule is the paper's ``get_job`` (Li et al., "A System for Massively Parallel Hyperparameter Tuning", MLSys 2020,
Algorithm 2): from the highest rung down, take the top ``floor(n / reduction_factor)`` of the ``n`` configurations
that reached the rung; the best of them that paused there (and was not promoted yet) is promoted; with none on any
rung, the sampler proposes a new configuration. Everything is read from the study, so a resumed sweep (after a
crash or SIGTERM) promotes the trials an earlier launch paused.

How a rung is read from the study: a configuration is one lineage of trials (a trial and the retries that continue
it: Optuna's ``failed_trial``/``retry_history`` system attributes, :mod:`._queue`), read from its newest trial,
whose intermediate values hold the whole curve (a retry inherits them). It reached rung ``r`` when it reported a
step at or past ``r``; its value there is the one of the first such step. A trial that paused at ``r`` is PRUNED
with :data:`._stored.PAUSED_ATTR` ``= r``; promoting it re-queues it as a retry (:func:`._abandon.requeue_interrupted`)
that resumes from its checkpoint with its curve, so Optuna's samplers see a paused trial as a pruned one with its
intermediate values (TPE ranks pruned trials by their last step and value) and its continuation as a new trial of
the same params. The budget (``n_trials``) counts configurations: a promoted trial and its continuation count once.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from .._scheduler_settings import Scheduler
from ._queue import continued_trials
from ._stored import FAILED_TRIAL_ATTR, PAUSED_ATTR, RETRY_HISTORY_ATTR

log = logging.getLogger(__name__)


def promotion(study: optuna.Study, scheduler: Scheduler, finishing: bool = False) -> int | None:
    """The number of the paused trial the paper's rule promotes now, or ``None`` (ask the sampler).

    ``finishing``: the budget is spent (no new configuration will be asked). The paper's ASHA never ends; with a
    budget, the top of a rung is then ``ceil(n / reduction_factor)`` instead of ``floor``, as a synchronous
    successive-halving bracket rounds, so each rung promotes at least its best and the search ends with a
    trial that ran to ``max_steps`` instead of every configuration paused."""
    trials = study.get_trials(deepcopy=False)
    continued = continued_trials(trials)  # trials a retry (or an earlier promotion) continues
    newest: dict[int, FrozenTrial] = {}
    for t in trials:
        root = _lineage(t)[0]
        if root not in newest or t.number > newest[root].number:
            newest[root] = t
    sign = 1.0 if study.direction == optuna.study.StudyDirection.MINIMIZE else -1.0
    for rung in reversed(scheduler.rungs):
        members = [(math.inf if math.isnan(v) else sign * v, t.number, t)
                   for t in newest.values() if (v := value_at(t, rung)) is not None]
        quota = -(-len(members) // scheduler.reduction_factor) if finishing else len(members) // scheduler.reduction_factor
        top = sorted(members, key=lambda m: (m[0], m[1]))[:quota]
        for _, number, t in top:
            if t.state == TrialState.PRUNED and t.user_attrs.get(PAUSED_ATTR) == rung and number not in continued:
                log.info("ASHA promotes trial %d (paused at step %d, top %d of %d at that rung)", number, rung,
                         len(top), len(members))
                return number
    return None


def value_at(trial: FrozenTrial, rung: int) -> float | None:
    """The trial's intermediate value at the first reported step at or past ``rung`` (NaN ranks last), or
    ``None`` when it reported none there."""
    steps = [s for s in trial.intermediate_values if s >= rung]
    if not steps:
        return None
    value = trial.intermediate_values[min(steps)]
    return math.nan if value is None else float(value)


def _lineage(trial: FrozenTrial) -> list[Any]:
    """The trials this one continues, oldest first, then itself (``[number]`` for a trial of its own)."""
    history = list(trial.system_attrs.get(RETRY_HISTORY_ATTR) or ())
    if not history and trial.system_attrs.get(FAILED_TRIAL_ATTR) is not None:
        history = [trial.system_attrs[FAILED_TRIAL_ATTR]]
    return [*history, trial.number]
