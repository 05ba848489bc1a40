"""Checkpoint, preempt and resume for both glues, with no user code beyond ``scope.track(trainer)``.

In a sweep's trial (and in a refit with ``refit.from_checkpoint``), the tracked Trainer:

- **saves where the trial's retries look**: the HF glue's ``build_training_arguments`` makes the trial's
  ``checkpoint_dir`` the Trainer's ``output_dir`` (its ``checkpoint-<step>`` directories land there, with
  ``save_total_limit=1`` unless the config sets it); Lightning's preemption checkpoint is
  ``<checkpoint_dir>/step=<global step>.ckpt``;
- **stops on preemption**: a callback asks ``trial.should_preempt()`` after every optimizer step (a
  collective: every rank gets the same answer at the same step); on True it saves a checkpoint (HF:
  ``control.should_save``, so the Trainer writes ``checkpoint-<step>`` with its optimizer, scheduler, RNG and
  DeepSpeed ZeRO state; Lightning: ``trainer.save_checkpoint``) and stops training on every rank;
- **resumes**: ``trainer.train()`` (HF) / ``trainer.fit(...)`` (Lightning) called without a checkpoint
  argument get ``resume_from_checkpoint`` / ``ckpt_path`` = ``trial.resume_from``, and raise
  :class:`~.._errors.TrialPreempted` after a preempted run, so the task stops there on every rank.

Outside a sweep (a plain run, a rerun line) nothing changes. Only the standard library at module level.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable, Optional

from .._errors import TrialPreempted
from .._task._slot import current_trial, run_by_sweeper

log = logging.getLogger(__name__)

#: The HF ``save_total_limit`` the glue sets when the config does not: the trial keeps its newest checkpoint.
SAVE_TOTAL_LIMIT = 1


def trial_with_checkpoints() -> Any:
    """The running trial when it has a checkpoint directory (a sweep's trial, a refit ``from_checkpoint``),
    else ``None``."""
    if not run_by_sweeper():
        return None
    trial = current_trial()
    return trial if trial.checkpoint_dir else None


def hf_checkpoint_args(training: dict[str, Any]) -> dict[str, Any]:
    """TrainingArguments the HF glue adds in a trial with checkpoints: ``output_dir`` = the trial's
    ``checkpoint_dir``, ``save_total_limit`` = :data:`SAVE_TOTAL_LIMIT` unless ``training`` sets one."""
    trial = trial_with_checkpoints()
    if trial is None:
        return {}
    extra: dict[str, Any] = {"output_dir": trial.checkpoint_dir}
    if training.get("save_total_limit") is None:
        extra["save_total_limit"] = SAVE_TOTAL_LIMIT
    return extra


def resuming(run: Callable[..., Any], argument: str, position: int, where: Callable[[], str]) -> Callable[..., Any]:
    """``run`` (a bound ``train``/``fit``) that resumes from ``trial.resume_from`` when the caller names no
    checkpoint (keyword ``argument`` or positional index ``position``), and raises :class:`TrialPreempted`
    after a run that stopped on ``should_preempt()`` (``where()`` says at which step)."""

    @functools.wraps(run)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        trial = trial_with_checkpoints()
        if trial is not None and trial.resume_from and argument not in kwargs and len(args) <= position:
            kwargs[argument] = trial.resume_from
            if trial.rank == 0:  # said once per trial, not per rank
                log.info("trial %d resumes from %s", trial.number, trial.resume_from)
        result = run(*args, **kwargs)
        if trial is not None and trial.preempted:
            raise TrialPreempted(f"trial {trial.number} stopped on should_preempt() at {where()}; its checkpoint "
                                 f"is in {trial.checkpoint_dir}, and its retry resumes from there")
        return result

    return wrapper


def hf_track(trainer: Any) -> None:
    """Add the preemption callback to an HF ``Trainer`` and make its ``train`` resume."""
    if trial_with_checkpoints() is None:
        return
    trainer.add_callback(_hf_callback_class()())
    trainer.train = resuming(trainer.train, "resume_from_checkpoint", 0,
                             lambda: f"global step {trainer.state.global_step}")


@functools.lru_cache(maxsize=None)
def _hf_callback_class() -> type:
    from transformers import TrainerCallback

    class PreemptionCallback(TrainerCallback):
        """After each optimizer step: on ``should_preempt()``, save a checkpoint and stop, on every rank.
        At the start of a refit that resumed at or past this run's last step, warn (:func:`warn_refit_at_end`)."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            trial = trial_with_checkpoints()
            warn_refit_at_end(trial, state.global_step, state.max_steps)
            lr = getattr(args, "learning_rate", None)
            if trial is not None and trial.resume_from and lr is not None:
                apply_learning_rate(float(lr), kwargs.get("optimizer"), kwargs.get("lr_scheduler"), say=trial.rank == 0)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            trial = trial_with_checkpoints()
            if trial is not None and trial.should_preempt():
                control.should_save = True
                control.should_training_stop = True

    return PreemptionCallback


def apply_learning_rate(lr: float, optimizer: Any, scheduler: Any, say: bool = True) -> bool:
    """Make ``lr`` (this trial's ``learning_rate``) the peak learning rate of a run resumed from a checkpoint.

    The Trainer loads the checkpoint's optimizer and scheduler state before ``on_train_begin``, so a PBT member
    that continues another member's checkpoint with a new learning rate (``hydra/sweeper/scheduler=pbt``) would
    train with the old one. This sets the scheduler's ``base_lrs`` to ``lr`` (scaled alike when the groups' rates
    differ) and each group's rate to ``get_lr()`` at the scheduler's step, on the optimizer the schedule drives
    (under DeepSpeed, its ZeRO optimizer; accelerate's wrappers are looked through). A DeepSpeed scheduler keeps
    no rate in its state: nothing to do then. ``say``: log the change. Returns whether it changed a rate.
    """
    while scheduler is not None and not hasattr(scheduler, "base_lrs") and hasattr(scheduler, "scheduler"):
        scheduler = scheduler.scheduler  # accelerate's AcceleratedScheduler / DeepSpeedSchedulerWrapper
    optimizer = getattr(scheduler, "optimizer", optimizer)  # the one whose groups the schedule sets
    base = list(getattr(scheduler, "base_lrs", None) or [])
    if not base or optimizer is None or all(b == lr for b in base):
        return False
    import warnings

    scheduler.base_lrs = [lr * b / base[0] if base[0] else lr for b in base]
    with warnings.catch_warnings():  # torch warns that get_lr() is meant for step(); it is the rate at this step
        warnings.simplefilter("ignore")
        rates = list(scheduler.get_lr())
    for group, rate, start in zip(optimizer.param_groups, rates, scheduler.base_lrs):
        group["lr"], group["initial_lr"] = rate, start
    scheduler._last_lr = rates  # what get_last_lr() and the Trainer's logged learning_rate read
    if say:  # the trial's rank 0 says it, once
        log.info("the learning rate of this run is %g (the checkpoint it resumed from held %g)", lr, base[0])
    return True


def warn_refit_at_end(trial: Any, global_step: int, max_steps: int) -> bool:
    """Warn when a refit (``refit.from_checkpoint``) resumed at or past its run's last optimizer step.

    The Trainer then trains no step and the task scores the trial's model as the checkpoint holds it, which a
    refit meant to train on more data (``refit.overrides`` with the same schedule) does not want. Returns True
    when it warned; a live trial (a retry resuming at its end) never warns.
    """
    if trial is None or not trial.replayed or not trial.resume_from or global_step < max_steps:
        return False
    log.warning("the refit of trial %d resumes from %s at global step %d of this run's %d (max_steps): it trains no "
                "step and scores the trial's model as it is; to train on, raise training.num_train_epochs or "
                "training.max_steps in hydra.sweeper.refit.overrides, or set hydra.sweeper.refit.from_checkpoint="
                "false to train from scratch", trial.number, trial.resume_from, global_step, max_steps)
    return True


def lightning_track(trainer: Any, keep_sigterm_handler: Callable[[Any], None]) -> None:
    """Add the preemption callback to a Lightning ``Trainer`` and make its ``fit`` resume (``ckpt_path``).
    ``keep_sigterm_handler(trainer)`` runs when training starts: Lightning's own SIGTERM handler for the
    length of ``fit`` would otherwise take the signal the flag needs (``_lightning.py``)."""
    if trial_with_checkpoints() is None:
        return
    trainer.callbacks.append(_lightning_callback_class()(keep_sigterm_handler))
    trainer.fit = resuming(trainer.fit, "ckpt_path", 4, lambda: f"global step {trainer.global_step}")


@functools.lru_cache(maxsize=None)
def _lightning_callback_class() -> type:
    from lightning.pytorch import Callback

    class LightningPreemption(Callback):
        """After each training batch: on ``should_preempt()``, ``save_checkpoint`` and stop, on every rank."""

        def __init__(self, keep_sigterm_handler: Callable[[Any], None]) -> None:
            self.saved: Optional[str] = None
            self._keep_sigterm_handler = keep_sigterm_handler

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self._keep_sigterm_handler(trainer)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            trial = trial_with_checkpoints()
            if trial is None or self.saved is not None or not trial.should_preempt():
                return
            self.saved = os.path.join(trial.checkpoint_dir, f"step={int(trainer.global_step)}.ckpt")
            trainer.save_checkpoint(self.saved)  # every rank calls it; rank 0 writes
            trainer.should_stop = True

    return LightningPreemption
