"""A Hugging Face ``TrainerCallback`` that reports each evaluation to the running trial and stops
training on every rank at the same step when the pruner says so.

transformers' own Optuna integration reports and prunes on rank 0 only, so the other ranks keep
training and the job hangs in the next collective (optuna/optuna-examples#101, transformers PR
#19096). Here every rank runs the callback; ``report`` and ``should_prune`` are collectives decided
on rank 0 (:class:`~hydra_plugins.ds_optuna_sweeper.RankTrial`), so all ranks see the same
verdict at the same evaluation.

transformers is imported inside :func:`pruning_callback`.
"""

from typing import Any, Optional

from ._trial import pruning_trial, record_optimizer_steps


def pruning_callback(metric: str = "eval_accuracy") -> Any:
    """Build the callback for one ``Trainer``.

    Args:
        metric: the key of the evaluation metrics to report (``eval_<name>`` as the Trainer logs it),
            e.g. ``eval_accuracy`` or ``eval_loss``. The study's direction decides what is better.

    Returns:
        A ``transformers.TrainerCallback`` with ``pruned_at`` (the global step of the prune verdict,
        or ``None``) and :meth:`raise_if_pruned`, to call after ``trainer.train()``. Outside a sweep
        (no current trial), in a refit or rerun line (a replayed trial, whatever its metrics are named)
        and in a study with several objectives it does nothing.

    Raises:
        KeyError: in a sweep's trial, at the first evaluation, on every rank, if ``metric`` is not among
            the metrics; the message lists the available keys.
    """
    from transformers import TrainerCallback

    class RankConsistentPruningCallback(TrainerCallback):
        """Report ``metric`` at each evaluation (step = global optimizer step); stop all ranks on prune."""

        def __init__(self) -> None:
            self.metric = metric
            self.pruned_at: Optional[int] = None

        def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Optional[dict] = None, **kwargs: Any) -> None:
            if self.pruned_at is not None:
                return
            # First: outside a sweep, with several objectives, or in a refit/rerun (a replayed trial, whose
            # evaluation may be named otherwise, e.g. test_*) there is nothing to report to.
            trial = pruning_trial()
            if trial is None:
                return
            metrics = metrics or {}
            if self.metric not in metrics:
                raise KeyError(f"pruning metric {self.metric!r} is not among the evaluation metrics {sorted(metrics)}")
            trial.report(float(metrics[self.metric]), int(state.global_step))
            if trial.should_prune():
                self.pruned_at = int(state.global_step)
                control.should_training_stop = True

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            record_optimizer_steps(state.global_step)

        def raise_if_pruned(self) -> None:
            """Raise ``optuna.TrialPruned`` (on every rank alike) when training was stopped by a prune."""
            if self.pruned_at is not None:
                import optuna

                raise optuna.TrialPruned(f"pruned at global step {self.pruned_at}")

    return RankConsistentPruningCallback()
