"""Promotion ASHA on rank 0: which paused trial continues next (``hydra/sweeper/scheduler=asha``).

The rule is the paper's ``get_job`` (Li et al., "A System for Massively Parallel Hyperparameter Tuning", MLSys 2020,
Algorithm 2): from the highest rung down, take the top ``floor(n / reduction_factor)`` of the ``n`` configurations
that reached the rung; the best of them that paused there (and was not promoted yet) is promoted; with none on any
rung, the sampler proposes a new configuration. Everything is read from the study, so a resumed sweep promotes the
trials an earlier launch paused.

A configuration is one lineage of trials (:mod:`._queue`), read from its newest trial, whose intermediate values hold
the whole curve (a retry inherits them). It reached rung ``r`` when it reported a step at or past ``r``; its value
there is the one of the first such step. A trial that paused at ``r`` is PRUNED with :data:`._stored.PAUSED_ATTR`
``= r``; promoting it re-queues it as a retry (:func:`._abandon.requeue_interrupted`) that resumes from its
checkpoint, so samplers see a paused trial as a pruned one and its continuation as a new trial of the same params.
The budget (``n_trials``) counts configurations: a promoted trial and its continuation count once.
"""

from __future__ import annotations

import collections
import logging
import math
from typing import Iterable

import optuna
from optuna.trial import FrozenTrial, TrialState

from .._scheduler_settings import Scheduler
from .._task import _checkpoints
from ._queue import continued_trials, continues, lineage
from ._stored import CHECKPOINT_DIR_ATTR, INTERRUPTED_ATTR, NEVER_RAN_ATTR, PAUSED_ATTR

log = logging.getLogger(__name__)


def promotion(study: optuna.Study, scheduler: Scheduler, finishing: bool = False) -> int | None:
    """The number of the paused trial the paper's rule promotes now, or ``None`` (ask the sampler).

    ``finishing``: the budget is spent (no new configuration will be asked). The paper's ASHA never ends; with a
    budget, the top of a rung is then ``ceil(n / reduction_factor)`` instead of ``floor``, as a synchronous
    successive-halving bracket rounds, so each rung promotes at least its best and the search ends with a
    trial that ran to ``max_steps`` instead of every configuration paused."""
    trials = study.get_trials(deepcopy=False)
    done = continued(trials)
    newest = newest_trials(trials)
    for rung in reversed(scheduler.rungs):
        members = ranked(study, newest.values(), rung)
        quota = -(-len(members) // scheduler.reduction_factor) if finishing else len(members) // scheduler.reduction_factor
        for t in members[:quota]:
            if paused_at(t, rung, done) and has_checkpoint(t):
                log.info("ASHA promotes trial %d (paused at step %d, top %d of %d at that rung)", t.number, rung,
                         quota, len(members))
                return t.number
    return None


def drop_over_cap(study: optuna.Study, scheduler: Scheduler) -> list[str]:
    """Delete the checkpoint directories :func:`over_cap` names (logged); return those deleted. Never raises: disk
    housekeeping never stops the sweep."""
    try:
        dropped = _checkpoints.remove_dirs(over_cap(study, scheduler))
    except Exception:  # noqa: BLE001 - as the retention rule (_trial_checkpoints.retain)
        log.warning("the keep_paused rule failed", exc_info=True)
        return []
    if dropped:
        log.info("Checkpoints of paused trials deleted by hydra.sweeper.scheduler.keep_paused=%s, keep_paused_bytes=%s "
                 "(those trials can no longer be promoted): %s", scheduler.keep_paused, scheduler.keep_paused_bytes,
                 ", ".join(dropped))
    return dropped


def over_cap(study: optuna.Study, scheduler: Scheduler) -> list[str]:
    """The checkpoint directories of the paused trials beyond ``scheduler.keep_paused``, or beyond
    ``keep_paused_bytes`` bytes together (their files' sizes on disk), the least likely to be promoted first: the
    lowest rung first, then the worst value at it (then the oldest). A paused trial whose checkpoint is gone is
    never promoted (:func:`promotion` skips it). ``[]`` without a cap."""
    if scheduler.keep_paused is None and scheduler.keep_paused_bytes is None:
        return []
    trials = study.get_trials(deepcopy=False)
    done = continued(trials)
    held = [t for t in trials if t.user_attrs.get(PAUSED_ATTR) is not None and
            paused_at(t, t.user_attrs[PAUSED_ATTR], done) and has_checkpoint(t)]
    order = []  # (rung, rank at the rung from the worst) per held trial
    for rung in sorted({t.user_attrs[PAUSED_ATTR] for t in held}):
        at_rung = [t for t in ranked(study, held, rung) if t.user_attrs[PAUSED_ATTR] == rung]
        order += [(rung, -i, t) for i, t in enumerate(at_rung)]
    order.sort(key=lambda o: (o[0], o[1]))
    drop = 0 if scheduler.keep_paused is None else max(len(order) - scheduler.keep_paused, 0)
    if scheduler.keep_paused_bytes is not None:
        sizes = [_checkpoints.size_bytes(t.user_attrs[CHECKPOINT_DIR_ATTR]) for _, _, t in order]
        while drop < len(order) and sum(sizes[drop:]) > scheduler.keep_paused_bytes:
            drop += 1
    return [t.user_attrs[CHECKPOINT_DIR_ATTR] for _, _, t in order[:drop]]


def ranked(study: optuna.Study, trials: Iterable[FrozenTrial], rung: int) -> list[FrozenTrial]:
    """The trials that reached ``rung``, best first by their value there (NaN last); a tie goes to the older
    configuration (its lineage's first trial), so that a continued one keeps its place."""
    sign = 1.0 if study.direction == optuna.study.StudyDirection.MINIMIZE else -1.0
    members = [(math.inf if math.isnan(v) else sign * v, lineage(t)[0], t)
               for t in trials if (v := value_at(t, rung)) is not None]
    return [t for _, _, t in sorted(members, key=lambda m: (m[0], m[1]))]


def paused_at(trial: FrozenTrial, rung: int, continued: set[int]) -> bool:
    """``trial`` paused at ``rung`` and nothing continues it yet."""
    return (trial.state == TrialState.PRUNED and trial.user_attrs.get(PAUSED_ATTR) == rung
            and trial.number not in continued)


def has_checkpoint(trial: FrozenTrial) -> bool:
    """The trial's checkpoint directory holds a complete checkpoint (its continuation needs one)."""
    directory = trial.user_attrs.get(CHECKPOINT_DIR_ATTR)
    return bool(directory) and _checkpoints.latest_checkpoint(directory) is not None


def newest_trials(trials: list[FrozenTrial]) -> dict[int, FrozenTrial]:
    """Each configuration's newest trial (a continuation that failed, or that no rank ran, aside), by the number of
    its first trial."""
    newest: dict[int, FrozenTrial] = {}
    for t in trials:
        root = lineage(t)[0]
        if (root not in newest or t.number > newest[root].number) and not _failed_continuation(t) \
                and not t.user_attrs.get(NEVER_RAN_ATTR):
            newest[root] = t
    return newest


def _failed_continuation(trial: FrozenTrial) -> bool:
    """A continuation (a promotion's) that ran and ended FAIL without being re-queued: Ctrl-C, or its task raised."""
    return (trial.state == TrialState.FAIL and len(lineage(trial)) > 1
            and not any(trial.user_attrs.get(k) for k in (INTERRUPTED_ATTR, NEVER_RAN_ATTR)))


def continued(trials: list[FrozenTrial]) -> set[int]:
    """The trials a later trial continues (:func:`._queue.continued_trials`), except a paused trial whose one
    continuation failed: it may be promoted once more; after a second failure it stays where it is."""
    failed = collections.Counter(continues(t) for t in trials if _failed_continuation(t))
    others = [t for t in trials if not _failed_continuation(t)]
    return continued_trials(others) | {n for n, count in failed.items() if count >= 2}


def value_at(trial: FrozenTrial, rung: int) -> float | None:
    """The trial's intermediate value at the first reported step at or past ``rung`` (NaN ranks last), or
    ``None`` when it reported none there."""
    steps = [s for s in trial.intermediate_values if s >= rung]
    if not steps:
        return None
    value = trial.intermediate_values[min(steps)]
    return math.nan if value is None else float(value)
