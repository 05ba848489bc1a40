"""The ``hydra.sweeper`` node's values checked one setting at a time: each function takes the node merged onto
the schema and returns the typed value(s) :class:`._settings.Settings` keeps, or raises
:class:`~._errors.SweeperConfigError` naming the key, the bad value and the fix.
"""

from __future__ import annotations

import warnings
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ._errors import SweeperConfigError


def normalize_directions(direction: Any) -> tuple[str, ...]:
    """``("minimize",)``, ``("maximize", "minimize")``... from a direction or a list of them; refuses anything but
    ``minimize``/``maximize`` (any case), or an empty list."""
    raw = list(direction) if isinstance(direction, (list, tuple)) or OmegaConf.is_list(direction) else [direction]
    out = []
    for d in raw:
        text = str(getattr(d, "name", d)).lower()
        if text not in ("minimize", "maximize"):
            raise SweeperConfigError(
                f"hydra.sweeper.direction must be 'minimize' or 'maximize' (or a list of them), got {direction!r}"
            )
        out.append(text)
    if not out:
        raise SweeperConfigError("hydra.sweeper.direction is an empty list; give at least one direction")
    return tuple(out)


def check_budget(node: DictConfig, world_size: int, local_world_size: int | None = None) -> tuple[int, int]:
    """``(n_jobs, n_trials)``, checked; inside a torchrun world ``n_jobs`` trial groups must cover the world's
    nodes of ``local_world_size`` ranks evenly (:func:`._loop._trial_groups.plan_groups` words the refusal)."""
    n_jobs = int(node.n_jobs)
    if n_jobs < 1:
        raise SweeperConfigError(f"hydra.sweeper.n_jobs must be >= 1, got {n_jobs=}")
    if n_jobs > 1 and world_size > 1:
        from ._loop._trial_groups import plan_groups

        plan_groups(n_jobs, world_size, local_world_size)
    n_trials = int(node.n_trials)
    if n_trials < 0:
        raise SweeperConfigError(f"hydra.sweeper.n_trials must be >= 0, got {n_trials=}")
    return n_jobs, n_trials


def check_limits(node: DictConfig) -> tuple[float, float | None, float]:
    """``(max_failure_rate, timeout seconds or None, rank_timeout seconds)``, checked."""
    max_failure_rate = float(node.max_failure_rate)
    if not 0.0 <= max_failure_rate <= 1.0:
        raise SweeperConfigError(f"hydra.sweeper.max_failure_rate must be within [0, 1], got {max_failure_rate=}")
    timeout_s = None if node.timeout is None else float(node.timeout)
    if timeout_s is not None and timeout_s <= 0:
        raise SweeperConfigError(f"hydra.sweeper.timeout must be > 0 seconds or null, got timeout={timeout_s}")
    rank_timeout_s = float(node.rank_timeout) if node.rank_timeout is not None else 0.0
    if rank_timeout_s <= 0:
        raise SweeperConfigError(f"hydra.sweeper.rank_timeout must be > 0 seconds, got timeout_s={rank_timeout_s}")
    return max_failure_rate, timeout_s, rank_timeout_s


def check_repeats(node: DictConfig) -> tuple[int, tuple[int, ...]]:
    """``(repeats, seeds)``, checked: a ``seed_key`` is needed, and one seed per repeat."""
    repeats = int(node.repeats)
    if repeats < 1:
        raise SweeperConfigError(f"hydra.sweeper.repeats must be >= 1, got {repeats=}")
    if repeats > 1 and not node.seed_key:
        raise SweeperConfigError(
            f"hydra.sweeper.repeats={repeats} needs hydra.sweeper.seed_key: the config key that takes each "
            "repeat's seed (e.g. training.seed)"
        )
    seeds = tuple(int(s) for s in node.seeds) if node.seeds is not None else tuple(range(repeats))
    if len(seeds) != repeats:
        raise SweeperConfigError(f"hydra.sweeper.seeds has {len(seeds)} seed(s) but repeats={repeats}; give one per repeat")
    return repeats, seeds


def check_pruner(node: DictConfig, directions: tuple[str, ...]) -> None:
    """Refuse a pruner with several objectives (Optuna: ``Trial.report`` is single-objective only)."""
    pruner_target = str(node.pruner.get("_target_", "")) if node.pruner is not None else ""
    if len(directions) > 1 and not pruner_target.endswith("NopPruner"):
        raise SweeperConfigError(
            f"hydra.sweeper.pruner ({pruner_target}) with {len(directions)} objectives: Optuna's "
            "pruners need one intermediate value per step, and Trial.report is not supported for "
            "multi-objective studies. Use hydra/sweeper/pruner=nop, or one direction."
        )


def check_backend(backend: str | None) -> None:
    """Refuse a ``hydra.sweeper.backend`` torch.distributed does not know (``Backend.backend_list``), naming the
    valid ones; a name (``gloo``) or device:backend pairs (``cpu:gloo,cuda:nccl``), as ``init_process_group`` takes.
    """
    if backend is None:
        return
    import torch.distributed as dist

    known = [b for b in dist.Backend.backend_list if b != "undefined"]
    names = [part.split(":", 1)[-1].strip().lower() for part in str(backend).split(",")]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SweeperConfigError(
            f"hydra.sweeper.backend={backend!r}: unknown torch.distributed backend {unknown}; use one of {known} or "
            "device:backend pairs such as 'cpu:gloo,cuda:nccl', or null for the automatic choice"
        )


def check_refit(node: DictConfig, directions: tuple[str, ...]) -> tuple[Any, ...]:
    """``refit.trials`` checked: ``best``, ``enqueued`` or trial numbers; ``best`` needs one objective (there is no
    one best trial otherwise)."""
    trials = tuple(OmegaConf.to_container(node.refit.trials, resolve=True) or ())
    for entry in trials:
        if entry in ("best", "enqueued") or (isinstance(entry, int) and not isinstance(entry, bool) and entry >= 0):
            continue
        raise SweeperConfigError(
            f"hydra.sweeper.refit.trials has {entry!r}; give 'best', 'enqueued' or trial numbers (e.g. [best, enqueued])"
        )
    if node.refit.enabled and not trials and not node.refit.baselines:
        raise SweeperConfigError("hydra.sweeper.refit.enabled=true with an empty refit.trials and no refit.baselines: "
                                 "name what to refit")
    if node.refit.enabled and "best" in trials and len(directions) > 1:
        raise SweeperConfigError(
            f"hydra.sweeper.refit.trials has 'best', but the study has {len(directions)} objectives and no single "
            "best trial: name the trials to refit by number (see pareto_front in optimization_results.yaml), "
            "e.g. hydra.sweeper.refit.trials=[3,7]"
        )
    return trials


def check_refit_baselines(node: DictConfig) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``refit.baselines`` (named configs the refit also trains, docs/how-to/refit.md) as
    ``((name, override lines), ...)``, in the order given.

    Raises:
        SweeperConfigError: for a node that is not a mapping of mappings, a name that is empty, only digits
            (``refit/<trial number>`` is a trial's dir), starts with ``.`` or ``-`` (``..`` is the sweep dir) or
            holds other characters than letters, digits, ``_``, ``-`` and ``.``, or a key that is not override
            text (keys missing from the config: :func:`._study._space_checks.check_baseline_keys`).
    """
    import re

    from ._study._override_text import override_line

    raw = OmegaConf.to_container(node.refit.baselines, resolve=True) if node.refit.baselines is not None else {}
    if not isinstance(raw, dict):
        raise SweeperConfigError(
            f"hydra.sweeper.refit.baselines must map names to {{config key: value}}, got {raw!r}; e.g. "
            "hydra.sweeper.refit.baselines={defaults:{training.learning_rate:5e-5}}")
    out = []
    for name, entry in raw.items():
        name = str(name)
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name) or name.isdigit():
            raise SweeperConfigError(
                f"hydra.sweeper.refit.baselines has the name {name!r}: use letters, digits, '_', '-' or '.', starting "
                "with a letter, digit or '_', not only digits (it names the refit dir refit/<name>, next to the "
                "trials' refit/<number>)")
        if not isinstance(entry, dict) or not all(isinstance(k, str) and re.fullmatch(r"\+{0,2}[\w.@/-]+", k)
                                                   for k in entry):
            raise SweeperConfigError(
                f"hydra.sweeper.refit.baselines.{name} must be a mapping of config keys to values (an empty mapping "
                f"is the config as composed), got {entry!r}; to drop it: ~hydra.sweeper.refit.baselines.{name}")
        out.append((name, tuple(override_line(k, v) for k, v in entry.items())))
    return tuple(out)


def check_heartbeat(node: DictConfig) -> tuple[int | None, int | None]:
    """``(heartbeat_interval, grace_period)`` in seconds, checked (case C20, optuna/optuna#5470).

    Optuna's RDBStorage wants both positive, records a heartbeat every ``heartbeat_interval`` seconds,
    and fails a RUNNING trial whose last heartbeat is older than ``grace_period`` (default
    ``2 * heartbeat_interval``; Optuna's RDBStorage documentation). A grace period that is not longer
    than the interval fails live trials between two heartbeats, so it is refused; one below twice the
    interval leaves little room for a slow database and gets a warning.
    """
    interval = None if node.heartbeat_interval is None else int(node.heartbeat_interval)
    grace = None if node.grace_period is None else int(node.grace_period)
    if interval is not None and interval <= 0:
        raise SweeperConfigError(
            f"hydra.sweeper.heartbeat_interval must be a positive number of seconds or null (off), got {interval}"
        )
    if grace is not None and grace <= 0:
        raise SweeperConfigError(f"hydra.sweeper.grace_period must be a positive number of seconds or null, got {grace}")
    if interval is not None and grace is not None:
        if grace <= interval:
            raise SweeperConfigError(
                f"hydra.sweeper.grace_period={grace} s is not longer than hydra.sweeper.heartbeat_interval={interval} s: "
                "a running trial records a heartbeat every heartbeat_interval seconds, and any worker fails a trial "
                "whose last heartbeat is older than grace_period, so healthy trials would be failed between two "
                f"heartbeats (optuna/optuna#5470). Use grace_period >= {2 * interval} (Optuna's default is "
                "2 x heartbeat_interval), or leave it null."
            )
        if grace < 2 * interval:
            warnings.warn(
                f"hydra.sweeper.grace_period={grace} s is below 2 x heartbeat_interval={interval} s (Optuna's "
                "default): a slow database write can let a live trial look stale. Set grace_period null to "
                "silence this.", UserWarning, stacklevel=2)
    return interval, grace


def check_retry_count(node: DictConfig) -> int:
    """``retry_failed_trials``, checked: how often an abandoned trial is re-queued, >= 0."""
    retry = int(node.retry_failed_trials)
    if retry < 0:
        raise SweeperConfigError(f"hydra.sweeper.retry_failed_trials must be >= 0, got {retry}")
    return retry


def check_keep_best(node: DictConfig) -> int:
    """``checkpoints.keep_best``, checked: -1 (keep every finished trial's checkpoint) or >= 0."""
    keep = int(node.checkpoints.keep_best)
    if keep < -1:
        raise SweeperConfigError(
            f"hydra.sweeper.checkpoints.keep_best must be >= 0, or -1 to keep every finished trial's checkpoint; got {keep}")
    return keep


def check_preempt_grace(node: DictConfig) -> float:
    """``checkpoints.preempt_grace`` in seconds, checked: > 0."""
    grace = float(node.checkpoints.preempt_grace)
    if not grace > 0:
        raise SweeperConfigError(f"hydra.sweeper.checkpoints.preempt_grace must be > 0 seconds, got {grace:g}")
    return grace


def check_storage_retry(node: DictConfig) -> float:
    """``storage_retry_timeout`` in seconds, checked: >= 0 (0: a storage outage is not retried)."""
    storage_retry_s = float(node.storage_retry_timeout) if node.storage_retry_timeout is not None else -1.0
    if storage_retry_s < 0:
        raise SweeperConfigError(
            f"hydra.sweeper.storage_retry_timeout must be >= 0 seconds (0: no retry), got {node.storage_retry_timeout}"
        )
    return storage_retry_s


def check_enqueue_trials(node: DictConfig) -> tuple[dict[str, Any], ...]:
    """``enqueue_trials`` as plain dicts, each a non-empty mapping (their values are cast later, against the
    search space: :func:`._study._queue.warm_start_params`)."""
    enqueue = OmegaConf.to_container(node.enqueue_trials, resolve=True) if node.enqueue_trials else []
    for i, entry in enumerate(enqueue):
        if not isinstance(entry, dict) or not entry:
            raise SweeperConfigError(f"hydra.sweeper.enqueue_trials[{i}] must be a non-empty mapping, got {entry!r}")
    return tuple(enqueue)
