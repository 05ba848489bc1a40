"""Rank 0 only: each trial's checkpoint directory when it is asked, and the retention rule after each tell.

**At ask** (:func:`checkpoint_of`): a new trial gets ``<root>/trial<number>`` (root: ``checkpoints.dir``,
else ``<sweep dir>/checkpoints``), stored as its user attribute :data:`._stored.CHECKPOINT_DIR_ATTR`. A
retry (Optuna's retry callback copies the user attributes, optuna/storages/_callbacks.py) keeps the directory,
so the task resumes from the newest complete checkpoint the earlier attempt saved, and the inherited
intermediate values are handed to every rank so ``report`` at those steps is skipped.

**After each tell** (:func:`retain`), the default rule an experienced user expects (docs/how-to/checkpoints.md, "Checkpoints"):

- a live trial (RUNNING, or interrupted and re-queued) keeps its directory; the Trainer's
  ``save_total_limit`` (the HF glue sets 1 by default) keeps its newest checkpoint only;
- a COMPLETE trial keeps its newest checkpoint while it is among the ``keep_best`` best COMPLETE trials
  (single objective; with several objectives, the Pareto front), and loses its directory when it drops out;
- a PRUNED trial loses its directory (``keep_pruned=true`` keeps it), and so does a FAIL trial that nothing
  retries (its task raised: the same params would fail again), except a paused trial (ASHA) and the failed
  continuation of one (the directory is the paused trial's, which may be promoted once more).

Deleting never fails a trial: a directory that cannot be deleted is logged.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from .. import _upstream as upstream
from .._task import _checkpoints
from . import _queue
from ._stored import CHECKPOINT_DIR_ATTR, CONTINUES_ATTR, PAUSED_ATTR, PBT_CLONE_ATTR, RESUMED_FROM_ATTR

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrialCheckpoint:
    """What the task of one asked trial learns about its checkpoints (it travels in the trial's payload).

    Attributes:
        directory: the trial's checkpoint directory (absolute).
        resume_from: the newest complete checkpoint in it, or ``None``.
        continues: the number of the trial this one retries, or ``None``.
        inherited_steps: the steps of the intermediate values it inherited, ascending.
        first: the first trial of its lineage (:func:`._queue.lineage`; itself for a trial of its own), whose
            tracking run it writes to.
    """

    directory: str
    resume_from: str | None
    continues: int | None
    inherited_steps: tuple[int, ...]
    first: int


def checkpoint_root(configured: str | None, sweep_dir: str) -> str:
    """The parent of the trials' checkpoint directories: ``checkpoints.dir`` or ``<sweep dir>/checkpoints``."""
    return os.path.abspath(os.path.expanduser(configured) if configured else os.path.join(sweep_dir, "checkpoints"))


def checkpoint_of(trial: optuna.trial.Trial, stored: FrozenTrial, root: str) -> TrialCheckpoint:
    """The checkpoint directory of the asked ``trial`` (kept from the trial it retries, else under ``root``,
    :func:`checkpoint_root`), stored on the trial with, for a retry, the trial it continues and the checkpoint it
    resumes from. ``stored``: the trial as stored just after the ask (a retry's copied attributes and values).
    """
    directory = stored.user_attrs.get(CHECKPOINT_DIR_ATTR) or os.path.join(root, f"trial{trial.number}")
    continues = _queue.continues(stored)
    resume_from = _checkpoints.latest_checkpoint(directory)
    if stored.user_attrs.get(CHECKPOINT_DIR_ATTR) != directory:  # a retry holds it already (one write less)
        trial.set_user_attr(CHECKPOINT_DIR_ATTR, directory)
    if continues is not None:
        trial.set_user_attr(CONTINUES_ATTR, int(continues))
    if stored.user_attrs.get(PAUSED_ATTR) is not None:  # a promoted trial's continuation: not paused (yet)
        trial.set_user_attr(PAUSED_ATTR, None)
    clone = stored.user_attrs.get(PBT_CLONE_ATTR)
    cloned_here = bool(clone) and clone.get("continues") == continues  # else copied from the clone it continues
    if clone and not cloned_here:
        trial.set_user_attr(PBT_CLONE_ATTR, None)
    if resume_from is not None:
        trial.set_user_attr(RESUMED_FROM_ATTR, resume_from)
        source = f"trial {clone['from_trial']}'s checkpoint, copied to " if cloned_here else "its checkpoint "
        log.info("Trial %d continues trial %s from %s%s", trial.number, continues, source, resume_from)
    steps = tuple(sorted(int(s) for s in stored.intermediate_values))
    return TrialCheckpoint(directory, resume_from, None if continues is None else int(continues), steps,
                           int(_queue.lineage(stored)[0]))


def _holds_files(directory: str) -> bool:
    """Whether ``directory`` (a trial's checkpoint directory) holds a file at any depth."""
    return any(files for _, _, files in os.walk(directory))


def retain(study: optuna.Study, number: int, *, keep_best: int, keep_pruned: bool, retried: bool,
           told: FrozenTrial | None = None) -> list[str]:
    """Apply the retention rule (module docstring) after trial ``number`` was told; return what was deleted.

    Args:
        keep_best: ``checkpoints.keep_best`` (-1: every COMPLETE trial keeps its newest checkpoint).
        keep_pruned: ``checkpoints.keep_pruned``.
        retried: the trial was re-queued (interrupted): its directory belongs to its retry.
        told: the trial as the tell stored it (``None``: read it here).
    """
    try:
        trial: FrozenTrial = told if told is not None else upstream.stored_trial_by_number(study, number)  # type: ignore[assignment]
        directory = trial.user_attrs.get(CHECKPOINT_DIR_ATTR)
        if not directory or retried or not os.path.isdir(os.path.dirname(directory)):
            return []  # nothing to delete (no trial of this root saved anything): no study read either
        if trial.state == TrialState.FAIL and _continues_a_pause(study, trial):
            return []  # the paused trial's checkpoint: ASHA may promote it once more (_asha.continued)
        older: list[str] = []  # a COMPLETE trial's checkpoints before its newest
        doomed: list[str] = []  # whole trial directories
        if trial.state == TrialState.PRUNED and not keep_pruned or trial.state == TrialState.FAIL:
            doomed = [directory]
        elif trial.state == TrialState.COMPLETE:
            older = _checkpoints.keep_latest(directory, 1)
            doomed = list(_dropped_out(study, keep_best))
            if os.path.isdir(directory) and not _holds_files(directory):
                doomed.append(directory)  # kept or not, an empty directory keeps nothing (a new user's best trial)
        held = {d for d in doomed if _holds_files(d)}
        deleted = older + _checkpoints.remove_dirs(doomed)
        shown = [d for d in deleted if d in older or d in held]  # a task that never saved: no line per trial
        if shown:
            log.info("Checkpoints deleted by the retention rule (checkpoints.keep_best=%d, keep_pruned=%s): %s",
                     keep_best, keep_pruned, ", ".join(shown))
        return deleted
    except Exception:  # disk housekeeping never stops the sweep
        log.warning("the checkpoint retention rule failed after trial %d", number, exc_info=True)
        return []


def _continues_a_pause(study: optuna.Study, trial: FrozenTrial) -> bool:
    """``trial`` continues a trial that paused at an ASHA rung (its checkpoint directory is that trial's)."""
    parent = trial.user_attrs.get(CONTINUES_ATTR)
    if parent is None:
        return False
    return upstream.stored_trial_by_number(study, int(parent)).user_attrs.get(PAUSED_ATTR) is not None


def _dropped_out(study: optuna.Study, keep_best: int) -> list[str]:
    """Checkpoint directories of COMPLETE trials outside the ``keep_best`` best ones (none for -1)."""
    if keep_best < 0:
        return []
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(study.directions) == 1:
        reverse = study.direction == optuna.study.StudyDirection.MAXIMIZE
        kept = {t.number for t in sorted(complete, key=lambda t: _value(t), reverse=reverse)[:keep_best]}
    else:
        kept = {t.number for t in study.best_trials}
    return [t.user_attrs[CHECKPOINT_DIR_ATTR] for t in complete
            if t.number not in kept and t.user_attrs.get(CHECKPOINT_DIR_ATTR)]


def _value(trial: FrozenTrial) -> Any:
    return trial.value if trial.value is not None else float("nan")
