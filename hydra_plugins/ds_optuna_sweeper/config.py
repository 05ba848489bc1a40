"""Structured configs for ``hydra/sweeper=ds_optuna`` and its groups, and the search path entry that serves the
packaged ``deepspeed`` config group to every app. Imports only the standard library, hydra and omegaconf: Hydra's
plugin scanner imports this module in every Hydra app. Keys shared with the official ``hydra-optuna-sweeper`` keep
its meaning, except ``n_trials``, which is the study's total budget (see :class:`DSOptunaSweeperConf`).
"""


from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.config_store import ConfigStore
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import MISSING, DictConfig, OmegaConf

from ._config_groups import PRUNERS, SAMPLERS, SCHEDULERS  # noqa: F401 (re-exported: the settings check against them)

PROVIDER = "ds_optuna_sweeper"


# --- the sweeper ----------------------------------------------------------------------------------


@dataclass
class RefitConf:
    """``hydra.sweeper.refit``: run chosen trials' configs once more after the search.

    Each refit run gets the trial's overrides, then ``overrides``, in ``<sweep dir>/refit/<trial>``;
    params the task suggested itself are replayed by ``current_trial()``. The task may return a number,
    a list, or a dict of metrics; rank 0 stores them under ``refit:`` in optimization_results.yaml.
    """

    # Run the refit (false: off). With n_trials at or below the stored count, only the refit runs.
    enabled: bool = False
    # Overrides added to each refit run after the trial's own, e.g. [data.stage=final].
    overrides: List[str] = field(default_factory=list)
    # Which trials: "best" (single objective), "enqueued" (the warm-start configs, e.g. the default
    # config, for comparison) and/or trial numbers. Several objectives: numbers only.
    trials: List[Any] = field(default_factory=lambda: ["best"])
    # Named configs that are no trial, trained once more next to the trials above, in <sweep dir>/refit/<name>:
    # {name: {config key: value}} (e.g. a hand-picked default; {} is the config as composed); null: none.
    baselines: Optional[Dict[str, Any]] = field(default_factory=dict)
    # Start each refit run from the trial's newest checkpoint (current_trial().resume_from), kept by checkpoints.keep_best.
    from_checkpoint: bool = False
    # hydra/sweeper/scheduler=pbt: replay the trial's schedule (its params from each step on, each part resumed from
    # the part before's checkpoint, from step 0), as PBT trained it; false: its last params from step 0.
    schedule: bool = True


@dataclass
class CheckpointsConf:
    """``hydra.sweeper.checkpoints``: each trial's ``<dir>/trial<number>`` (the same for its retries) and
    which checkpoints rank 0 keeps after each trial ends (docs/how-to/checkpoints.md)."""

    # Parent of the trials' checkpoint dirs (null: <sweep dir>/checkpoints); on a file system every node sees.
    dir: Optional[str] = None
    # How many best COMPLETE trials keep their newest checkpoint (-1: all). Live trials keep theirs.
    keep_best: int = 1
    # Keep a pruned trial's checkpoints (false: deleted once it is pruned).
    keep_pruned: bool = False
    # Seconds a task has from SIGTERM to stop on should_preempt(); then SIGTERM acts as for a task that never
    # checks (torchrun's SIGKILL follows its SIGTERM after 30 s).
    preempt_grace: float = 15.0


@dataclass
class MlflowConf:
    """``hydra.sweeper.tracking.mlflow``: where the study's parent run and the trials' child runs go."""

    # MLflow tracking URI (a server http://..., or a store); null: sqlite:///<sweep dir>/mlflow.db.
    tracking_uri: Optional[str] = None
    # Experiment name; null: the study name.
    experiment_name: Optional[str] = None
    # Tags added to the parent run and every trial's run.
    tags: Dict[str, str] = field(default_factory=dict)


@dataclass
class TensorboardConf:
    """``hydra.sweeper.tracking.tensorboard``: one event dir per trial, ``<log_dir>/trial_<number>``."""

    # Parent dir of the trials' event dirs; null: <sweep dir>/tensorboard.
    log_dir: Optional[str] = None


@dataclass
class WandbConf:
    """``hydra.sweeper.tracking.wandb``: one W&B run per trial, grouped by the study name."""

    # W&B project; null: the study name.
    project: Optional[str] = None
    # W&B entity (team or user); null: W&B's default.
    entity: Optional[str] = None
    # "online", "offline" or "disabled"; null: W&B's own default (WANDB_MODE, else online).
    mode: Optional[str] = None
    # Where W&B writes its run files (wandb/ below it); null: the sweep dir.
    dir: Optional[str] = None
    # Tags of every trial's run.
    tags: List[str] = field(default_factory=list)


@dataclass
class TrackingConf:
    """``hydra.sweeper.tracking``: runs written by the rank that owns the study, one per trial (docs/how-to/tracking.md)."""

    # Trackers to write to: any of mlflow, tensorboard, wandb (as TrainingArguments.report_to); [] turns tracking off.
    report_to: List[str] = field(default_factory=list)
    mlflow: MlflowConf = field(default_factory=MlflowConf)
    tensorboard: TensorboardConf = field(default_factory=TensorboardConf)
    wandb: WandbConf = field(default_factory=WandbConf)


@dataclass
class StopConf:
    """``hydra.sweeper.stop``: rules that end the search before n_trials, checked by rank 0 before each ask and
    agreed by every rank and trial group (docs/how-to/stop-rules.md). Single objective only."""

    # Stop once the best value reaches this (<= when minimizing, >= when maximizing); null: off.
    goal: Optional[float] = None
    # Stop after this many finished trials (COMPLETE or PRUNED) without a new best; null: off.
    patience: Optional[int] = None
    # Optuna's terminator: true (EMMR + median error, no cross-validation needed), or a node with _target_
    # building an optuna.terminator.BaseTerminator (docs/how-to/stop-rules.md); null or false: off.
    terminator: Optional[Any] = None


_DEFAULTS = [{"sampler": "tpe"}, {"pruner": "nop"}, {"scheduler": "none"}]


@dataclass
class DSOptunaSweeperConf:
    """``hydra/sweeper=ds_optuna``: an Optuna study asked and told on rank 0 of a torchrun world.

    Attributes that differ from the official sweeper are marked; everything else keeps its meaning.
    """

    _target_: str = "hydra_plugins.ds_optuna_sweeper.sweeper.DSOptunaSweeper"
    # Sampler and pruner reach the sweeper as configs; rank 0 alone instantiates them.
    _recursive_: bool = False
    defaults: List[Any] = field(default_factory=lambda: list(_DEFAULTS))

    # Optuna sampler, from the group hydra/sweeper/sampler (tpe by default).
    sampler: Any = MISSING
    # Optuna pruner, from the group hydra/sweeper/pruner (nop by default).
    pruner: Any = MISSING
    # Scheduler that pauses and continues trials, from the group hydra/sweeper/scheduler (none by default;
    # asha: promotion ASHA; pbt: population-based training; their settings are the scheduler.* keys).
    scheduler: Any = MISSING
    # "minimize" or "maximize", or a list of them for several objectives.
    direction: Any = "minimize"
    # Optuna storage URL (sqlite:///..., postgresql://..., mysql://..., redis://host:port/db) or a _target_ node
    # (a JournalStorage; a journal backend alone is wrapped in one); null means sqlite:///<sweep dir>/optuna.db
    # (the study survives a crash).
    storage: Optional[Any] = None
    # Study name; null means the job name (hydra.job.name).
    study_name: Optional[str] = None
    # The study's total budget of trials, counting those already stored (any state; a re-queued retry or a
    # scheduler's continuation stands for the trial it continues, and a trial no rank ran is not counted).
    # Running again on the same storage resumes until the study holds n_trials trials. (Official sweeper: per run.)
    n_trials: int = 20
    # Trials at once. Under torchrun: K trial groups of W/K ranks, each running its own trials (K must divide
    # the world; docs/how-to/trial-groups.md). At world size 1 (python app.py -m): trials per launcher batch,
    # the official sweeper's meaning.
    n_jobs: int = 1
    # Rules that end the search early: stop.goal, stop.patience, stop.terminator.
    stop: StopConf = field(default_factory=StopConf)
    # Seconds for this run's trials, counted from its first trial's ask (set-up not included, as
    # Optuna's study.optimize(timeout=...)); no new trial is asked after it. null: no limit.
    timeout: Optional[float] = None
    # Failed trials / finished trials of this run above which the sweep stops (non-zero exit).
    max_failure_rate: float = 0.0
    # Search space: {override key: sweep expression}, e.g. {lr: "tag(log, interval(1e-5, 1e-3))"}.
    # Command-line overrides of the same key take precedence.
    params: Optional[Dict[str, Any]] = None
    # Dotted path of fn(cfg, trial) called on rank 0 after the params are sampled (cfg: the composed config;
    # trial: the optuna.Trial); it may call trial.suggest_* for dependent params, which join the trial's
    # overrides, so each name must be a key of the config (a param only the task reads: suggest it there).
    custom_search_space: Optional[str] = None
    # Warm start: a list of {param name: value} dicts evaluated first (known-good configs), each
    # skipped when a trial with the same params is already in the study. Names are those of the
    # search space (override keys without +).
    enqueue_trials: Optional[List[Dict[str, Any]]] = None
    # Write Optuna's plots (PNG + HTML) to <sweep dir>/plots at the end of the sweep (rank 0).
    plots: bool = True
    # Also refresh the plots every this many finished trials (0: only at the end).
    plot_every: int = 0
    # Evaluate each sampled config this many times with different seeds and tell the mean; the
    # per-seed values are kept in the trial's user attribute "ds_optuna:seed_values".
    repeats: int = 1
    # The config key that receives the seed of each repeat (required when repeats > 1), e.g.
    # training.seed. The sampler never sees it as a param.
    seed_key: Optional[str] = None
    # The seeds of the repeats; null: 0, 1, ..., repeats - 1.
    seeds: Optional[List[int]] = None
    # Seconds any wait between ranks may last (payload broadcast, result gather, config check).
    # Also the timeout of the default process group when the sweeper creates it. Raise it when one rank
    # may work alone that long between two trial calls (an evaluation or checkpoint save on rank 0 only, a slow
    # first model load); lower it to learn sooner of a lost node (a lost node costs about rank_timeout + 10 s).
    rank_timeout: float = 600.0
    # How often a trial abandoned by a dead or preempted worker (kill -9, SIGTERM, torchrun restart,
    # stale heartbeat) is re-queued with the same params. Trials that raised are never retried.
    retry_failed_trials: int = 0
    # Seconds between Optuna heartbeats of the running trial (RDB storages); null turns it off.
    heartbeat_interval: Optional[int] = 60
    # Seconds without heartbeat after which a RUNNING trial of another worker is failed; null:
    # Optuna's default (2 x heartbeat_interval).
    grace_period: Optional[int] = None
    # Seconds rank 0 keeps retrying storage calls that fail on a dropped connection or a database
    # that does not answer (backoff 0.5 s doubling to 8 s, on fresh connections) before the sweep
    # stops naming the storage; capped at rank_timeout / 2 so the other ranks never time out first.
    # 0: no retry. Not used for the first connection: a wrong URL fails at once.
    storage_retry_timeout: float = 120.0
    # Resume a stored study although the distributions of its params changed (refused by default,
    # naming the changed params).
    allow_search_space_change: bool = False
    # torch.distributed backend of the default (training) process group when the sweeper creates
    # it; null: "cpu:gloo,cuda:nccl" with CUDA, else "gloo". The control plane is always gloo.
    backend: Optional[str] = None
    # Refit (the field's term, as scikit-learn's): after the search, every rank runs the chosen
    # trials' configs once more with refit.overrides (e.g. [data.stage=final]) in <sweep dir>/refit/.
    refit: RefitConf = field(default_factory=RefitConf)
    # Each trial's checkpoint directory and the retention rule: checkpoints.dir, keep_best, keep_pruned, preempt_grace.
    checkpoints: CheckpointsConf = field(default_factory=CheckpointsConf)
    # Experiment tracking (MLflow, TensorBoard, W&B): a run per trial under the study's parent.
    tracking: TrackingConf = field(default_factory=TrackingConf)


def _open_node(schema: Any) -> DictConfig:
    """``schema``'s defaults as an open (non-struct) dict, so that a mistyped key reaches the sweeper, which names
    it and lists the valid keys (case C16, facebookresearch/hydra#2313 and #2046); Hydra's own struct error names
    neither the valid keys nor a likely fix. Types are checked when the sweeper is created (``Settings.from_node``).
    """
    node = OmegaConf.create(OmegaConf.to_container(OmegaConf.structured(schema)))
    OmegaConf.set_struct(node, False)
    return node


def register_configs() -> None:
    """Store the sweeper, sampler, pruner and scheduler nodes in Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(group="hydra/sweeper", name="ds_optuna", node=_open_node(DSOptunaSweeperConf), provider=PROVIDER)
    for group, options in (("sampler", SAMPLERS), ("pruner", PRUNERS), ("scheduler", SCHEDULERS)):
        for name, node in options.items():
            node = _open_node(node) if group == "scheduler" else node
            cs.store(group=f"hydra/sweeper/{group}", name=name, node=node, provider=PROVIDER)


register_configs()


#: The packaged config groups (``deepspeed/``: ``zero0``..``zero3``, ``none``, ``base``), shipped as package
#: data next to this file. A folder without ``.py`` files: the plugin scanner executes nothing in it.
PACKAGED_CONF_DIR = Path(__file__).resolve().parent / "_conf"


class DSOptunaSearchPathPlugin(SearchPathPlugin):
    """Put the packaged config groups (:data:`PACKAGED_CONF_DIR`) on every Hydra app's config search path.

    Hydra instantiates each discovered ``SearchPathPlugin`` when it builds an app's search path
    (``hydra._internal.utils.create_config_search_path``, hydra-core 1.3). The entry is appended after the
    app's own config dir, so an app's own ``conf/deepspeed/zero2.yaml`` wins, option by option; options the app
    lacks come from the package. Not ConfigStore nodes: Hydra refuses an app file "validated against ConfigStore
    schema with the same name" when the stored node has a defaults list (every ``zero*`` option has one).
    """

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        """Append ``file://<PACKAGED_CONF_DIR>`` with provider ``ds_optuna_sweeper`` (once), after printing
        :mod:`._argv_hint`'s hint: Hydra calls this before it parses the command line's overrides."""
        from ._argv_hint import print_argv_hint

        print_argv_hint()
        path = f"file://{PACKAGED_CONF_DIR}"
        if not any(entry.path == path for entry in search_path.get_path()):
            search_path.append(provider=PROVIDER, path=path)
