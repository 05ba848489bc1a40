"""PyTorch Lightning glue for one trial of a sweep, on every rank of a torchrun world.

A trial's task function builds its ``Trainer`` inside :func:`lightning_trial_scope` and passes the
callback of :func:`lightning_pruning_callback`::

    with lightning_trial_scope() as scope:
        pruning = lightning_pruning_callback(monitor="val_acc")
        trainer = scope.track(L.Trainer(strategy="ddp", callbacks=[pruning], ...))
        trainer.fit(model, train_loader, val_loader)
        pruning.raise_if_pruned()
    # here: the Trainer released, the process state the fit changed put back, memory trimmed

Under torchrun Lightning finds ``TorchElasticEnvironment`` and does not spawn; it reuses the sweeper's default
process group ("already initialized"), and its DDP teardown leaves it alone (checked with lightning 2.6.6). What
one ``Trainer.fit`` leaves behind in the process, and what the scope does about it (each checked by
``tests/multirank/test_lightning.py`` or read in lightning 2.6.6's source):

- ``seed_everything`` sets ``PL_GLOBAL_SEED`` and ``PL_SEED_WORKERS`` in ``os.environ`` and reseeds
  ``random``, numpy and torch (a later trial that does not seed would inherit the data order); the scope
  restores the environment and the three generators' states.
- ``Trainer(deterministic=...)`` calls ``torch.use_deterministic_algorithms`` and may set
  ``CUBLAS_WORKSPACE_CONFIG``; ``benchmark`` sets ``torch.backends.cudnn.benchmark``; the scope restores them.
- The ``Trainer`` keeps the model, optimizers, dataloaders and logged tensors; after the scope it holds none
  of them, then ``gc.collect()``, glibc's ``malloc_trim(0)`` and, with CUDA, ``empty_cache()``.
- Lightning's SIGTERM handler for the length of ``fit`` calls ``dist.broadcast`` from inside the handler
  (``trainer/connectors/signal_connector.py``), a collective that can pair with an unrelated one on another
  rank. In a sweep the callback puts the sweeper's handler back when training starts, so SIGTERM means what
  docs/reference/failures.md says; outside a sweep Lightning's handling is left as it is.
- Lightning prints the same lines at every ``Trainer`` (``GPU available: ...``) and the same deprecation
  warnings at every ``fit``; the scope shows each once per process (rank 0 only, as Lightning prints them).
- Destroying the default process group in the task breaks the next trial (case C24); the sweeper names it
  with ``ProcessGroupMisuseError``.

lightning and torch are imported inside functions only.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import signal
import sys
from typing import Any, Iterator, Optional

from .._comm._signals import restore_handler
from .._errors import GlueConfigError, MetricNotLoggedError
from .._task._slot import record_optimizer_steps
from .._tracking._task_env import retarget_loggers
from ._memory import TrainerSlot, cuda_in_use, freeze_survivors_once, gpu_peak_of_trial, release_memory
from ._once import OncePerText, library_warnings_once
from ._pruning_policy import callback_policy
from ._resume import lightning_track

log = logging.getLogger(__name__)

#: What :func:`lightning_pruning_callback` reports as the step of each intermediate value.
STEP_KINDS = ("epoch", "global_step")


@functools.lru_cache(maxsize=None)
def _callback_class() -> type:
    """The callback class, defined on first use (``lightning`` is imported then)."""
    from lightning.pytorch import Callback

    class RankConsistentPruning(Callback):
        """Report ``monitor`` after each validation; stop every rank alike on a prune verdict."""

        def __init__(self, monitor: str, step: str) -> None:
            self.monitor = monitor
            self.step = step
            self.pruned_at: Optional[int] = None
            self.stopped_global_step: Optional[int] = None

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            if callback_policy().sweeper_runs:  # a plain run or a rerun line keeps Lightning's own SIGTERM handling
                _keep_the_sweepers_sigterm_handler(trainer)

        def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
            if trainer.sanity_checking or self.pruned_at is not None:
                return
            policy = callback_policy()
            trial = policy.report_to  # None: stand aside (._pruning_policy)
            at = int(trainer.current_epoch if self.step == "epoch" else trainer.global_step)
            if trial is None:
                if policy.progress_to is not None:  # a refit: the step only (a replayed PBT schedule pauses on it)
                    policy.progress_to.note_step(at)
                return
            metrics = trainer.callback_metrics
            if self.monitor not in metrics:
                raise MetricNotLoggedError(
                    f"pruning metric {self.monitor!r} was not logged; logged metrics: {sorted(metrics)} "
                    "(log it in validation_step with self.log(..., sync_dist=True))"
                )
            trial.report(float(metrics[self.monitor]), at)
            if trial.should_prune():
                self.pruned_at = at
                trainer.should_stop = True

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            self.stopped_global_step = int(trainer.global_step)
            record_optimizer_steps(trainer.global_step)

        def raise_if_pruned(self) -> None:
            """Raise ``optuna.TrialPruned`` (on every rank alike) when training was stopped by a prune."""
            if self.pruned_at is not None:
                import optuna

                raise optuna.TrialPruned(f"pruned at {self.step} {self.pruned_at}")

    return RankConsistentPruning


def lightning_pruning_callback(monitor: str = "val_acc", step: str = "epoch") -> Any:
    """Build the callback for one ``lightning.pytorch.Trainer``.

    At the end of each validation (the sanity check excepted) it reports
    ``trainer.callback_metrics[monitor]`` to the running trial; the pruner's verdict is decided on rank 0
    and received by every rank (:class:`~hydra_plugins.ds_optuna_sweeper.RankTrial`), and on "prune"
    every rank sets ``trainer.should_stop``, so all ranks leave ``fit`` after the same validation.
    Optuna's own ``PyTorchLightningPruningCallback`` decides on each rank from its own metrics (and
    needs a storage every rank can reach), so ranks could disagree; here they cannot.

    Args:
        monitor: the logged metric to report (``self.log("val_acc", ..., sync_dist=True)`` in
            ``validation_step``: with ``sync_dist`` every rank logs the same value; without it rank 0's
            own value is reported). The study's direction decides what is better.
        step: ``"epoch"`` (``trainer.current_epoch``, what Optuna's Lightning callback reports, so
            trials with other batch sizes are compared at the same epoch) or ``"global_step"``
            (``trainer.global_step``, optimizer steps; use it with several validations per epoch).

    Returns:
        A ``lightning.pytorch.Callback`` with ``pruned_at`` (the step of the prune verdict, or
        ``None``), ``stopped_global_step`` and :meth:`raise_if_pruned`, to call after ``fit``. Outside
        a sweep, and in a refit or rerun (a replayed trial), it does nothing.

    Raises:
        GlueConfigError: (a ``ValueError``) for an unknown ``step``.
        MetricNotLoggedError: (a ``KeyError``) at the first validation, on every rank, if ``monitor``
            was not logged; the message lists the logged keys.
    """
    if step not in STEP_KINDS:
        raise GlueConfigError(f"step={step!r}: choose one of {', '.join(STEP_KINDS)}")
    return _callback_class()(monitor, step)


def _keep_the_sweepers_sigterm_handler(trainer: Any) -> None:
    """Put back the SIGTERM handler that was in place before ``fit`` (see the module docstring), from
    ``trainer._signal_connector._original_handlers`` (Lightning restores the rest at teardown). Main thread only;
    nothing is done when Lightning's layout differs."""
    connector = getattr(trainer, "_signal_connector", None)
    original = getattr(connector, "_original_handlers", {}).get(signal.SIGTERM)
    if original is not None:
        restore_handler(signal.SIGTERM, original)


class LightningTrialScope(TrainerSlot):
    """What :func:`lightning_trial_scope` releases when the trial ends: at most one ``lightning.pytorch.Trainer``."""

    scope_name = "lightning_trial_scope"

    def track(self, trainer: Any) -> Any:
        """Register ``trainer`` for release when the scope ends and return it. In a sweep's trial its ``fit``
        saves and stops on ``should_preempt()`` and resumes (:mod:`._resume`); with ``hydra.sweeper.tracking``
        its loggers write into the trial's run (:func:`.._tracking._task_env.retarget_loggers`).

        Raises:
            GlueUsageError: (a ``RuntimeError``) if a Trainer is already tracked by this scope.
        """
        tracked = super().track(trainer)
        lightning_track(tracked, _keep_the_sweepers_sigterm_handler)
        retarget_loggers(tracked)
        return tracked


@contextlib.contextmanager
def lightning_trial_scope() -> Iterator[LightningTrialScope]:
    """Context manager around one Lightning trial: trial *k+1* starts from the process state trial *k*
    started from (the module docstring says what ``fit`` changes and what is put back on the way out, on
    success and on error). With CUDA in use the trial's peak allocated GPU memory is logged and stored on the
    trial. No message is exchanged between ranks.

    Yields:
        A :class:`LightningTrialScope`; pass the trial's Trainer to :meth:`LightningTrialScope.track`.
    """
    logger = logging.getLogger(_LIGHTNING_INFO_LOGGER)  # Lightning's repeated lines, once (any level)
    if not any(isinstance(f, OncePerText) for f in logger.filters):
        logger.addFilter(OncePerText(min_level=logging.NOTSET))
    freeze_survivors_once(_trial_types())  # the last trial's Trainer may have been the task's local
    scope = LightningTrialScope()
    saved = _ProcessState()
    try:
        with gpu_peak_of_trial(), library_warnings_once(LIGHTNING_PACKAGES):
            yield scope
    finally:
        _free_trainer_by_graph_walk(scope._take())
        saved.restore()
        release_memory(_trial_types())


#: Lightning's informational logger (``rank_zero_info``); its own module sets the name.
_LIGHTNING_INFO_LOGGER = "lightning.pytorch.utilities.rank_zero"
#: Lightning's top-level packages, whose warnings the scope shows once per process.
LIGHTNING_PACKAGES = ("lightning", "lightning_fabric", "pytorch_lightning")


class _ProcessState:
    """The process-wide state one ``Trainer.fit`` may change, saved on entry and put back on exit."""

    def __init__(self) -> None:
        import torch

        self.environ = dict(os.environ)
        self.python_rng = random.getstate()
        numpy = sys.modules.get("numpy")
        self.numpy_rng = numpy.random.get_state() if numpy is not None else None
        self.torch_rng = torch.random.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if cuda_in_use() is not None else None
        self.deterministic = torch.are_deterministic_algorithms_enabled()
        self.deterministic_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        self.cudnn = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)

    def restore(self) -> None:
        import torch

        for key in set(os.environ) - set(self.environ):
            del os.environ[key]
        for key, value in self.environ.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        random.setstate(self.python_rng)
        if self.numpy_rng is not None:
            sys.modules["numpy"].random.set_state(self.numpy_rng)
        torch.random.set_rng_state(self.torch_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        torch.use_deterministic_algorithms(self.deterministic, warn_only=self.deterministic_warn_only)
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = self.cudnn


def _free_trainer_by_graph_walk(trainer: Any) -> None:
    """Cut the Trainer's references to the trial's model, optimizers, schedulers and data (it may outlive the
    trial in the caller's frame).

    The Trainer reaches the model from many places (strategy, loops' data sources, the data connector's hook
    selector, in lightning 2.6.6), so rather than a list of private attribute names every object of Lightning's
    own reachable from it through attributes is visited, and each attribute holding a module, optimizer, LR
    scheduler, ``DataLoader`` or ``LightningDataModule`` (or a list or tuple of them) is set to :obj:`None` (an
    empty list). ``global_step``, ``current_epoch`` and ``callback_metrics`` still read.
    """
    if trainer is None:
        return
    import torch
    from lightning.pytorch import LightningDataModule

    heavy = (torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler,
             torch.utils.data.DataLoader, LightningDataModule)
    seen: set[int] = set()
    stack = [trainer]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or not hasattr(obj, "__dict__"):
            continue
        seen.add(id(obj))
        attrs = vars(obj)
        for name, value in list(attrs.items()):
            if isinstance(value, heavy):
                attrs[name] = None
            elif isinstance(value, (list, tuple)) and value and all(isinstance(v, heavy) for v in value):
                attrs[name] = []
            else:
                items = value if isinstance(value, (list, tuple)) else (value,)
                stack.extend(v for v in items if type(v).__module__.startswith(("lightning.", "pytorch_lightning.")))


def _trial_types() -> tuple[type, ...]:
    """What a Lightning trial builds and must not outlive it (``release_memory`` freezes nothing while
    one is alive): Lightning's ``Trainer`` and ``LightningModule``, ``torch.nn.Parameter``."""
    import torch
    from lightning.pytorch import LightningModule, Trainer

    return (Trainer, LightningModule, torch.nn.Parameter)

