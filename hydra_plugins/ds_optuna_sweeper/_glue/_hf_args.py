"""The Hugging Face glue's arguments: ``TrainingArguments`` and the DeepSpeed dict of one trial, built
from the same composed config nodes on every rank (cases C02, C03, C04, C25).

``_hf.py``'s docstring gives the order of a trial and the decisions behind the defaults. Every config problem
found here raises :class:`~._errors.GlueConfigError` (a ``ValueError``) before any model is built. torch,
transformers and DeepSpeed are imported inside functions only.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any

from .._errors import GlueConfigError, MissingExtraError
from ._hf_teardown import init_deepspeed_comm, single_process_env, skip_deepspeed_shm_build
from ._memory import fixed_mmap_threshold
from ._once import library_logs_once
from .._tracking._task_env import hf_tracking_args
from ._resume import hf_checkpoint_args

if TYPE_CHECKING:
    from omegaconf import DictConfig
    from transformers import TrainingArguments


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

# TrainingArguments the config may change (see docs/deepspeed-cpu.md for each).
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
        GlueConfigError: (a ``ValueError``) If ``WORLD_SIZE`` is set but is not a positive integer.
    """
    dist = sys.modules.get("torch.distributed")  # not initialised if torch.distributed was never imported
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    env = os.environ.get("WORLD_SIZE", "")
    if not env:
        return 1
    if not env.isdigit() or int(env) < 1:
        raise GlueConfigError(f"WORLD_SIZE must be a positive integer, but got {env=}")
    return int(env)


def deepspeed_config(cfg: DictConfig) -> dict[str, Any] | None:
    """The DeepSpeed config dict of one trial, from the composed config's ``deepspeed`` node.

    The node is expected to interpolate the values it shares with the Trainer from ``training``
    (``gradient_clipping: ${training.max_grad_norm}``, ...: :data:`_MUST_MATCH`), so a sweep over
    ``training.*`` changes both sides at once (huggingface/transformers#34641).

    Args:
        cfg:
            The composed task config, with ``training`` (TrainingArguments fields) and ``deepspeed`` nodes.

    Returns:
        A new, fully resolved plain dict, with ``train_batch_size`` set to
        ``train_micro_batch_size_per_gpu * gradient_accumulation_steps * world_size`` (samples per optimizer
        step over all ranks; world size from :func:`world_size`), or :obj:`None` when ``cfg.deepspeed`` is
        null (training without DeepSpeed).

    Raises:
        GlueConfigError: (a ``ValueError``) If an ``"auto"`` string is left anywhere in the dict (the
            message names its key path); if ``train_micro_batch_size_per_gpu`` or
            ``gradient_accumulation_steps`` is missing or not a positive integer; if a given ``train_batch_size``
            differs from the computed one; or if a value differs from the ``training`` value it must equal (e.g.
            ``gradient_clipping`` vs ``training.max_grad_norm``).
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
            raise GlueConfigError(
                f"deepspeed.{key} must be a positive integer, but got {value!r}; interpolate it from "
                f"training (e.g. '{key}: ${{training.{dict(_MUST_MATCH)[key]}}}')"
            )
    _check_shared_values(ds, cfg.get("training") or {})

    total = ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * world_size()
    given = ds.get("train_batch_size")
    if given is not None and given != total:
        raise GlueConfigError(
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

    With ``hydra.sweeper.tracking``, ``run_name`` is the trial's run name and ``report_to`` (when the config turns
    it on) logs into the trial's runs (docs/how-to/tracking.md, "Tracking").

    In a sweep's trial (and a refit with ``refit.from_checkpoint``) ``output_dir`` is replaced by the trial's
    ``checkpoint_dir``, where the trial's retry looks for checkpoints, and ``save_total_limit`` is 1 unless
    ``training`` sets it (docs/how-to/checkpoints.md, "Checkpoints").

    With DeepSpeed it also applies ``_hf_teardown.py``'s process patches: ``deepspeed.comm`` initialised on
    accelerate's process group, and without a launcher a one-process world in ``os.environ``.

    Args:
        cfg:
            The composed task config: ``training`` holds TrainingArguments fields (``output_dir`` and
            ``deepspeed`` excepted); ``deepspeed`` is a DeepSpeed config node or null, see
            :func:`deepspeed_config`.
        output_dir:
            The Trainer's output directory, usually the Hydra job dir (in a sweep's trial: see above).
        allow_shm_build:
            Keep DeepSpeed's JIT build of its ``deepspeed_shm_comm`` op (35-50 s with g++ on a machine's
            first run). By default it is replaced by "op unavailable" for the rest of the process.

    Returns:
        The arguments; with DeepSpeed, ``args.deepspeed`` is the dict from :func:`deepspeed_config`.

    Raises:
        GlueConfigError: (a ``ValueError``) If ``cfg.training`` has a key that is not a TrainingArguments field, or sets
            ``output_dir`` or ``deepspeed``; or as :func:`deepspeed_config` raises.
    """
    import torch
    import transformers

    fixed_mmap_threshold()
    kwargs, output_dir, ds = _argument_values(cfg, output_dir, cuda=torch.cuda.is_available())
    args = _new_arguments(kwargs, output_dir, ds, allow_shm_build)
    transformers.set_seed(args.seed)
    library_logs_once()  # transformers, accelerate and DeepSpeed are imported by now (case C48)
    return args


def _argument_values(
    cfg: DictConfig, output_dir: str | os.PathLike[str], *, cuda: bool
) -> tuple[dict[str, Any], str | os.PathLike[str], dict[str, Any] | None]:
    """``(keyword arguments but output_dir and deepspeed, output_dir, DeepSpeed dict or None)`` of one trial,
    merged in :func:`build_training_arguments`'s order of precedence, then the trial's checkpoint and tracking
    values."""
    import transformers

    training = _training_kwargs(cfg)
    ds = deepspeed_config(cfg)
    _check_deepspeed_section(training, ds)
    forced = _forced_args(training, ds, cuda=cuda)
    checkpoints = hf_checkpoint_args(training)  # a sweep's trial: its checkpoint_dir, save_total_limit
    output_dir = checkpoints.pop("output_dir", output_dir)
    tracked = hf_tracking_args(training, {f.name for f in dataclasses.fields(transformers.TrainingArguments)})
    return {**_DEFAULT_ARGS, **training, **forced, **checkpoints, **tracked}, output_dir, ds


def _new_arguments(
    kwargs: dict[str, Any], output_dir: str | os.PathLike[str], ds: dict[str, Any] | None, allow_shm_build: bool
) -> TrainingArguments:
    """``TrainingArguments(output_dir=..., deepspeed=ds, **kwargs)``, with DeepSpeed between the process patches
    (docs/deepspeed-cpu.md)."""
    import transformers

    if ds is not None:
        if not allow_shm_build:
            skip_deepspeed_shm_build()
        single_process_env()
    args = transformers.TrainingArguments(output_dir=str(output_dir), deepspeed=ds, **kwargs)
    if ds is not None:
        init_deepspeed_comm()
    return args


def _deepspeed_cpu_settings(ds: dict[str, Any]) -> None:
    """Turn off mixed precision and choose torch's Adam in a DeepSpeed dict bound for a CPU run."""
    for key in ("bf16", "fp16"):
        if isinstance(ds.get(key), dict):
            ds[key]["enabled"] = False
    optimizer = ds.get("optimizer")
    if isinstance(optimizer, dict) and str(optimizer.get("type", "")).lower() in ("adam", "adamw"):
        optimizer.setdefault("params", {})["torch_adam"] = True


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
        MissingExtraError: (an ``ImportError``) naming the ``[hf]`` extra.
        GlueConfigError: (a ``ValueError``) naming both keys and the two ways out.
    """
    if ds is None:
        return
    if importlib.util.find_spec("deepspeed") is None:
        raise MissingExtraError(
            "the config has a 'deepspeed' section but DeepSpeed is not installed: pip install "
            "'hydra-ds-optuna-sweeper[hf]' (on a CPU machine repeat your torch pin in the same command, see the "
            "README; or set deepspeed: null to train without it)"
        )
    for training_key, ds_block in _SHADOWED_BY_DEEPSPEED:
        if training_key in training and ds_block in ds:
            raise GlueConfigError(
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
                "hydra_plugins.ds_optuna_sweeper._glue._hf); remove it from the config to silence this warning",
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
            raise GlueConfigError(
                f"deepspeed.{ds_key}={ds_value!r} differs from training.{training_key}={training_value!r}; "
                f"write '${{training.{training_key}}}' in the deepspeed config so they cannot disagree"
            )


def _training_kwargs(cfg: DictConfig) -> dict[str, Any]:
    """``cfg.training`` as a plain dict, checked against ``TrainingArguments``' fields.

    Raises:
        GlueConfigError: (a ``ValueError``) for a key that is not a field, or ``output_dir``/``deepspeed``
            (set by the glue).
    """
    import transformers
    from omegaconf import OmegaConf

    training: dict[str, Any] = OmegaConf.to_container(cfg.training, resolve=True)  # type: ignore[assignment]
    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments) if f.init}
    unknown = sorted(set(training) - fields)
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(fields), n=1)
        hint = f"; did you mean training.{close[0]}?" if close else ""
        raise GlueConfigError(
            f"training.{unknown[0]} is not a transformers.TrainingArguments field "
            f"(unknown keys: {', '.join('training.' + k for k in unknown)}){hint}"
        )
    for key in ("output_dir", "deepspeed"):
        if key in training:
            raise GlueConfigError(
                f"training.{key} must not be set: the output dir is the job dir, and DeepSpeed is configured "
                "by the top-level 'deepspeed' node"
            )
    return training


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
        raise GlueConfigError(
            f"{path} is 'auto': every DeepSpeed value must be explicit here, so that all ranks and all "
            "trials build the engine from the same numbers; interpolate it from training (e.g. "
            "'${training.learning_rate}') or write the number"
        )
