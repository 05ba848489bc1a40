"""One frozen :class:`Settings` built once from the ``hydra.sweeper`` node, with every check.

Hydra passes the node's keys to :class:`~hydra_plugins.ds_optuna_sweeper.sweeper.DSOptunaSweeper`;
:meth:`Settings.from_node` checks them against the schema
(:class:`~hydra_plugins.ds_optuna_sweeper.config.DSOptunaSweeperConf`), checks every range, and hands
the rest of the code typed fields. It runs on every rank, before any process group exists, so a bad
setting stops every rank with the same message and nothing stored is touched.
"""

from __future__ import annotations

import difflib
import warnings
from dataclasses import dataclass, fields
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from ._errors import SweeperConfigError
from .config import PRUNERS, SAMPLERS, DSOptunaSweeperConf

#: Keys that configure the sweep, not the task; found at the top of the task config they are a
#: misplaced ``hydra.sweeper`` setting (case C15, facebookresearch/hydra#2047).
SWEEPER_ONLY_KEYS = (
    "direction",
    "n_trials",
    "study_name",
    "sampler",
    "pruner",
    "max_failure_rate",
    "n_jobs",
    "custom_search_space",
    "rank_timeout",
    "sweeper",
)


def valid_sweeper_keys() -> list[str]:
    """The keys users may set under ``hydra.sweeper`` (schema fields without ``_`` and ``defaults``)."""
    return [f.name for f in fields(DSOptunaSweeperConf) if not f.name.startswith("_") and f.name != "defaults"]


def merge_onto_schema(values: Mapping[str, Any]) -> DictConfig:
    """Check the ``hydra.sweeper`` keys against :class:`DSOptunaSweeperConf` and merge them onto it.

    Args:
        values: the keyword arguments Hydra passed to the sweeper (``_``-prefixed keys ignored).

    Returns:
        The settings merged onto the schema (typed, defaults filled in), sampler and pruner still
        as configs.

    Raises:
        SweeperConfigError: for an unknown key (the message names it, suggests the nearest valid
            key and lists them all; case C16, facebookresearch/hydra#2313 and #2046) or a value of
            the wrong type.
    """
    valid = valid_sweeper_keys()
    unknown = sorted(k for k in values if not str(k).startswith("_") and k not in valid and k != "defaults")
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hints.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        raise SweeperConfigError(
            f"Unknown hydra.sweeper key(s) for hydra/sweeper=ds_optuna: {', '.join(hints)}. Valid keys: "
            f"{', '.join(valid)}. Keys of another sweeper's schema do not carry over; see the README's config "
            "reference. Nothing was run."
        )
    user = {k: v for k, v in values.items() if k in valid}
    schema = OmegaConf.structured(DSOptunaSweeperConf)
    try:
        return OmegaConf.merge(schema, OmegaConf.create(user, flags={"allow_objects": True}))
    except Exception as e:  # omegaconf.errors.ValidationError and friends
        raise SweeperConfigError(f"Invalid hydra.sweeper setting: {e}".replace("\n", " ")) from e


def normalize_directions(direction: Any) -> tuple[str, ...]:
    """``("minimize",)``, ``("maximize", "minimize")``... from a direction or a list of them.

    Raises:
        SweeperConfigError: for anything but ``minimize``/``maximize`` (any case), or an empty list.
    """
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


def _check_budget(node: DictConfig, world_size: int) -> tuple[int, int]:
    """``(n_jobs, n_trials)``, checked; ``n_jobs > 1`` is refused inside a torchrun world (case C10)."""
    n_jobs = int(node.n_jobs)
    if n_jobs < 1:
        raise SweeperConfigError(f"hydra.sweeper.n_jobs must be >= 1, got {n_jobs=}")
    if n_jobs > 1 and world_size > 1:
        raise SweeperConfigError(
            f"hydra.sweeper.n_jobs={n_jobs} inside a torchrun world of {world_size} ranks: every "
            "rank takes part in each trial, so trials cannot run side by side inside one world. Use "
            "n_jobs=1, and for parallel trials start several torchrun groups on one shared storage "
            "(hydra.sweeper.storage=postgresql://... with the same study_name)."
        )
    n_trials = int(node.n_trials)
    if n_trials < 0:
        raise SweeperConfigError(f"hydra.sweeper.n_trials must be >= 0, got {n_trials=}")
    return n_jobs, n_trials


def _check_limits(node: DictConfig) -> tuple[float, float | None, float]:
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


def _check_repeats(node: DictConfig) -> tuple[int, tuple[int, ...]]:
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


def _check_pruner(node: DictConfig, directions: tuple[str, ...]) -> None:
    """Refuse a pruner with several objectives (Optuna: ``Trial.report`` is single-objective only)."""
    pruner_target = str(node.pruner.get("_target_", "")) if node.pruner is not None else ""
    if len(directions) > 1 and not pruner_target.endswith("NopPruner"):
        raise SweeperConfigError(
            f"hydra.sweeper.pruner ({pruner_target}) with {len(directions)} objectives: Optuna's "
            "pruners need one intermediate value per step, and Trial.report is not supported for "
            "multi-objective studies. Use hydra/sweeper/pruner=nop, or one direction."
        )


def _check_backend(backend: str | None) -> None:
    """Refuse a ``hydra.sweeper.backend`` torch.distributed does not know, naming the valid ones.

    Accepts a backend name (``gloo``) or device:backend pairs (``cpu:gloo,cuda:nccl``), as
    ``torch.distributed.init_process_group`` does; the names are torch's ``Backend.backend_list``.

    Raises:
        SweeperConfigError: for an unknown backend name.
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


def _check_refit(node: DictConfig, directions: tuple[str, ...]) -> tuple[Any, ...]:
    """``refit.trials`` checked: ``best``, ``enqueued`` or trial numbers; ``best`` needs one objective.

    Raises:
        SweeperConfigError: for any other entry, or ``best`` with several objectives (there is no one
            best trial then: name the Pareto trials to refit by number).
    """
    trials = tuple(OmegaConf.to_container(node.refit.trials, resolve=True) or ())
    for entry in trials:
        if entry in ("best", "enqueued") or (isinstance(entry, int) and not isinstance(entry, bool) and entry >= 0):
            continue
        raise SweeperConfigError(
            f"hydra.sweeper.refit.trials has {entry!r}; give 'best', 'enqueued' or trial numbers (e.g. [best, enqueued])"
        )
    if node.refit.enabled and not trials:
        raise SweeperConfigError("hydra.sweeper.refit.enabled=true with an empty refit.trials: name what to refit")
    if node.refit.enabled and "best" in trials and len(directions) > 1:
        raise SweeperConfigError(
            f"hydra.sweeper.refit.trials has 'best', but the study has {len(directions)} objectives and no single "
            "best trial: name the trials to refit by number (see pareto_front in optimization_results.yaml), "
            "e.g. hydra.sweeper.refit.trials=[3,7]"
        )
    return trials


def _check_group_nodes(node: DictConfig) -> None:
    """Refuse a sampler or pruner given as a value instead of a config-group option (case C43).

    ``hydra.sweeper.pruner=median`` sets the key to the string ``"median"`` (Hydra composes it without
    a word); the group option is chosen with ``hydra/sweeper/pruner=median``. Without this check the
    string reached ``OmegaConf``/Optuna and failed as ``AttributeError: 'str' object has no attribute
    'get'``, or was reported as a storage error.

    Args:
        node: the settings merged onto the schema.

    Raises:
        SweeperConfigError: naming the key, its value, the group override to write (the option
            closest to the value) and the group's options.
    """
    for group, options in (("sampler", SAMPLERS), ("pruner", PRUNERS)):
        if OmegaConf.is_missing(node, group):  # not composed (a settings dict built in code)
            continue
        value = node.get(group)
        if OmegaConf.is_dict(value):
            continue
        text = "null" if value is None else str(value)
        close = difflib.get_close_matches(text.lower().rsplit(".", 1)[-1].replace("sampler", "").replace("pruner", ""),
                                          list(options), n=1, cutoff=0.5)
        # null: the group's default option (tpe, nop: no pruning), the first one listed in config.py
        option = next(iter(options)) if value is None else close[0] if close else "<option>"
        raise SweeperConfigError(
            f"hydra.sweeper.{group}={text} sets the key to a plain value, but the {group} is a config group: "
            f"choose it with hydra/sweeper/{group}={option} (a slash, not a dot), then set its arguments as "
            f"hydra.sweeper.{group}.<argument>=<value>. Options of hydra/sweeper/{group}: {', '.join(options)}. "
            "Nothing was run."
        )


#: Python packages a sampler imports only when it first samples (Optuna's ``_LazyImport`` in
#: ``optuna/samplers/_cmaes.py``, ``_qmc.py`` and ``_gp/``), none of which ``optuna`` itself installs.
SAMPLER_NEEDS: dict[str, tuple[str, ...]] = {
    "optuna.samplers.CmaEsSampler": ("cmaes",),
    "optuna.samplers.QMCSampler": ("scipy",),
    "optuna.samplers.GPSampler": ("scipy", "torch"),
}


def _check_sampler_needs(node: Any) -> None:
    """Refuse a sampler whose optional packages are missing, before the study is asked (found by a
    new-user trial: ``hydra/sweeper/sampler=cmaes`` without ``cmaes`` trained trial 0, then failed at
    the first CMA-ES ask and left a FAIL trial in the study).

    Raises:
        SweeperConfigError: naming the sampler, the missing package and the ``pip install`` line.
    """
    import importlib.util

    if node is None or not OmegaConf.is_dict(node) or "_target_" not in node:
        return
    target = str(node._target_)
    missing = []
    for module in SAMPLER_NEEDS.get(target, ()):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # ValueError: sys.modules[module] is None (import blocked)
            found = False
        if not found:
            missing.append(module)
    if missing:
        raise SweeperConfigError(
            f"hydra.sweeper.sampler {target} needs the Python package(s) {', '.join(missing)}, which are not "
            f"installed here (Optuna installs them only on request): pip install {' '.join(missing)}. "
            "Nothing was asked from the study."
        )


def _check_target_keys(node: Any, group: str, options: Mapping[str, Any]) -> None:
    """Refuse sampler/pruner keys that the node's ``_target_`` class does not take (case C26).

    Setting ``hydra.sweeper.sampler._target_=optuna.samplers.RandomSampler`` keeps the keys of the
    group option that was composed (TPE's ``n_startup_trials``...), and the class then fails with a bare
    ``TypeError`` (facebookresearch/hydra#2003). The message names the keys and the group option that
    fits the target.

    Raises:
        SweeperConfigError: for a target that cannot be imported, or keys it does not take.
    """
    import inspect

    from hydra.utils import get_class

    if node is None or not OmegaConf.is_dict(node) or "_target_" not in node:
        return
    target = str(node._target_)
    try:
        params = inspect.signature(get_class(target)).parameters
    except Exception as e:
        raise SweeperConfigError(f"hydra.sweeper.{group}._target_={target} cannot be imported: {e}") from e
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(str(k) for k in node if not str(k).startswith("_") and k not in params)
    if not unknown:
        return
    fits = [name for name, schema in options.items() if schema._target_ == target]
    fix = (
        f"Choose it with hydra/sweeper/{group}={fits[0]} (its keys then follow), not with {group}._target_"
        if fits
        else f"Give only {target}'s own arguments ({', '.join(p for p in params if p != 'self')})"
    )
    raise SweeperConfigError(
        f"hydra.sweeper.{group} has key(s) {unknown} that {target} does not take: the keys of the "
        f"hydra/sweeper/{group} option composed before _target_ was changed. {fix}. Nothing was run."
    )


def _check_heartbeat(node: DictConfig) -> tuple[int | None, int | None]:
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
                "silence this.",
                UserWarning,
                stacklevel=2,
            )
    return interval, grace


@dataclass(frozen=True)
class Settings:
    """The ``hydra.sweeper`` settings, checked and typed. See the README's config reference.

    Attributes:
        sampler: the sampler node (``_target_`` + Optuna's arguments); rank 0 alone instantiates it.
        pruner: the pruner node, likewise.
        directions: one ``"minimize"``/``"maximize"`` per objective.
        storage: a storage URL, a ``_target_`` node, or ``None`` (SQLite in the sweep dir).
        study_name: ``None`` means the job name.
        n_trials: the study's total budget of trials.
        n_jobs: trials handed to the launcher at once (1 under torchrun).
        timeout_s: seconds for this run's trials, counted from its first ``study.ask`` (not from the
            launch: study and rank set-up are not spent), or ``None``; no trial is asked after it.
        max_failure_rate: failed / finished trials of this run above which the sweep stops.
        params: ``{override key: sweep expression}`` or ``None``.
        custom_search_space: dotted path of ``fn(cfg, trial)`` or ``None``.
        enqueue_trials: warm-start param dicts.
        plots: write Optuna's plots at the end.
        plot_every: also every this many finished trials (0: only at the end).
        repeats: evaluations per sampled config, each with its own seed.
        seed_key: the config key that takes each repeat's seed.
        seeds: the repeats' seeds.
        rank_timeout_s: seconds any wait between ranks may last.
        retry_failed_trials: how often an abandoned trial is re-queued.
        heartbeat_interval_s: seconds between heartbeats, or ``None`` (off).
        grace_period_s: seconds without heartbeat before a trial is stale, or ``None`` (Optuna's default).
        allow_search_space_change: resume although distributions changed.
        backend: backend of a default group the sweeper creates, or ``None`` (automatic).
        refit_enabled: run the refit after the search (``hydra.sweeper.refit.enabled``).
        refit_overrides: overrides added to each refit run.
        refit_trials: ``"best"``, ``"enqueued"`` and/or trial numbers.
        storage_retry_timeout_s: seconds a storage outage is retried (``hydra.sweeper.storage_retry_timeout``);
            see :attr:`storage_retry_budget_s`.
    """

    sampler: Any
    pruner: Any
    directions: tuple[str, ...]
    storage: Any
    study_name: str | None
    n_trials: int
    n_jobs: int
    timeout_s: float | None
    max_failure_rate: float
    params: Any
    custom_search_space: str | None
    enqueue_trials: tuple[dict[str, Any], ...]
    plots: bool
    plot_every: int
    repeats: int
    seed_key: str | None
    seeds: tuple[int, ...]
    rank_timeout_s: float
    retry_failed_trials: int
    heartbeat_interval_s: int | None
    grace_period_s: int | None
    allow_search_space_change: bool
    backend: str | None
    refit_enabled: bool = False
    refit_overrides: tuple[str, ...] = ()
    refit_trials: tuple[Any, ...] = ("best",)
    storage_retry_timeout_s: float = 120.0

    @classmethod
    def from_node(cls, values: Mapping[str, Any], *, world_size: int) -> "Settings":
        """Check the ``hydra.sweeper`` node and build the settings.

        Args:
            values: the keys Hydra passed to the sweeper.
            world_size: ranks in this torchrun world (``WORLD_SIZE``; 1 without torchrun).

        Raises:
            SweeperConfigError: naming the key, the bad value and the fix; see :func:`merge_onto_schema`.
        """
        node = merge_onto_schema(values)
        n_jobs, n_trials = _check_budget(node, world_size)
        max_failure_rate, timeout_s, rank_timeout_s = _check_limits(node)
        directions = normalize_directions(node.direction)
        repeats, seeds = _check_repeats(node)
        retry = int(node.retry_failed_trials)
        if retry < 0:
            raise SweeperConfigError(f"hydra.sweeper.retry_failed_trials must be >= 0, got {retry}")
        _check_group_nodes(node)
        _check_pruner(node, directions)
        _check_backend(node.backend)
        refit_trials = _check_refit(node, directions)
        _check_target_keys(node.sampler, "sampler", SAMPLERS)
        _check_sampler_needs(node.sampler)
        _check_target_keys(node.pruner, "pruner", PRUNERS)
        heartbeat_s, grace_s = _check_heartbeat(node)
        storage_retry_s = float(node.storage_retry_timeout) if node.storage_retry_timeout is not None else -1.0
        if storage_retry_s < 0:
            raise SweeperConfigError(
                f"hydra.sweeper.storage_retry_timeout must be >= 0 seconds (0: no retry), got {node.storage_retry_timeout}"
            )
        enqueue = OmegaConf.to_container(node.enqueue_trials, resolve=True) if node.enqueue_trials else []
        for i, entry in enumerate(enqueue):
            if not isinstance(entry, dict) or not entry:
                raise SweeperConfigError(f"hydra.sweeper.enqueue_trials[{i}] must be a non-empty mapping, got {entry!r}")
        return cls(
            sampler=node.sampler,
            pruner=node.pruner,
            directions=directions,
            storage=node.storage,
            study_name=node.study_name,
            n_trials=n_trials,
            n_jobs=n_jobs,
            timeout_s=timeout_s,
            max_failure_rate=max_failure_rate,
            params=node.params,
            custom_search_space=node.custom_search_space,
            enqueue_trials=tuple(enqueue),
            plots=bool(node.plots),
            plot_every=int(node.plot_every),
            repeats=repeats,
            seed_key=node.seed_key,
            seeds=seeds,
            rank_timeout_s=rank_timeout_s,
            retry_failed_trials=retry,
            heartbeat_interval_s=heartbeat_s,
            grace_period_s=grace_s,
            allow_search_space_change=bool(node.allow_search_space_change),
            backend=node.backend,
            refit_enabled=bool(node.refit.enabled),
            refit_overrides=tuple(str(o) for o in node.refit.overrides),
            refit_trials=refit_trials,
            storage_retry_timeout_s=storage_retry_s,
        )

    @property
    def n_objectives(self) -> int:
        """Number of objectives (entries of ``directions``)."""
        return len(self.directions)

    @property
    def storage_retry_budget_s(self) -> float:
        """Seconds rank 0 retries a storage outage: ``storage_retry_timeout``, at most half of
        ``rank_timeout``, so the other ranks (waiting for rank 0 under ``rank_timeout``) hear the
        outage from rank 0 instead of timing out."""
        return min(self.storage_retry_timeout_s, self.rank_timeout_s / 2)

    def storage_url(self, sweep_dir: str) -> str:
        """The storage as text: the configured URL, or ``sqlite:///<sweep_dir>/optuna.db``."""
        return str(self.storage) if self.storage is not None else f"sqlite:///{sweep_dir}/optuna.db"


def warn_misplaced_keys(config: DictConfig, directions: tuple[str, ...], study_name: str) -> None:
    """Warn about sweeper settings at the top of the task config (case C15, facebookresearch/hydra#2047)."""
    import logging

    misplaced = [k for k in SWEEPER_ONLY_KEYS if k in config and k != "hydra"]
    if misplaced:
        logging.getLogger(__name__).warning(
            "Key(s) %s at the top level of the task config look like sweeper settings, but only "
            "hydra.sweeper.* configures the sweep: they are ignored by the sweeper (effective direction %s, "
            "study '%s'). Move them under hydra: sweeper:, or rename them if they belong to your task.",
            misplaced,
            list(directions),
            study_name,
        )
