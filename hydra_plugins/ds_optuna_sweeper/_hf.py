"""Hugging Face Trainer + DeepSpeed glue for one trial of a sweep, on every rank of a torchrun world.

A trial's task function builds everything from its composed config, in this order::

    with trial_scope() as scope:
        args = build_training_arguments(cfg, output_dir)   # DeepSpeed dict, then set_seed(training.seed)
        model = AutoModel...from_pretrained(...)            # after the arguments: see below
        trainer = scope.track(Trainer(model=model, args=args, ...))
        trainer.train()
    # here: engine destroyed, ZeRO-3 holders cleared, accelerate/transformers globals reset, memory trimmed

Why this order:

- **Arguments before the model.** ``TrainingArguments(deepspeed=...)`` registers the DeepSpeed config in a
  transformers global that ``from_pretrained`` reads; a model built before the arguments of a ZeRO-2 trial
  that follows a ZeRO-3 trial is still created under ZeRO-3's partitioned init and the trial fails on every
  rank with ``RuntimeError: 'weight' must be 2-D`` (huggingface/transformers#11894, PR #11966 discussion).
- **Seed before the model** (case C04): :func:`build_training_arguments` ends with
  ``transformers.set_seed(training.seed)``, so the initial weights of a model built right after it depend
  only on the trial's seed and are equal on every rank. The Trainer's own ``set_seed`` runs after the model
  exists, too late for its initial weights.
- **One DeepSpeed dict from the same nodes as the arguments** (cases C02, C03, huggingface/transformers#34641):
  the ``deepspeed`` config node interpolates micro batch, gradient accumulation, learning rate, weight decay
  and gradient clipping from ``training.*``; :func:`deepspeed_config` adds ``train_batch_size`` and refuses
  any ``"auto"`` left in it, so the engine of trial *k* gets trial *k*'s values on every rank.
- **Deliberate teardown** (case C14): without it no engine is ever freed (about +95 MiB RSS per trial seen
  with an 8.5 M-parameter model), and ZeRO-3 engines stay reachable from two DeepSpeed module-level holders.

Decisions, with their costs:

- **No JIT-built DeepSpeed ops on CPU.** ``deepspeed.init_distributed()`` JIT-builds the ``deepspeed_shm_comm``
  op with g++ and ninja on CPU: 35-50 s on the first run on a machine (cached under
  ``~/.cache/torch_extensions/``, rebuilt after a DeepSpeed reinstall), and every rank fails where no compiler
  is installed. It only speeds up CPU all-reduce between ranks of one node through shared memory. By default
  :func:`build_training_arguments` replaces ``deepspeed.comm.torch.build_shm_op`` with a function returning
  :obj:`None` (DeepSpeed's own answer when the op is unavailable), so collectives go through gloo and a first
  run costs nothing extra; ``allow_shm_build=True`` keeps DeepSpeed's behaviour. On CPU the DeepSpeed
  optimizer gets ``torch_adam: true`` (``torch.optim.AdamW``) instead of FusedAdam (a ~100 s JIT build) or
  cpu_adam (~115 s).
- **Warmup and the schedule come from the Trainer, not from DeepSpeed.** A DeepSpeed ``scheduler`` section
  needs step counts that exist only once the dataloader is built (transformers fills them from ``"auto"``,
  which :func:`deepspeed_config` refuses). With an ``optimizer`` section and no ``scheduler`` section, the
  Trainer wraps its own scheduler (``lr_scheduler_type``, ``warmup_steps``; a float below 1 is a ratio) around
  DeepSpeed's optimizer, a combination transformers supports ("HF scheduler + DS optimizer").

The package root loads this module lazily, on first use of one of its names; torch, transformers,
accelerate and DeepSpeed are imported inside functions only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import importlib.util
import logging
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ._once import library_logs_once, library_warnings_once
from ._process import TrainerSlot, fixed_mmap_threshold, gpu_peak_of_trial, release_memory

if TYPE_CHECKING:
    from omegaconf import DictConfig
    from transformers import Trainer, TrainingArguments

__all__ = [
    "TrialScope",
    "build_training_arguments",
    "deepspeed_config",
    "live_deepspeed_engines",
    "teardown_trial",
    "trial_scope",
    "world_size",
]

log = logging.getLogger(__name__)

# DeepSpeed key -> ``training`` key whose value it must equal (transformers checks the same pairs in
# ``HfTrainerDeepSpeedConfig.trainer_config_process``, but only once training starts).
_MUST_MATCH = (
    ("train_micro_batch_size_per_gpu", "per_device_train_batch_size"),
    ("gradient_accumulation_steps", "gradient_accumulation_steps"),
    ("gradient_clipping", "max_grad_norm"),
    ("optimizer.params.lr", "learning_rate"),
    ("optimizer.params.weight_decay", "weight_decay"),
    ("optimizer.params.eps", "adam_epsilon"),
)

# TrainingArguments the config may change (see NOTES-cpu.md for each).
_DEFAULT_ARGS: dict[str, Any] = {
    "report_to": "none",  # no tracker is installed or wanted in a sweep worker
    "save_strategy": "no",  # a trial's checkpoints are not reused; saving costs seconds per trial
    "dataloader_num_workers": 0,  # worker processes per rank oversubscribe the cores
}
# TrainingArguments the config may not change. With transformers' default (True) the eval loss at 2 ranks
# was twice the 1-rank value, which would make an objective depend on the world size.
_FORCED_ARGS: dict[str, Any] = {"average_tokens_across_devices": False}
# Without use_cpu, the world size is taken as 1 on CPU and DeepSpeed's batch check fails
# ("train_batch_size ... 16 != 8 * 2 * 2"); mixed precision is not supported by this CPU path.
_CPU_FORCED_ARGS: dict[str, Any] = {"use_cpu": True, "bf16": False, "fp16": False}


def world_size() -> int:
    """The number of ranks of this run.

    Returns:
        ``torch.distributed.get_world_size()`` if a default process group is initialised, else the
        ``WORLD_SIZE`` environment variable (set by ``torchrun``), else 1.

    Raises:
        ValueError: If ``WORLD_SIZE`` is set but is not a positive integer.
    """
    dist = sys.modules.get("torch.distributed")  # not initialised if torch.distributed was never imported
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    env = os.environ.get("WORLD_SIZE", "")
    if not env:
        return 1
    if not env.isdigit() or int(env) < 1:
        raise ValueError(f"WORLD_SIZE must be a positive integer, but got {env=}")
    return int(env)


def deepspeed_config(cfg: DictConfig) -> dict[str, Any] | None:
    """The DeepSpeed config dict of one trial, from the composed config's ``deepspeed`` node.

    The ``deepspeed`` node is expected to interpolate the values it shares with the Trainer from ``training``
    (``train_micro_batch_size_per_gpu: ${training.per_device_train_batch_size}``,
    ``gradient_accumulation_steps: ${training.gradient_accumulation_steps}``,
    ``gradient_clipping: ${training.max_grad_norm}``, ``optimizer.params.lr: ${training.learning_rate}``,
    ...), so a sweep over ``training.*`` changes both sides at once (huggingface/transformers#34641).

    Args:
        cfg:
            The composed task config, with ``training`` (TrainingArguments fields) and ``deepspeed`` nodes.

    Returns:
        A new, fully resolved plain dict, with ``train_batch_size`` set to
        ``train_micro_batch_size_per_gpu * gradient_accumulation_steps * world_size`` (samples per optimizer
        step over all ranks; world size from :func:`world_size`), or :obj:`None` when ``cfg.deepspeed`` is
        null (training without DeepSpeed).

    Raises:
        ValueError: If an ``"auto"`` string is left anywhere in the dict (the message names its key path);
            if ``train_micro_batch_size_per_gpu`` or ``gradient_accumulation_steps`` is missing or not a
            positive integer; if a given ``train_batch_size`` differs from the computed one; or if a value
            differs from the ``training`` value it must equal (e.g. ``gradient_clipping`` vs
            ``training.max_grad_norm``).
        omegaconf.errors.InterpolationResolutionError: If an interpolation cannot be resolved.
    """
    from omegaconf import OmegaConf

    node = cfg.get("deepspeed")
    if node is None:
        return None
    ds: dict[str, Any] = OmegaConf.to_container(node, resolve=True)  # type: ignore[assignment]
    _reject_auto(ds, "deepspeed")

    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        value = ds.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"deepspeed.{key} must be a positive integer, but got {value!r}; interpolate it from "
                f"training (e.g. '{key}: ${{training.{_training_key(key)}}}')"
            )
    _check_shared_values(ds, cfg.get("training") or {})

    total = ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * world_size()
    given = ds.get("train_batch_size")
    if given is not None and given != total:
        raise ValueError(
            f"deepspeed.train_batch_size={given!r} differs from train_micro_batch_size_per_gpu * "
            f"gradient_accumulation_steps * world_size = {total}; leave it out, it is computed"
        )
    ds["train_batch_size"] = total
    return ds


def build_training_arguments(
    cfg: DictConfig, output_dir: str | os.PathLike[str], *, allow_shm_build: bool = False
) -> TrainingArguments:
    """``transformers.TrainingArguments`` for one trial, then ``set_seed(training.seed)``.

    Call it on every rank, at the start of each trial, **before** building the model (see the module
    docstring: ZeRO-3's partitioned init, and the seed of the initial weights).

    Settings, lowest precedence first:

    1. defaults: ``report_to="none"``, ``save_strategy="no"``, ``dataloader_num_workers=0``;
    2. ``cfg.training``;
    3. always ``average_tokens_across_devices=False`` (otherwise the eval loss scales with the world size);
    4. without CUDA: ``use_cpu=True``, ``bf16=False``, ``fp16=False``, and in the DeepSpeed dict
       ``bf16/fp16.enabled=False`` and ``optimizer.params.torch_adam=True`` (no JIT-built optimizer).

    A value from (2) replaced by (3) or (4) is reported with a :class:`UserWarning`.

    With DeepSpeed it also initialises ``deepspeed.comm`` on the process group accelerate created (without
    it, a process whose first trial is ZeRO-3 fails in the model's partitioned init, which then reads a world
    size of 1), and, started without a launcher, sets up a one-process world (``RANK=0``, ``WORLD_SIZE=1``, a
    free ``MASTER_PORT``) in ``os.environ``.

    Args:
        cfg:
            The composed task config: ``training`` holds TrainingArguments fields (``output_dir`` and
            ``deepspeed`` excepted); ``deepspeed`` is a DeepSpeed config node or null, see
            :func:`deepspeed_config`.
        output_dir:
            The Trainer's output directory, usually the Hydra job dir.
        allow_shm_build:
            Keep DeepSpeed's JIT build of its ``deepspeed_shm_comm`` op (35-50 s with g++ on a machine's
            first run). By default it is replaced by "op unavailable" for the rest of the process.

    Returns:
        The arguments; with DeepSpeed, ``args.deepspeed`` is the dict from :func:`deepspeed_config`.

    Raises:
        ValueError: If ``cfg.training`` has a key that is not a TrainingArguments field, or sets
            ``output_dir`` or ``deepspeed``; or as :func:`deepspeed_config` raises.
    """
    import torch
    import transformers

    fixed_mmap_threshold()
    training = _training_kwargs(cfg)
    ds = deepspeed_config(cfg)
    _check_deepspeed_section(training, ds)
    forced = _forced_args(training, ds, cuda=torch.cuda.is_available())
    kwargs = {**_DEFAULT_ARGS, **training, **forced}

    if ds is not None:
        if not allow_shm_build:
            _skip_deepspeed_shm_build()
        _single_process_env()
    args = transformers.TrainingArguments(output_dir=str(output_dir), deepspeed=ds, **kwargs)
    if ds is not None:
        _init_deepspeed_comm()
    transformers.set_seed(args.seed)
    library_logs_once()  # transformers, accelerate and DeepSpeed are imported by now (case C48)
    return args


class TrialScope(TrainerSlot):
    """What :func:`trial_scope` tears down when the trial ends: at most one ``transformers.Trainer``
    (:meth:`track` registers it; a second raises ``RuntimeError``)."""

    scope_name = "trial_scope"

    def track(self, trainer: Any) -> Any:
        """Register ``trainer`` for teardown when the scope ends and return it unchanged; the loggers of
        the modules the Trainer imported now show each warning once (case C48).

        Raises:
            RuntimeError: If a Trainer is already tracked by this scope (one trial, one Trainer).
        """
        tracked = super().track(trainer)
        library_logs_once()
        return tracked


@contextlib.contextmanager
def trial_scope() -> Iterator[TrialScope]:
    """Context manager around one trial that calls :func:`teardown_trial` when the trial ends.

    Teardown runs on success and on error. The caller's own references (a local ``trainer`` or ``model`` in
    the same function) keep those objects alive: build them in a function called inside the scope, or
    ``del`` them before it ends; :func:`teardown_trial` still releases the engine and the Trainer's contents.

    Library noise (case C48): inside the scope, teardown included, each warning raised from transformers,
    accelerate, DeepSpeed, torch (and the HF hub, safetensors, tokenizers) is shown once per process, and
    their loggers let each distinct warning text through once per process (``_once.py``), so a sweep's log
    does not repeat them at every trial or step.

    Yields:
        A :class:`TrialScope`; pass the trial's Trainer to :meth:`TrialScope.track`.
    """
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
    2. the ZeRO-3 module-level holders that keep engines alive are cleared (see NOTES-cpu.md);
    3. ``transformers.integrations.deepspeed.unset_hf_deepspeed_config()``, so a model built later is not
       created under an earlier trial's ZeRO-3 partitioned init (huggingface/transformers#11894);
    4. accelerate's ``AcceleratorState`` and ``GradientState`` are reset (its ``PartialState`` and the
       process group are kept);
    5. ``gc.collect()``, then glibc's ``malloc_trim(0)`` to hand freed heap back to the OS (skipped on
       other C libraries);
    6. with CUDA in use, ``torch.cuda.empty_cache()``.

    Args:
        trainer:
            The trial's Trainer, or :obj:`None` to only reset the global state (steps 2 to 5).
    """
    if trainer is not None:
        _release_trainer(trainer)
    _clear_deepspeed_zero3_holders()
    hf_ds = sys.modules.get("transformers.integrations.deepspeed")
    if hf_ds is not None:
        hf_ds.unset_hf_deepspeed_config()
    _reset_accelerate_state()
    del trainer
    release_memory()


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
    engine_type = engine_module.DeepSpeedEngine
    return sum(1 for obj in gc.get_objects() if issubclass(type(obj), engine_type))


# --- DeepSpeed, transformers and accelerate internals: one function each ---------------------------


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
        RuntimeError: If either is not where it was; the message names what is missing.
    """
    offload = importlib.import_module("deepspeed.runtime.zero.parameter_offload")
    coordinator = importlib.import_module("deepspeed.runtime.zero.partitioned_param_coordinator")
    stack = getattr(offload, "FWD_MODULE_STACK", None)
    if not isinstance(stack, list):
        raise RuntimeError("deepspeed.runtime.zero.parameter_offload.FWD_MODULE_STACK is not a list any more")
    cls = getattr(coordinator, "PartitionedParameterCoordinator", None)
    method = vars(cls).get("_PartitionedParameterCoordinator__params_to_release") if cls else None
    cached = _find_lru_cache(method)
    if cached is None:
        raise RuntimeError(
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
    except RuntimeError as e:
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


def _skip_deepspeed_shm_build() -> None:
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


def _init_deepspeed_comm() -> None:
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


def _deepspeed_cpu_settings(ds: dict[str, Any]) -> None:
    """Turn off mixed precision and choose torch's Adam in a DeepSpeed dict bound for a CPU run."""
    for key in ("bf16", "fp16"):
        if isinstance(ds.get(key), dict):
            ds[key]["enabled"] = False
    optimizer = ds.get("optimizer")
    if isinstance(optimizer, dict) and str(optimizer.get("type", "")).lower() in ("adam", "adamw"):
        optimizer.setdefault("params", {})["torch_adam"] = True


def _single_process_env() -> None:
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


def _release_trainer(trainer: Trainer) -> None:
    """Destroy the Trainer's DeepSpeed engine and drop the Trainer's references to the trial's objects."""
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
    a second full collection per trial (0.45 s of 10 on 2 CPU ranks, py-spy; README, Performance).
    ``tests/test_transformers_unit.py`` fails when accelerate renames these attributes.
    """
    wrapped = getattr(accelerator, "deepspeed_engine_wrapped", None)
    if wrapped is not None:
        wrapped.engine.destroy()
    accelerator.deepspeed_engine_wrapped = None
    for name in ("_schedulers", "_optimizers", "_models", "_dataloaders"):
        if not isinstance(getattr(accelerator, name, None), list):
            raise RuntimeError(f"accelerate.Accelerator.{name} is not a list any more: update _free_accelerator")
        setattr(accelerator, name, [])
    accelerator.step = 0


#: ``training`` keys that do nothing when the DeepSpeed dict has the block named beside them: DeepSpeed
#: then builds the optimizer (scheduler) itself and the Trainer's choice is ignored (transformers'
#: deepspeed integration, ``deepspeed_optim_sched``).
_SHADOWED_BY_DEEPSPEED = (("optim", "optimizer"), ("optim_args", "optimizer"), ("lr_scheduler_type", "scheduler"),
                          ("lr_scheduler_kwargs", "scheduler"))


def _check_deepspeed_section(training: dict[str, Any], ds: dict[str, Any] | None) -> None:
    """Refuse a DeepSpeed section without DeepSpeed installed, and a ``training`` key that the section
    silently overrides (case C25): a sweep over ``training.optim`` with a DeepSpeed ``optimizer`` block
    would search a value that changes nothing. Either key is fine alone.

    Raises:
        ImportError: naming the ``[hf]`` extra.
        ValueError: naming both keys and the two ways out.
    """
    if ds is None:
        return
    if importlib.util.find_spec("deepspeed") is None:
        raise ImportError(
            "the config has a 'deepspeed' section but DeepSpeed is not installed: pip install "
            "'hydra-ds-optuna-sweeper[hf]' (or set deepspeed: null to train without it)"
        )
    for training_key, ds_block in _SHADOWED_BY_DEEPSPEED:
        if training_key in training and ds_block in ds:
            raise ValueError(
                f"training.{training_key}={training[training_key]!r} has no effect: the DeepSpeed section's "
                f"'{ds_block}' block (deepspeed.{ds_block}.type={ds[ds_block].get('type')!r}) builds the "
                f"{ds_block} and the Trainer's choice is ignored. Remove training.{training_key}, or remove "
                f"deepspeed.{ds_block} so the Trainer builds it (a sweep over training.{training_key} then "
                "changes something)."
            )


def _forced_args(training: dict[str, Any], ds: dict[str, Any] | None, *, cuda: bool) -> dict[str, Any]:
    """The TrainingArguments the config may not change (CPU: also the DeepSpeed dict's CPU settings).

    A value in ``training`` that is replaced is reported with a :class:`UserWarning`.
    """
    forced = dict(_FORCED_ARGS)
    if not cuda:
        forced.update(_CPU_FORCED_ARGS)
        if ds is not None:
            _deepspeed_cpu_settings(ds)
    for key, value in forced.items():
        if key in training and training[key] != value:
            warnings.warn(
                f"training.{key}={training[key]!r} is replaced by {value!r} here (see "
                "hydra_plugins.ds_optuna_sweeper._hf); remove it from the config to silence this warning",
                UserWarning,
                stacklevel=3,
            )
    return forced


def _check_shared_values(ds: dict[str, Any], training: Any) -> None:
    """Refuse a DeepSpeed value that differs from the ``training`` value it must equal (:data:`_MUST_MATCH`)."""
    for ds_key, training_key in _MUST_MATCH:
        ds_value = _get_path(ds, ds_key)
        training_value = training.get(training_key) if hasattr(training, "get") else None
        if ds_value is not None and training_value is not None and ds_value != training_value:
            raise ValueError(
                f"deepspeed.{ds_key}={ds_value!r} differs from training.{training_key}={training_value!r}; "
                f"write '${{training.{training_key}}}' in the deepspeed config so they cannot disagree"
            )


def _training_kwargs(cfg: DictConfig) -> dict[str, Any]:
    """``cfg.training`` as a plain dict, checked against ``TrainingArguments``' fields.

    Raises:
        ValueError: for a key that is not a field, or ``output_dir``/``deepspeed`` (set by the glue).
    """
    import transformers
    from omegaconf import OmegaConf

    training: dict[str, Any] = OmegaConf.to_container(cfg.training, resolve=True)  # type: ignore[assignment]
    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments) if f.init}
    unknown = sorted(set(training) - fields)
    if unknown:
        raise ValueError(
            f"training.{unknown[0]} is not a transformers.TrainingArguments field "
            f"(unknown keys: {', '.join('training.' + k for k in unknown)})"
        )
    for key in ("output_dir", "deepspeed"):
        if key in training:
            raise ValueError(
                f"training.{key} must not be set: the output dir is the job dir, and DeepSpeed is configured "
                "by the top-level 'deepspeed' node"
            )
    return training


def _training_key(ds_key: str) -> str:
    return dict(_MUST_MATCH).get(ds_key, ds_key)


def _get_path(d: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(part)  # type: ignore[assignment]
    return d


def _reject_auto(value: Any, path: str) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _reject_auto(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _reject_auto(v, f"{path}[{i}]")
    elif isinstance(value, str) and value.strip().lower() == "auto":
        raise ValueError(
            f"{path} is 'auto': every DeepSpeed value must be explicit here, so that all ranks and all "
            "trials build the engine from the same numbers; interpolate it from training (e.g. "
            "'${training.learning_rate}') or write the number"
        )
