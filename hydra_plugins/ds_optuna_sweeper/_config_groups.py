"""The sampler and pruner groups of ``hydra/sweeper=ds_optuna`` (``hydra/sweeper/sampler=<name>``,
``hydra/sweeper/pruner=<name>``): one structured config per Optuna class, with Optuna's own arguments.

Registered by :func:`.config.register_configs`. Standard library only: Hydra's plugin scanner
imports ``config.py``, which imports this module, in every Hydra app.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


# --- samplers (group hydra/sweeper/sampler); arguments are Optuna's own ---------------------------
# constraints_func (TPE, NSGA-II/III, GP): Optuna's constraints_func(frozen_trial) -> [floats, feasible when all
# <= 0], given in config form as {_target_: hydra.utils.get_method, path: my_module.my_constraints}
# (docs/how-to/samplers-and-pruners.md, "Constraints"; issue 38, C58).


@dataclass
class TPESamplerConf:
    """``optuna.samplers.TPESampler``, the default sampler."""

    _target_: str = "optuna.samplers.TPESampler"
    seed: Optional[int] = None
    n_startup_trials: int = 10
    n_ei_candidates: int = 24
    multivariate: Optional[bool] = None
    group: bool = False
    # Spreads concurrent workers of a shared study (Optuna's default since 4.x).
    constant_liar: bool = True
    constraints_func: Any = None


@dataclass
class RandomSamplerConf:
    """``optuna.samplers.RandomSampler``."""

    _target_: str = "optuna.samplers.RandomSampler"
    seed: Optional[int] = None


@dataclass
class CmaEsSamplerConf:
    """``optuna.samplers.CmaEsSampler`` (needs the ``cmaes`` package)."""

    _target_: str = "optuna.samplers.CmaEsSampler"
    x0: Optional[Dict[str, Any]] = None
    sigma0: Optional[float] = None
    n_startup_trials: int = 1
    seed: Optional[int] = None
    consider_pruned_trials: bool = False
    restart_strategy: Optional[str] = None
    popsize: Optional[int] = None
    inc_popsize: int = -1
    use_separable_cma: bool = False
    with_margin: bool = False
    lr_adapt: bool = False


@dataclass
class NSGAIISamplerConf:
    """``optuna.samplers.NSGAIISampler`` (multi-objective)."""

    _target_: str = "optuna.samplers.NSGAIISampler"
    population_size: int = 50
    mutation_prob: Optional[float] = None
    crossover_prob: float = 0.9
    swapping_prob: float = 0.5
    seed: Optional[int] = None
    constraints_func: Any = None


@dataclass
class NSGAIIISamplerConf(NSGAIISamplerConf):
    """``optuna.samplers.NSGAIIISampler`` (many objectives): NSGA-II's arguments and ``dividing_parameter``."""

    _target_: str = "optuna.samplers.NSGAIIISampler"
    dividing_parameter: int = 3


@dataclass
class QMCSamplerConf:
    """``optuna.samplers.QMCSampler``."""

    _target_: str = "optuna.samplers.QMCSampler"
    qmc_type: str = "sobol"
    scramble: bool = False
    seed: Optional[int] = None


@dataclass
class GPSamplerConf:
    """``optuna.samplers.GPSampler`` (needs scipy and torch)."""

    _target_: str = "optuna.samplers.GPSampler"
    seed: Optional[int] = None
    n_startup_trials: int = 10
    deterministic_objective: bool = False
    constraints_func: Any = None


@dataclass
class GridSamplerConf:
    """``optuna.samplers.GridSampler``.

    ``search_space`` is filled by the sweeper from the discrete sweeps (``choice``, ``range``); a
    continuous ``interval`` is refused. The sweep stops when every grid point has been tried.
    """

    _target_: str = "optuna.samplers.GridSampler"
    search_space: Optional[Dict[str, Any]] = None
    seed: Optional[int] = None


@dataclass
class BruteForceSamplerConf:
    """``optuna.samplers.BruteForceSampler``."""

    _target_: str = "optuna.samplers.BruteForceSampler"
    seed: Optional[int] = None
    avoid_premature_stop: bool = False


# --- pruners (group hydra/sweeper/pruner); arguments are Optuna's own -----------------------------


@dataclass
class NopPrunerConf:
    """``optuna.pruners.NopPruner``: never prunes (default)."""

    _target_: str = "optuna.pruners.NopPruner"


@dataclass
class MedianPrunerConf:
    """``optuna.pruners.MedianPruner``; steps are the ``step`` values given to ``report``."""

    _target_: str = "optuna.pruners.MedianPruner"
    n_startup_trials: int = 5
    n_warmup_steps: int = 0
    interval_steps: int = 1
    n_min_trials: int = 1


@dataclass
class PercentilePrunerConf(MedianPrunerConf):
    """``optuna.pruners.PercentilePruner``: the median pruner's arguments and ``percentile`` (Optuna's
    ``MedianPruner`` is its 50th percentile)."""

    _target_: str = "optuna.pruners.PercentilePruner"
    percentile: float = 25.0


@dataclass
class SuccessiveHalvingPrunerConf:
    """``optuna.pruners.SuccessiveHalvingPruner``."""

    _target_: str = "optuna.pruners.SuccessiveHalvingPruner"
    min_resource: Any = "auto"
    reduction_factor: int = 4
    min_early_stopping_rate: int = 0
    bootstrap_count: int = 0


@dataclass
class HyperbandPrunerConf:
    """``optuna.pruners.HyperbandPruner``."""

    _target_: str = "optuna.pruners.HyperbandPruner"
    min_resource: int = 1
    max_resource: Any = "auto"
    reduction_factor: int = 3
    bootstrap_count: int = 0


@dataclass
class ThresholdPrunerConf:
    """``optuna.pruners.ThresholdPruner``."""

    _target_: str = "optuna.pruners.ThresholdPruner"
    lower: Optional[float] = None
    upper: Optional[float] = None
    n_warmup_steps: int = 0
    interval_steps: int = 1


@dataclass
class PatientPrunerConf:
    """``optuna.pruners.PatientPruner`` around another pruner (``wrapped_pruner`` takes a
    ``_target_`` node, or null)."""

    _target_: str = "optuna.pruners.PatientPruner"
    wrapped_pruner: Any = None
    patience: int = 1
    min_delta: float = 0.0


@dataclass
class WilcoxonPrunerConf:
    """``optuna.pruners.WilcoxonPruner``."""

    _target_: str = "optuna.pruners.WilcoxonPruner"
    p_threshold: float = 0.1
    n_startup_steps: int = 2


#: ``hydra/sweeper/sampler=<name>`` -> schema.
SAMPLERS: Dict[str, Any] = {
    "tpe": TPESamplerConf,
    "random": RandomSamplerConf,
    "cmaes": CmaEsSamplerConf,
    "nsgaii": NSGAIISamplerConf,
    "nsgaiii": NSGAIIISamplerConf,
    "qmc": QMCSamplerConf,
    "gp": GPSamplerConf,
    "grid": GridSamplerConf,
    "bruteforce": BruteForceSamplerConf,
}

@dataclass
class NoSchedulerConf:
    """No scheduler (default): every trial runs to its end unless the pruner stops it."""

    name: str = "none"


@dataclass
class AshaSchedulerConf:
    """Promotion ASHA (Li et al., "A System for Massively Parallel Hyperparameter Tuning", MLSys 2020,
    Algorithm 2): a trial pauses at each rung (``min_steps * reduction_factor**k`` steps, below ``max_steps``)
    and continues from its checkpoint when it ranks in the top ``1/reduction_factor`` of that rung."""

    name: str = "asha"
    # Steps (the ``step`` of trial.report: with the HF glue's pruning_callback thousandths of an epoch, 1000 an
    # epoch; with Lightning's the epoch) of the first rung (the paper's r).
    min_steps: int = 1
    # The task's full length in the same unit (the paper's R): no trial pauses at or past it. Required.
    max_steps: Optional[int] = None
    # The paper's eta: each rung promotes its top 1/reduction_factor, rungs are this factor apart.
    reduction_factor: int = 3
    # Paused trials that keep their checkpoint (null: all); over it, the lowest rung's worst lose theirs first
    # and can no longer be promoted.
    keep_paused: Optional[int] = None
    # The most disk the paused trials' checkpoints may take together: bytes, or a size such as 20G or 512M (powers
    # of 1024); over it, the same order as keep_paused drops them (null: no cap).
    keep_paused_bytes: Optional[Any] = None


@dataclass
class PbtSchedulerConf:
    """Population-based training (Jaderberg et al. 2017, asynchronous as Ray Tune's ``PopulationBasedTraining``):
    members pause every ``interval`` steps; a member in the bottom ``quantile`` then continues from a copy of a top
    member's checkpoint with that member's params, its ``mutations`` perturbed or resampled."""

    name: str = "pbt"
    # Steps (the ``step`` of trial.report) between two pauses of a member (Ray's perturbation_interval).
    interval: int = 1
    # The task's full length in the same unit: no member pauses at or past it. Required.
    max_steps: Optional[int] = None
    # Members (null: n_trials); replaces n_trials when set.
    population: Optional[int] = None
    # Bottom share that clones, top share that is cloned (Ray's quantile_fraction), in (0, 0.5].
    quantile: float = 0.25
    # Chance that a mutable param is drawn anew from its distribution instead of perturbed.
    resample_probability: float = 0.25
    # Factors a numeric param is multiplied by (one drawn at random), clipped to its range; a choice moves to a
    # neighbouring value. At the bound the factor points to, it moves the other way.
    perturbation: List[float] = field(default_factory=lambda: [0.8, 1.2])
    # Search-space params a clone may change (Ray's hyperparam_mutations); never one that changes the model's shape:
    # the copied checkpoint would not load. Required.
    mutations: List[str] = field(default_factory=list)


#: ``hydra/sweeper/scheduler=<name>`` -> schema.
SCHEDULERS: Dict[str, Any] = {"none": NoSchedulerConf, "asha": AshaSchedulerConf, "pbt": PbtSchedulerConf}

#: ``hydra/sweeper/pruner=<name>`` -> schema.
PRUNERS: Dict[str, Any] = {
    "nop": NopPrunerConf,
    "median": MedianPrunerConf,
    "percentile": PercentilePrunerConf,
    "successive_halving": SuccessiveHalvingPrunerConf,
    "hyperband": HyperbandPrunerConf,
    "threshold": ThresholdPrunerConf,
    "patient": PatientPrunerConf,
    "wilcoxon": WilcoxonPrunerConf,
}
