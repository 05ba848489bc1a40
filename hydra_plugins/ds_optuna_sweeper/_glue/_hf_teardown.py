"""Teardown of the Hugging Face glue: what one trial leaves in a rank process is released before the
next one starts (case C14).

The functions below :func:`teardown_trial` reach into DeepSpeed, transformers and accelerate internals, one
function each, and ``tests/test_transformers_unit.py`` keeps a sentinel test per internal. torch, transformers,
accelerate and DeepSpeed are imported inside functions only (or read from ``sys.modules``).

The process patches :func:`~._hf_args.build_training_arguments` applies in DeepSpeed and ``os.environ`` so a trial
can start under the sweeper are here too (``_hf.py``, "Decisions"); each is idempotent, a no-op when not needed.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterator

from .._errors import UpstreamChangedError
from ._memory import TrainerSlot, alive, freeze_survivors_once, gpu_peak_of_trial, release_memory
from ._once import library_logs_once, library_warnings_once
from ._resume import hf_track

if TYPE_CHECKING:
    from transformers import Trainer


class TrialScope(TrainerSlot):
    """What :func:`trial_scope` tears down when the trial ends: at most one ``transformers.Trainer``."""

    scope_name = "trial_scope"

    def track(self, trainer: Any) -> Any:
        """Register ``trainer`` for teardown when the scope ends and return it; the loggers of the modules
        the Trainer imported now show each warning once (case C48). In a sweep's trial its ``train()`` saves
        and stops on ``should_preempt()`` and resumes (:mod:`._resume`).

        Raises:
            GlueUsageError: (a ``RuntimeError``) If a Trainer is already tracked by this scope.
        """
        tracked = super().track(trainer)
        library_logs_once()
        hf_track(tracked)
        return tracked


@contextlib.contextmanager
def trial_scope() -> Iterator[TrialScope]:
    """Context manager around one trial that calls :func:`teardown_trial` when the trial ends.

    Teardown runs on success and on error. The caller's own references (a local ``trainer`` or ``model`` in
    the same function) keep those objects alive: build them in a function called inside the scope, or
    ``del`` them before it ends; :func:`teardown_trial` still releases the engine and the Trainer's contents.

    Library noise (case C48): inside the scope, teardown included, each distinct warning and logged warning
    text of transformers, accelerate, DeepSpeed, torch, the HF hub, safetensors and tokenizers is shown once
    per process (``_once.py``), not at every trial or step.

    Yields:
        A :class:`TrialScope`; pass the trial's Trainer to :meth:`TrialScope.track`.
    """
    freeze_survivors_once(_trial_types())  # the last trial's Trainer may have been the task's local
    scope = TrialScope()
    library_logs_once()
    with library_warnings_once():
        try:
            with gpu_peak_of_trial():
                yield scope
        finally:
            teardown_trial(scope._take())  # no local reference, so the Trainer itself is collected too


def teardown_trial(trainer: Trainer | None = None) -> None:
    """Release what one trial left in this process, so the next trial starts clean (case C14).

    Call it on every rank after each trial (:func:`trial_scope` does). In order:

    1. the Trainer's DeepSpeed engine is destroyed (``accelerator.free_memory()``, which also drops
       accelerate's lists of prepared objects), and the Trainer's references to model, engine, optimizer,
       scheduler and dataloaders are set to :obj:`None`, so the Trainer is unusable afterwards;
    2. the ZeRO-3 module-level holders that keep engines alive are cleared (see docs/deepspeed-cpu.md);
    3. ``transformers.integrations.deepspeed.unset_hf_deepspeed_config()``, so a model built later is not
       created under an earlier trial's ZeRO-3 partitioned init (huggingface/transformers#11894);
    4. accelerate's ``AcceleratorState`` and ``GradientState`` are reset (its ``PartialState`` and the
       process group are kept);
    5. ``gc.collect()``, glibc's ``malloc_trim(0)``, and once ``gc.freeze()`` (``_memory.release_memory``);
    6. with CUDA in use, ``torch.cuda.empty_cache()``.

    Args:
        trainer:
            The trial's Trainer, or :obj:`None` to only reset the global state (steps 2 to 5).
    """
    if trainer is not None:
        _free_trainer_by_attribute_list(trainer)
    _clear_deepspeed_zero3_holders()
    hf_ds = sys.modules.get("transformers.integrations.deepspeed")
    if hf_ds is not None:
        hf_ds.unset_hf_deepspeed_config()
    _reset_accelerate_state()
    del trainer
    release_memory(_trial_types())


def _trial_types() -> tuple[type, ...]:
    """What a transformers trial builds and must not outlive it: ``Trainer``, ``torch.nn.Parameter`` and,
    once imported, ``DeepSpeedEngine`` (``release_memory`` freezes nothing while one is alive)."""
    import torch
    from transformers import Trainer

    engine = getattr(sys.modules.get("deepspeed.runtime.engine"), "DeepSpeedEngine", None)
    return (Trainer, torch.nn.Parameter) + ((engine,) if engine is not None else ())


def live_deepspeed_engines() -> int:
    """The number of ``deepspeed.DeepSpeedEngine`` objects alive in this process, after ``gc.collect()``.

    Meant for tests and leak checks; it walks every object the garbage collector tracks (tens of ms).

    Returns:
        The count; 0 when DeepSpeed's engine module was never imported.
    """
    engine_module = sys.modules.get("deepspeed.runtime.engine")
    if engine_module is None:
        return 0
    gc.collect()
    return alive((engine_module.DeepSpeedEngine,))


def _free_trainer_by_attribute_list(trainer: Trainer) -> None:
    """Destroy the Trainer's DeepSpeed engine and set a fixed list of the Trainer's (and its callback
    handler's) attributes to :obj:`None`: model, engine, optimizer, scheduler, dataloaders."""
    accelerator = getattr(trainer, "accelerator", None)
    engine = getattr(accelerator, "deepspeed_engine_wrapped", None)
    if accelerator is not None:
        _free_accelerator(accelerator)
    if engine is None:
        # The Trainer prepared the engine without accelerate's wrapper (or never trained): destroy it here.
        candidate = getattr(trainer, "model_wrapped", None)
        if candidate is not None and hasattr(candidate, "destroy") and hasattr(candidate, "zero_optimization"):
            candidate.destroy()
    for name in ("model", "model_wrapped", "deepspeed", "optimizer", "lr_scheduler"):
        if hasattr(trainer, name):
            setattr(trainer, name, None)
    handler = getattr(trainer, "callback_handler", None)
    for name in ("model", "optimizer", "lr_scheduler", "train_dataloader", "eval_dataloader", "processing_class"):
        if handler is not None and hasattr(handler, name):
            setattr(handler, name, None)


def _free_accelerator(accelerator: Any) -> None:
    """``Accelerator.free_memory()`` without its ``gc.collect()``: destroy the DeepSpeed engine it wrapped and
    empty its lists of prepared models, optimizers, schedulers and dataloaders (accelerate 1.x's own steps).

    ``teardown_trial`` collects once, after every reference is dropped; ``free_memory`` collecting too cost
    a second full collection per trial (0.45 s of 10 on 2 CPU ranks, py-spy; docs/performance.md, "Performance").
    ``tests/test_transformers_unit.py`` fails when accelerate renames these attributes.
    """
    wrapped = getattr(accelerator, "deepspeed_engine_wrapped", None)
    if wrapped is not None:
        wrapped.engine.destroy()
    accelerator.deepspeed_engine_wrapped = None
    for name in ("_schedulers", "_optimizers", "_models", "_dataloaders"):
        if not isinstance(getattr(accelerator, name, None), list):
            raise UpstreamChangedError(
                f"accelerate.Accelerator.{name} is not a list any more: update _free_accelerator")
        setattr(accelerator, name, [])
    accelerator.step = 0


def _deepspeed_zero3_holders() -> tuple[list[Any], Callable[[], None]]:
    """The two DeepSpeed module-level objects that keep ZeRO-3 engines alive after ``engine.destroy()``.

    Checked with deepspeed 0.19.8: the list ``FWD_MODULE_STACK`` in ``deepspeed.runtime.zero.parameter_offload``
    (modules pushed in forward hooks, never emptied when a trial ends) and the unbounded
    ``functools.lru_cache`` behind ``PartitionedParameterCoordinator.__params_to_release`` in
    ``deepspeed.runtime.zero.partitioned_param_coordinator`` (class-level, so it holds every coordinator, and
    through them modules and parameters, ever used). ``tests/test_transformers_unit.py`` fails when DeepSpeed
    renames or removes them.

    Returns:
        ``(FWD_MODULE_STACK, cache_clear)``.

    Raises:
        UpstreamChangedError: (a ``RuntimeError``) If either is not where it was; the message names what
            is missing.
    """
    offload = importlib.import_module("deepspeed.runtime.zero.parameter_offload")
    coordinator = importlib.import_module("deepspeed.runtime.zero.partitioned_param_coordinator")
    stack = getattr(offload, "FWD_MODULE_STACK", None)
    if not isinstance(stack, list):
        raise UpstreamChangedError("deepspeed.runtime.zero.parameter_offload.FWD_MODULE_STACK is not a list any more")
    cls = getattr(coordinator, "PartitionedParameterCoordinator", None)
    method = vars(cls).get("_PartitionedParameterCoordinator__params_to_release") if cls else None
    cached = _find_lru_cache(method)
    if cached is None:
        raise UpstreamChangedError(
            "no functools.lru_cache behind deepspeed.runtime.zero.partitioned_param_coordinator."
            "PartitionedParameterCoordinator.__params_to_release any more"
        )
    return stack, cached.cache_clear


def _find_lru_cache(func: Any, depth: int = 4) -> Any:
    """The ``functools.lru_cache`` wrapper inside ``func``, through ``__wrapped__`` and closures (DeepSpeed's
    ``instrument_w_nvtx`` wraps the cached function without ``functools.wraps``)."""
    if func is None or depth < 0:
        return None
    if hasattr(func, "cache_clear"):
        return func
    cells = getattr(func, "__closure__", None) or ()
    inner = [getattr(func, "__wrapped__", None), *(getattr(cell, "cell_contents", None) for cell in cells)]
    for candidate in inner:
        found = _find_lru_cache(candidate, depth - 1)
        if found is not None:
            return found
    return None


def _clear_deepspeed_zero3_holders() -> None:
    """Empty :func:`_deepspeed_zero3_holders` if ZeRO-3 code was ever imported; warn if they moved."""
    if "deepspeed.runtime.zero.parameter_offload" not in sys.modules:
        return
    try:
        stack, cache_clear = _deepspeed_zero3_holders()
    except UpstreamChangedError as e:
        warnings.warn(
            f"{e}: ZeRO-3 engines may stay in memory after each trial with this DeepSpeed version",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    stack.clear()
    cache_clear()


def _reset_accelerate_state() -> None:
    """Reset accelerate's ``AcceleratorState`` and ``GradientState`` singletons, keep ``PartialState``.

    Both are Borg singletons (``self.__dict__ = cls._shared_state``): ``AcceleratorState`` keeps the last
    trial's DeepSpeed plugin (and its config) alive, ``GradientState`` its dataloaders. ``_reset_state`` is
    documented "should not be called", yet transformers calls it in ``TrainingArguments._setup_devices``;
    ``reset_partial_state=False`` keeps the process group and rank information.
    ``tests/test_transformers_unit.py`` fails when accelerate changes these.
    """
    state = sys.modules.get("accelerate.state")
    if state is None:
        return
    state.AcceleratorState._reset_state(reset_partial_state=False)
    state.GradientState._reset_state()


def skip_deepspeed_shm_build() -> None:
    """Make DeepSpeed's CPU comm backend skip its JIT build of the ``deepspeed_shm_comm`` op.

    ``deepspeed.comm.torch.TorchBackend.__init__`` calls the module function ``build_shm_op()``, which returns
    :obj:`None` itself when the op is unavailable; we answer the same. ``import deepspeed.comm.torch as m``
    hands back the ``torch`` module (an attribute shadows the submodule), hence ``import_module``.
    """
    comm_torch = importlib.import_module("deepspeed.comm.torch")
    if getattr(comm_torch.build_shm_op, "_dso_skipped", False):
        return

    def build_shm_op() -> None:
        return None

    build_shm_op._dso_skipped = True  # type: ignore[attr-defined]
    comm_torch.build_shm_op = build_shm_op


def init_deepspeed_comm() -> None:
    """Initialise ``deepspeed.comm`` on the process group accelerate created, if it is not yet.

    On CPU (``use_cpu=True``) accelerate creates the torch process group itself and leaves ``deepspeed.comm``
    uninitialised until the engine is built. ZeRO-3's partitioned init (``deepspeed.zero.Init`` inside
    ``from_pretrained``) runs before that, reads the world size from ``deepspeed.comm``, falls back to 1, and
    fails every rank with "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step *
    world_size 16 != 8 * 1 * 1" when the first trial of a process is a ZeRO-3 trial (seen with deepspeed
    0.19.8, transformers 5.24.0, accelerate 1.15.0, 2 ranks). With a group present DeepSpeed wraps it.
    """
    import deepspeed.comm as ds_comm
    import torch.distributed as dist

    if ds_comm.is_initialized() or not dist.is_initialized():
        return
    ds_comm.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False, verbose=False)


def single_process_env() -> None:
    """Give DeepSpeed a one-process world when the script was started without a launcher.

    DeepSpeed needs ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; without them it
    tries MPI discovery. Does nothing under torchrun (``WORLD_SIZE`` is set) or once a group exists.
    """
    dist = sys.modules.get("torch.distributed")
    if "WORLD_SIZE" in os.environ or (dist is not None and dist.is_initialized()):
        return
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
