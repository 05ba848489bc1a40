"""One frozen :class:`Settings` built once from the ``hydra.sweeper`` node, with every check: on every rank,
before any process group exists, so a bad setting stops every rank with the same message and nothing stored is
touched.

Two nodes are checked into their own class: ``hydra.sweeper.tracking`` (:class:`TrackingSettings`: a tracker that
is not installed stops every rank with one message) and ``hydra.sweeper.stop`` (:class:`StopRules`, the rules as
the user set them; what they decide from the study is :mod:`._study._stop`).
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from ._setting_keys import check_group_nodes, check_sampler_needs, check_target_keys, merge_onto_schema
from ._setting_values import (
    check_backend, check_budget, check_enqueue_trials, check_heartbeat, check_keep_best, check_limits, check_pruner,
    check_preempt_grace, check_refit, check_refit_baselines, check_repeats, check_retry_count, check_storage_retry,
    normalize_directions,
)
from ._errors import MissingExtraError, SweeperConfigError
from ._scheduler_settings import Scheduler
from .config import PRUNERS, SAMPLERS


#: tracker name -> (the module it needs, the extra that installs it).
TRACKERS = {"mlflow": ("mlflow", "mlflow"), "tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}

#: W&B's run modes (``wandb.init(mode=...)``, W&B docs "wandb.init").
WANDB_MODES = ("online", "offline", "disabled")


@dataclass(frozen=True)
class TrackingSettings:
    """The checked ``hydra.sweeper.tracking`` node: ``report_to``, the trackers in the order given (each of
    :data:`TRACKERS` at most once; empty: off), and each tracker's node as a plain dict (``None``: the default).
    """

    report_to: tuple[str, ...] = ()
    mlflow: dict[str, Any] = field(default_factory=dict)
    tensorboard: dict[str, Any] = field(default_factory=dict)
    wandb: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_node(cls, node: Any) -> "TrackingSettings":
        """Check ``hydra.sweeper.tracking`` (already merged onto its schema).

        Raises:
            SweeperConfigError: an unknown tracker name, one named twice, or a W&B mode that is not one of
                :data:`WANDB_MODES`.
            MissingExtraError: (an ``ImportError``) a named tracker whose package is not installed; the message
                gives the ``pip install`` line of its extra.
        """
        report_to = node.report_to
        names = [report_to] if isinstance(report_to, str) else list(report_to or [])
        names = [str(n).strip().lower() for n in names if str(n).strip().lower() not in ("", "none")]
        for name in names:
            if name not in TRACKERS:
                raise SweeperConfigError(
                    f"hydra.sweeper.tracking.report_to names {name!r}; the trackers are {', '.join(TRACKERS)} "
                    "(e.g. hydra.sweeper.tracking.report_to=[mlflow,tensorboard])")
            if names.count(name) > 1:
                raise SweeperConfigError(f"hydra.sweeper.tracking.report_to names {name!r} twice")
            module, extra = TRACKERS[name]
            if importlib.util.find_spec(module) is None:
                raise MissingExtraError(
                    f"hydra.sweeper.tracking.report_to names {name}, but {module} is not installed: "
                    f"pip install 'hydra-ds-optuna-sweeper[{extra}]'")
        plain = {key: OmegaConf.to_container(node[key], resolve=True) for key in ("mlflow", "tensorboard", "wandb")}
        mode = plain["wandb"].get("mode")
        if mode is not None and mode not in WANDB_MODES:
            raise SweeperConfigError(
                f"hydra.sweeper.tracking.wandb.mode={mode!r}; use one of {', '.join(WANDB_MODES)} (null: W&B's default)")
        return cls(tuple(names), plain["mlflow"], plain["tensorboard"], plain["wandb"])

    def mlflow_uri(self, sweep_dir: str) -> str:
        """The MLflow tracking URI: ``tracking.mlflow.tracking_uri``, else ``sqlite:///<sweep_dir>/mlflow.db``
        (MLflow's SQL store in a file: nothing else has to run)."""
        return self.mlflow.get("tracking_uri") or f"sqlite:///{Path(sweep_dir).absolute()}/mlflow.db"

    def tensorboard_dir(self, sweep_dir: str) -> str:
        """The parent of the trials' TensorBoard event dirs: ``tracking.tensorboard.log_dir``, else
        ``<sweep_dir>/tensorboard``."""
        return str(Path(self.tensorboard.get("log_dir") or Path(sweep_dir) / "tensorboard").absolute())

    def wandb_dir(self, sweep_dir: str) -> str:
        """Where W&B writes (its ``wandb/`` folder below): ``tracking.wandb.dir``, else the sweep dir."""
        return str(Path(self.wandb.get("dir") or sweep_dir).absolute())


@dataclass(frozen=True)
class StopRules:
    """The checked ``hydra.sweeper.stop`` node.

    Attributes:
        goal: the best value that ends the search (the study's direction decides ``<=`` or ``>=``), or ``None``.
        patience: finished trials without a new best that end the search (>= 1), or ``None``.
        terminator: ``True`` (the default pairing, :mod:`._study._stop`), a ``_target_`` mapping, or ``None`` (off).
    """

    goal: float | None = None
    patience: int | None = None
    terminator: Any = None

    @classmethod
    def from_node(cls, node: DictConfig | Mapping[str, Any] | None, directions: tuple[str, ...]) -> "StopRules":
        """Check ``hydra.sweeper.stop`` against the study's directions.

        Raises:
            SweeperConfigError: a goal that is no finite number, a patience below 1, a terminator that is
                neither a bool nor a node with ``_target_``, or any rule with several objectives.
        """
        if node is None:
            return cls()
        if isinstance(node, DictConfig):
            node = OmegaConf.to_container(node, resolve=True)
        goal, patience, terminator = node.get("goal"), node.get("patience"), node.get("terminator")
        if goal is not None:
            if isinstance(goal, bool) or not isinstance(goal, (int, float)) or not math.isfinite(float(goal)):
                raise SweeperConfigError(f"hydra.sweeper.stop.goal must be a finite number (the best value that ends "
                                         f"the search), got {goal!r}")
            goal = float(goal)
        if patience is not None and (isinstance(patience, bool) or not isinstance(patience, int) or patience < 1):
            raise SweeperConfigError(f"hydra.sweeper.stop.patience must be an integer >= 1 (finished trials "
                                     f"without a new best), got {patience!r}")
        if terminator is False:
            terminator = None
        if terminator is not None and terminator is not True:
            if not isinstance(terminator, Mapping) or not isinstance(terminator.get("_target_"), str):
                raise SweeperConfigError(
                    "hydra.sweeper.stop.terminator must be true (Optuna's Terminator with EMMR and the median "
                    "error, no cross-validation scores needed), false, or a node with _target_ building an "
                    "optuna.terminator.BaseTerminator (docs/how-to/stop-rules.md); got " + repr(terminator))
        rules = cls(goal, patience, terminator)
        if rules and len(directions) > 1:
            raise SweeperConfigError(
                f"hydra.sweeper.stop ({rules.describe()}) needs a single objective; the study has "
                f"{len(directions)} directions {list(directions)}. Use n_trials or timeout to bound it.")
        return rules

    def __bool__(self) -> bool:
        return self.goal is not None or self.patience is not None or self.terminator is not None

    def describe(self) -> str:
        """The rules that are on, as ``key=value`` text, e.g. ``goal=0.9, patience=5``; ``""`` when none is."""
        parts = [f"goal={self.goal:g}" if self.goal is not None else "",
                 f"patience={self.patience}" if self.patience is not None else "",
                 "terminator" if self.terminator is not None else ""]
        return ", ".join(p for p in parts if p)



@dataclass(frozen=True)
class Settings:
    """The ``hydra.sweeper`` settings, checked and typed (docs/reference/config.md).

    Each field is the ``hydra.sweeper`` key of the same name (:class:`.config.DSOptunaSweeperConf`), checked; a
    ``_s`` suffix marks seconds. Beyond those:

    Attributes:
        directions: one ``"minimize"``/``"maximize"`` per objective (``direction``).
        n_jobs: at world size 1, trials handed to the launcher at once; inside a torchrun world, trial groups
            that run trials at once (see :attr:`trial_groups`, :attr:`batch`).
        timeout_s: counted from this run's first ``study.ask`` (set-up is not spent), or ``None``.
        seeds: the repeats' seeds (``seeds``, or ``0 .. repeats - 1``).
        heartbeat_interval_s, grace_period_s: ``None``: off, and Optuna's default.
        refit_*: the ``refit`` node's keys; ``refit_baselines`` as ``((name, override lines), ...)``.
        checkpoint_root, keep_best, keep_pruned, preempt_grace_s: the ``checkpoints`` node's keys
            (``checkpoint_root``: ``dir``, ``None``: ``<sweep dir>/checkpoints``).
        storage_retry_timeout_s: see :attr:`storage_retry_budget_s`.
        world_size: ranks of the launch (``WORLD_SIZE`` when the settings were built; 1 without torchrun).
        tracking, stop, scheduler: the checked nodes (:class:`TrackingSettings`, :class:`StopRules`,
            :mod:`._scheduler_settings`); none by default.
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
    refit_baselines: tuple[tuple[str, tuple[str, ...]], ...] = ()
    storage_retry_timeout_s: float = 120.0
    checkpoint_root: str | None = None
    keep_best: int = 1
    keep_pruned: bool = False
    preempt_grace_s: float = 15.0
    refit_from_checkpoint: bool = False
    refit_schedule: bool = True
    world_size: int = 1
    tracking: TrackingSettings = TrackingSettings()
    stop: StopRules = StopRules()
    scheduler: Scheduler = Scheduler()

    @classmethod
    def from_node(cls, values: Mapping[str, Any], *, world_size: int, local_world_size: int | None = None) -> "Settings":
        """Check the keys Hydra passed to the sweeper and build the settings, for ``world_size`` ranks
        (``WORLD_SIZE``; 1 without torchrun) of ``local_world_size`` per node (``None``: one node).

        Raises:
            SweeperConfigError: naming the key, the bad value and the fix; see :func:`merge_onto_schema`.
        """
        node = merge_onto_schema(values)
        checked = _checked_fields(node, world_size, local_world_size)
        scheduler = Scheduler.from_node(None if OmegaConf.is_missing(node, "scheduler") else node.scheduler,
                                        checked["directions"], None if OmegaConf.is_missing(node, "pruner") else node.pruner)
        if scheduler.population is not None:
            checked["n_trials"] = scheduler.population  # PBT's members are the budget (_study/_pbt.py)
        if scheduler.pauses and checked["repeats"] > 1:
            raise SweeperConfigError(f"hydra/sweeper/scheduler={scheduler.name} pauses a trial at its rungs and "
                                     "continues it from its checkpoint; hydra.sweeper.repeats above 1 runs each trial "
                                     "several times and has no one checkpoint to continue. Use repeats=1 with it. "
                                     "Nothing was run.")
        return cls(
            **checked,
            sampler=node.sampler,
            pruner=node.pruner,
            storage=node.storage,
            study_name=node.study_name,
            params=node.params,
            custom_search_space=node.custom_search_space,
            plots=bool(node.plots),
            plot_every=int(node.plot_every),
            seed_key=node.seed_key,
            allow_search_space_change=bool(node.allow_search_space_change),
            backend=node.backend,
            refit_enabled=bool(node.refit.enabled),
            refit_overrides=tuple(str(o) for o in node.refit.overrides),
            refit_baselines=check_refit_baselines(node),
            checkpoint_root=node.checkpoints.dir,
            keep_pruned=bool(node.checkpoints.keep_pruned),
            preempt_grace_s=check_preempt_grace(node),
            refit_from_checkpoint=bool(node.refit.from_checkpoint),
            refit_schedule=bool(node.refit.schedule),
            world_size=int(world_size),
            tracking=TrackingSettings.from_node(node.tracking),
            stop=StopRules.from_node(node.stop, checked["directions"]),
            scheduler=scheduler,
        )

    @property
    def trial_groups(self) -> int:
        """Trial groups that run trials at once inside the torchrun world (``n_jobs`` above world size 1; else 1)."""
        return self.n_jobs if self.world_size > 1 else 1

    @property
    def batch(self) -> int:
        """Trials one round asks and hands to the launcher together (``n_jobs`` at world size 1; else 1)."""
        return self.n_jobs if self.world_size <= 1 else 1

    @property
    def sampler_seed(self) -> int | None:
        """``hydra.sweeper.sampler.seed``, or ``None`` (unseeded, or a sampler without one)."""
        seed = self.sampler.get("seed")
        return None if seed is None else int(seed)

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

    @property
    def storage_is_node(self) -> bool:
        """Whether ``storage`` is a ``_target_`` node (instantiated on rank 0) rather than a URL or ``None``."""
        return OmegaConf.is_config(self.storage)

    def storage_url(self, sweep_dir: str) -> str | None:
        """The configured storage URL, or ``sqlite:///<sweep_dir>/optuna.db`` when none is set; ``None`` for a
        ``_target_`` node, which has no URL."""
        if self.storage_is_node:
            return None
        return str(self.storage) if self.storage is not None else f"sqlite:///{sweep_dir}/optuna.db"

    def storage_label(self, sweep_dir: str) -> str:
        """Text that names the storage in messages and logs (pass it through ``_study._storage_text.redact_url``):
        :meth:`storage_url`, or the ``_target_`` node's text, which is not a URL."""
        url = self.storage_url(sweep_dir)
        return url if url is not None else str(self.storage)


def _checked_fields(node: Any, world_size: int, local_world_size: int | None) -> dict[str, Any]:
    """``{field name: value}`` of the :class:`Settings` fields that take a check of more than a cast, checked in
    the order that decides which of several bad settings is named (raises ``SweeperConfigError`` on the first)."""
    n_jobs, n_trials = check_budget(node, world_size, local_world_size)
    max_failure_rate, timeout_s, rank_timeout_s = check_limits(node)
    directions = normalize_directions(node.direction)
    repeats, seeds = check_repeats(node)
    retry = check_retry_count(node)
    check_group_nodes(node)
    check_pruner(node, directions)
    check_backend(node.backend)
    refit_trials = check_refit(node, directions)
    check_target_keys(node.sampler, "sampler", SAMPLERS)
    check_sampler_needs(node.sampler)
    check_target_keys(node.pruner, "pruner", PRUNERS)
    heartbeat_s, grace_s = check_heartbeat(node)
    storage_retry_s = check_storage_retry(node)
    enqueue = check_enqueue_trials(node)
    keep_best = check_keep_best(node)
    return dict(
        n_jobs=n_jobs, n_trials=n_trials, max_failure_rate=max_failure_rate, timeout_s=timeout_s,
        rank_timeout_s=rank_timeout_s, directions=directions, repeats=repeats, seeds=seeds,
        retry_failed_trials=retry, refit_trials=refit_trials, heartbeat_interval_s=heartbeat_s,
        grace_period_s=grace_s, storage_retry_timeout_s=storage_retry_s, enqueue_trials=enqueue, keep_best=keep_best,
    )
