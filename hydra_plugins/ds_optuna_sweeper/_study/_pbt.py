"""Population-based training on rank 0: which paused member continues next, from whose checkpoint, with which params.

The rule (Jaderberg et al., "Population Based Training of Neural Networks", 2017, "truncation selection" and
"perturb"/"resample"; asynchronous, as Ray Tune's ``PopulationBasedTraining``): a member is one configuration's
lineage of trials (:mod:`._queue`). It pauses every ``interval`` steps (:attr:`.._scheduler_settings.Scheduler.rungs`,
the same pause as promotion ASHA's). Once every member has started, the paused member at the lowest step (then the
oldest) continues:

- **exploit**: it ranks in the bottom ``quantile`` of the members that reached its step (their value at the first
  reported step at or past it, :func:`._asha.value_at`): the newest checkpoint of a paused member of the top
  ``quantile`` (drawn at random) is copied into its checkpoint directory, replacing its own, and it continues as a new
  trial with that member's params and intermediate values, the ``mutations`` **explored**: each perturbed (times a
  factor of ``perturbation``, clipped to its range, the other way at the bound; a choice moves to a neighbouring
  value) or, with ``resample_probability``, drawn anew from its distribution (uniformly, log-uniformly for a log
  range);
- else it continues from its own checkpoint with its own params (re-queued as a retry, as a promoted ASHA trial).

The new trial continues the member's lineage, so the budget counts members, never intervals
(:func:`._queue.counted_trials`); a clone's user attribute :data:`._stored.PBT_CLONE_ATTR` says what it cloned, and
a member's schedule is its lineage (:func:`schedule`). Optuna's samplers see each interval's trial with the params
it ran, PRUNED at its pause with its curve (a clone's curve begins with the cloned member's).
"""

from __future__ import annotations

import logging
import math
import os
import random
import shutil
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from .. import _upstream as upstream
from .._scheduler_settings import Scheduler
from .._task import _checkpoints
from . import _abandon
from ._asha import continued, has_checkpoint, newest_trials, paused_at, ranked, value_at
from ._queue import continues, lineage
from ._stored import (CHECKPOINT_DIR_ATTR, ENQUEUED_ATTR, FAILED_TRIAL_ATTR, FIXED_PARAMS_ATTR, PAUSED_ATTR,
                      PBT_CLONE_ATTR, PBT_SEED_ATTR, RETRY_HISTORY_ATTR)

log = logging.getLogger(__name__)


def continue_next(study: optuna.Study, scheduler: Scheduler, sampler_seed: int | None = None) -> int | None:
    """Queue the continuation of the paused member at the lowest step (module docstring); return the number of the
    queued trial, or ``None`` when no member is paused with a checkpoint. When copying the donor's checkpoint fails
    (``OSError``: a full disk, a checkpoint deleted meanwhile), the member continues from its own (logged): the
    search never stops on it. The random draws (donor, perturbation, resampling) follow :func:`study_seed`."""
    trials = study.get_trials(deepcopy=False)
    done = continued(trials)
    newest = newest_trials(trials)
    paused = [t for t in newest.values() if t.user_attrs.get(PAUSED_ATTR) is not None
              and paused_at(t, t.user_attrs[PAUSED_ATTR], done) and has_checkpoint(t)]
    if not paused:
        return None
    member = min(paused, key=lambda t: (t.user_attrs[PAUSED_ATTR], t.number))
    step = member.user_attrs[PAUSED_ATTR]
    seed = study_seed(study, sampler_seed)
    donor = pick_donor(study, scheduler, member, list(newest.values()), [t.number for t in paused], seed)
    if donor is None:
        return _abandon.requeue_interrupted(study, member.number)
    rng = random.Random(f"{seed}/{member.number}")
    params = explore(donor.params, donor.distributions, scheduler, rng)
    try:
        source = copy_checkpoint(donor, member)
    except OSError as e:  # a full disk, a donor checkpoint deleted meanwhile: the member goes on as it is
        log.warning("PBT: copying trial %d's checkpoint for the member of trial %d failed (%s); it continues from its "
                    "own checkpoint", donor.number, member.number, e)
        return _abandon.requeue_interrupted(study, member.number)
    changed = {k: [donor.params[k], v] for k, v in params.items() if v != donor.params[k]}
    number = _queue_clone(study, member, donor, params, {
        "from_trial": donor.number, "continues": member.number, "at_step": step,
        "donor_step": donor.user_attrs[PAUSED_ATTR], "checkpoint": source, "changed": changed})
    log.info("PBT: member of trial %d (bottom at step %d) continues as trial %d from trial %d's checkpoint %s%s",
             member.number, step, number, donor.number, source,
             "; " + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items()) if changed else "")
    return number


def study_seed(study: optuna.Study, sampler_seed: int | None) -> int:
    """The seed of the study's PBT draws, stored once as the study user attribute :data:`._stored.PBT_SEED_ATTR`:
    the sampler's seed (``hydra.sweeper.sampler.seed``: a seeded search is reproducible), else a random one (an
    unseeded search draws anew, as Optuna's samplers do). Resumes keep the stored one."""
    stored = study.user_attrs.get(PBT_SEED_ATTR)
    if stored is not None:
        return int(stored)
    seed = int(sampler_seed) if sampler_seed is not None else random.SystemRandom().getrandbits(32)
    study.set_user_attr(PBT_SEED_ATTR, seed)
    return seed


def pick_donor(study: optuna.Study, scheduler: Scheduler, member: FrozenTrial, newest: list[FrozenTrial],
               paused: list[int], seed: int = 0) -> FrozenTrial | None:
    """The member ``member`` clones (a paused member of the top ``quantile`` at ``member``'s step, drawn at random),
    or ``None`` when ``member`` is not in the bottom ``quantile`` or no top member is paused with a checkpoint.

    The quantile's size is ``ceil(n * quantile)`` of the ``n`` members that reached the step, at most ``n // 2``
    (Ray Tune's ``_quantiles``), so with fewer than 2 members nobody clones. A member tied with the bottom
    quantile's best value is in the bottom too (outside the top), and one tied with the top quantile's worst is in the
    top: members stuck at one value all clone, and a clone (which carries its donor's value) never hides a tied
    paused donor."""
    step = member.user_attrs[PAUSED_ATTR]
    members = ranked(study, newest, step)  # best first; ``member`` is among them (it paused at ``step``)
    n = len(members)
    size = min(math.ceil(n * scheduler.quantile), n // 2)
    if size == 0:
        return None
    values = [value_at(t, step) for t in members]
    top_end = size  # the top: the first ``size``, and those tied with the last of them
    while top_end < n and _same(values[top_end], values[size - 1]):
        top_end += 1
    bottom_start = n - size  # the bottom: the last ``size``, and those tied with the first of them (not the top)
    while bottom_start > top_end and _same(values[bottom_start - 1], values[n - size]):
        bottom_start -= 1
    if [t.number for t in members].index(member.number) < max(top_end, bottom_start):
        return None
    donors = [t for t in members[:top_end] if t.number in paused]
    if not donors:  # the top members all run (with trial groups): say why this bottom member clones nobody
        log.info("PBT: member of trial %d is in the bottom at step %d, but no top member is paused with a checkpoint "
                 "(top: trial(s) %s): it continues from its own checkpoint", member.number, step,
                 ", ".join(str(t.number) for t in members[:top_end]))
        return None
    return random.Random(f"{seed}/{member.number}/donor").choice(donors)


def _same(a: float, b: float) -> bool:
    """Equal values at a step (two NaN, which rank last, are alike)."""
    return a == b or (math.isnan(a) and math.isnan(b))


def explore(params: dict[str, Any], distributions: dict[str, BaseDistribution], scheduler: Scheduler,
            rng: random.Random) -> dict[str, Any]:
    """``params`` with each of ``scheduler.mutations`` perturbed or resampled (module docstring); a param not in
    ``params`` is left out. The values stay within their distributions (``distribution._contains``)."""
    new = dict(params)
    for name in scheduler.mutations:
        if name not in params:
            continue
        dist = distributions[name]
        if rng.random() < scheduler.resample_probability:
            new[name] = draw(dist, rng)
        else:
            new[name] = perturb(dist, params[name], rng.choice(scheduler.perturbation))
    return new


def draw(dist: BaseDistribution, rng: random.Random) -> Any:
    """A value drawn anew from ``dist``: uniform (log-uniform for ``log=True``), on its step grid; a choice at random."""
    if isinstance(dist, CategoricalDistribution):
        return rng.choice(dist.choices)
    assert isinstance(dist, (FloatDistribution, IntDistribution))
    if dist.log:
        value = math.exp(rng.uniform(math.log(dist.low), math.log(dist.high)))
    else:
        value = rng.uniform(dist.low, dist.high)
    return _on_grid(dist, value)


def perturb(dist: BaseDistribution, value: Any, factor: float) -> Any:
    """``value`` times ``factor``, clipped to ``dist``'s range and on its step grid (an int moves by at least one
    step when the factor is not 1); for a choice, the next value (``factor > 1``) or the previous one, clipped.
    Where the clip gives ``value`` back (it sits at the bound the factor points to), it moves the other way
    (times ``1 / factor``): a clone with its donor's params would explore nothing (a member at the range's low end
    cloned with 0.8 kept 1e-4, seen in the HF PBT soak test)."""
    new = _moved(dist, value, factor)
    if new == value and factor != 1:
        new = _moved(dist, value, 1 / factor)
    return new


def _moved(dist: BaseDistribution, value: Any, factor: float) -> Any:
    if isinstance(dist, CategoricalDistribution):
        i = dist.choices.index(value)
        return dist.choices[min(max(i + (1 if factor > 1 else -1), 0), len(dist.choices) - 1)]
    assert isinstance(dist, (FloatDistribution, IntDistribution))
    new = _on_grid(dist, value * factor)
    if isinstance(dist, IntDistribution) and new == value and factor != 1:
        new = _on_grid(dist, value + (dist.step if factor > 1 else -dist.step))
    return new


def _on_grid(dist: FloatDistribution | IntDistribution, value: float) -> Any:
    value = min(max(value, dist.low), dist.high)
    if dist.step is not None:
        value = dist.low + round((value - dist.low) / dist.step) * dist.step
        value = min(max(value, dist.low), dist.high)
    return int(round(value)) if isinstance(dist, IntDistribution) else float(value)


def copy_checkpoint(donor: FrozenTrial, member: FrozenTrial) -> str:
    """Copy ``donor``'s newest checkpoint into ``member``'s checkpoint directory in place of ``member``'s own (a
    temporary name first, so a kill mid-copy leaves ``member``'s checkpoint); return the copied checkpoint's path.

    Raises:
        OSError: the copy failed.
    """
    source = _checkpoints.latest_checkpoint(donor.user_attrs[CHECKPOINT_DIR_ATTR])
    if source is None:  # it had one when the donor was picked (has_checkpoint): deleted since
        raise FileNotFoundError(f"trial {donor.number}'s checkpoint directory holds no checkpoint any more")
    directory = member.user_attrs[CHECKPOINT_DIR_ATTR]
    name = os.path.basename(os.path.normpath(source))
    tmp = os.path.join(directory, f".pbt-{name}.tmp")
    _checkpoints.remove(tmp)
    (shutil.copytree if os.path.isdir(source) else shutil.copy2)(source, tmp)
    for own in _checkpoints.checkpoints(directory):
        _checkpoints.remove(own)
    os.replace(tmp, os.path.join(directory, name))
    return source


def _queue_clone(study: optuna.Study, member: FrozenTrial, donor: FrozenTrial, params: dict[str, Any],
                 clone: dict[str, Any]) -> int:
    """Store the exploiting member's next trial (WAITING): ``params`` over the donor's distributions, the donor's
    intermediate values, the member's user attributes (its checkpoint directory) and lineage, as Optuna's retry
    callback stores a retry (optuna/storages/_callbacks.py)."""
    history = lineage(member)
    # A warm start's marks stay with the warm start: the clone runs other params (_queue.warm_start_runs).
    user = {k: v for k, v in member.user_attrs.items() if k != ENQUEUED_ATTR}
    system = {k: v for k, v in member.system_attrs.items() if k != FIXED_PARAMS_ATTR}
    template = optuna.trial.create_trial(
        state=TrialState.WAITING, params=params, distributions=dict(donor.distributions),
        user_attrs={**user, PBT_CLONE_ATTR: clone},
        system_attrs={**system, FAILED_TRIAL_ATTR: history[0], RETRY_HISTORY_ATTR: history},
        intermediate_values=dict(donor.intermediate_values))
    return upstream.create_trial_from_template(study, template)


def schedule(trials: list[FrozenTrial], number: int) -> list[dict[str, Any]]:
    """The schedule that trained trial ``number``'s model: the history of its weights, oldest first, one segment per
    run of steps with one set of params (Ray Tune's ``PopulationBasedTrainingReplay`` follows the same history).

    The history goes back through each trial's source of weights: a clone's (:data:`._stored.PBT_CLONE_ATTR`) is the
    donor trial whose checkpoint it copied, any other continuation's the trial it retries (:func:`._queue.continues`,
    same params: the same segment), a first trial's nothing (step 0). Each segment is ``{"trials", "params",
    "from_step", "to_step", "cloned"}``: its trials, oldest first; the params they ran; the step it resumed after
    (``None``: from scratch; a clone's is its donor's pause step); the step it paused at (``None`` for the last
    segment: to the end); the clone record of its first trial, or ``None``. A member that never cloned has one
    segment; a trial missing from ``trials`` ends the walk. Steps are the task's reported steps (``report``)."""
    by_number = {t.number: t for t in trials}
    chain: list[FrozenTrial] = []
    t = by_number.get(number)
    while t is not None and t not in chain:
        chain.append(t)
        cloned = t.user_attrs.get(PBT_CLONE_ATTR)
        source = cloned["from_trial"] if cloned else continues(t)
        t = by_number.get(source) if source is not None else None
    out: list[dict[str, Any]] = []
    for t in reversed(chain):
        cloned = t.user_attrs.get(PBT_CLONE_ATTR)
        if out and not cloned:  # continues the segment's last trial from its own checkpoint, with its params
            out[-1]["trials"].append(t.number)
        else:
            out.append({"trials": [t.number], "params": dict(t.params),
                        "from_step": cloned["donor_step"] if cloned else None, "to_step": None, "cloned": cloned})
        out[-1]["to_step"] = t.user_attrs.get(PAUSED_ATTR) if t.number != number else None
    return out
