"""A Hugging Face ``TrainerCallback`` that reports each evaluation to the running trial and stops
training on every rank at the same step when the pruner says so.

transformers' own Optuna integration reports and prunes on rank 0 only, so the other ranks keep
training and the job hangs in the next collective (optuna/optuna-examples#101, transformers PR
#19096). Here every rank runs the callback; ``report`` and ``should_prune`` are collectives decided
on rank 0 (:class:`~hydra_plugins.ds_optuna_sweeper.RankTrial`), so all ranks see the same
verdict at the same evaluation.

transformers is imported inside :func:`pruning_callback`.
"""

import functools
from typing import TYPE_CHECKING, Any, Optional

from .._errors import GlueConfigError, MetricNotLoggedError
from .._task._slot import record_optimizer_steps
from ._pruning_policy import callback_policy

if TYPE_CHECKING:  # transformers is imported inside pruning_callback at run time
    from transformers import TrainerCallback

    class PruningCallback(TrainerCallback):
        """What :func:`pruning_callback` returns, for type checkers (the class is built at run time)."""

        pruned_at: Optional[int]
        reported_steps: list[int]

        def raise_if_pruned(self) -> None: ...

#: What :func:`pruning_callback` reports as the step of each intermediate value (see its ``step``).
STEP_KINDS = ("epoch", "samples", "global_step")

#: ``step="epoch"`` reports ``round(state.epoch * EPOCH_SCALE)``: thousandths of an epoch (epoch 1.0 -> 1000).
EPOCH_SCALE = 1000


def pruning_callback(metric: str = "eval_accuracy", step: str = "epoch") -> "PruningCallback":
    """Build the callback for one ``Trainer``.

    At each evaluation it reports ``metrics[metric]`` to the running trial at a training-progress step
    (``step``); the pruner's verdict is decided on rank 0 and received by every rank, and on "prune"
    every rank sets ``control.should_training_stop``, so all ranks stop after the same evaluation.

    Optuna's pruners compare trials by the values reported at the *same* step, so the step must mean the
    same point of training in every trial. The optimizer step does not: at gradient accumulation 2 (or a
    micro batch twice as large) a trial makes half as many optimizer steps per epoch, and its step 16 is
    another trial's step 32 of data seen. Hence the default, the epoch fraction.

    Args:
        metric: the key of the evaluation metrics to report (``eval_<name>`` as the Trainer logs it),
            e.g. ``eval_accuracy`` or ``eval_loss``. The study's direction decides what is better.
        step: what the reported int step counts:

            - ``"epoch"`` (default): thousandths of the Trainer's fractional epoch, ``round(state.epoch *
              1000)`` (:data:`EPOCH_SCALE`), the same share of the data whatever the accumulation or micro
              batch: evaluations at each quarter epoch report 250, 500, 750, 1000. A pruner's
              ``n_warmup_steps`` counts in the same unit (400: from 40 % of the first epoch on).
            - ``"samples"``: training samples seen over all ranks,
              ``global_step * per_device_train_batch_size * gradient_accumulation_steps * world_size``
              (the nominal count: an epoch's last, shorter batch counts as full). The same point for
              trials whose accumulation, micro batch or world size differ, whatever the dataset size.
            - ``"global_step"``: the optimizer step (``state.global_step``), as transformers' own
              integration reports; compares trials at the same point only when they share
              accumulation, micro batch and world size.

    Returns:
        A ``transformers.TrainerCallback`` with ``pruned_at`` (the reported step of the prune verdict,
        or ``None``), ``reported_steps`` (the steps reported so far, in order) and
        :meth:`raise_if_pruned`, to call after ``trainer.train()``. An evaluation at a step already
        reported (``trainer.evaluate()`` right after ``train()``) is neither reported again (Optuna keeps
        the first value) nor asked about pruning. Outside a sweep, in a refit or rerun line, and in a study
        with several objectives it does nothing (:mod:`._pruning_policy`).

    Raises:
        GlueConfigError: (a ``ValueError``) for an unknown ``step`` (at once, on every rank).
        MetricNotLoggedError: (a ``KeyError``) in a sweep's trial, at the first evaluation, on every rank, if
            ``metric`` is not among the metrics; the message lists the available keys.
    """
    if step not in STEP_KINDS:
        raise GlueConfigError(f"step={step!r}: choose one of {', '.join(STEP_KINDS)}")
    return _callback_class()(metric, step)


@functools.lru_cache(maxsize=None)
def _callback_class() -> type:
    """The class :func:`pruning_callback` instantiates, built once per process on transformers' ``TrainerCallback``."""
    from transformers import TrainerCallback

    class RankConsistentPruningCallback(TrainerCallback):
        """Report ``metric`` at each evaluation at a training-progress ``step``; stop all ranks on prune."""

        def __init__(self, metric: str, step: str) -> None:
            self.metric = metric
            self.step = step
            self.pruned_at: Optional[int] = None
            self.reported_steps: list[int] = []
            self._global_step_of: dict[int, int] = {}  # reported step -> optimizer step it was reported at

        def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Optional[dict] = None, **kwargs: Any) -> None:
            if self.pruned_at is not None:
                return
            policy = callback_policy()  # the rule first: a replayed trial's metrics may be named otherwise
            trial, at = policy.report_to, progress_step(self.step, args, state)
            if trial is None:
                if policy.progress_to is not None:  # a refit: the step only (a replayed PBT schedule pauses on it)
                    policy.progress_to.note_step(at)
                return
            metrics = metrics or {}
            if self.metric not in metrics:
                raise MetricNotLoggedError(f"pruning metric {self.metric!r} is not among the evaluation metrics {sorted(metrics)}")
            # The Trainer's state is the same on every rank, so every rank skips the same evaluations.
            if at in self._global_step_of:
                if self._global_step_of[at] != int(state.global_step):
                    _warn_coarse_step(self.step, at, self._global_step_of[at], int(state.global_step))
                return
            self._global_step_of[at] = int(state.global_step)
            self.reported_steps.append(at)
            trial.report(float(metrics[self.metric]), at)
            if trial.should_prune():
                self.pruned_at = at
                control.should_training_stop = True

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            record_optimizer_steps(state.global_step)

        def raise_if_pruned(self) -> None:
            """Raise ``optuna.TrialPruned`` (on every rank alike) when training was stopped by a prune."""
            if self.pruned_at is not None:
                import optuna

                raise optuna.TrialPruned(f"pruned at {_STEP_NAMES[self.step]} {self.pruned_at}")

    return RankConsistentPruningCallback


_STEP_NAMES = {"epoch": "epoch/1000", "samples": "samples seen", "global_step": "global step"}


def progress_step(kind: str, args: Any, state: Any) -> int:
    """The int step (>= 0) :func:`pruning_callback` reports for ``kind`` (one of :data:`STEP_KINDS`), from the
    Trainer's ``TrainingArguments`` (read for ``"samples"`` only) and ``TrainerState``. An evaluation before
    training (``state.epoch`` unset) is at step 0 for ``"epoch"``."""
    if kind == "global_step":
        return int(state.global_step)
    if kind == "samples":
        per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        return int(state.global_step) * int(per_step)
    return round(float(state.epoch or 0.0) * EPOCH_SCALE)


def _warn_coarse_step(kind: str, at: int, first_global_step: int, global_step: int) -> None:
    """Warn that an evaluation after more training was not reported: its ``kind`` step equals an earlier one."""
    import warnings

    warnings.warn(
        f"the pruning callback did not report the evaluation at global step {global_step}: with step={kind!r} "
        f"it falls on step {at}, already reported at global step {first_global_step} (evaluations less than "
        f"1/{EPOCH_SCALE} epoch apart); use pruning_callback(..., step='samples') for evaluations this close",
        UserWarning,
        stacklevel=3,
    )
