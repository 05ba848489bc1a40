"""The sweep loop: rank 0 asks, every rank runs the same trial, rank 0 tells.

One round, on every rank (see DESIGN.md)::

    rank 0     Command = ask trial(s) -> TrialPayload (number, params, override list, sweep dir) | stop
    all        broadcast Command over the gloo control group
    all        launcher.launch(overrides + this rank's extras, initial_job_idx=trial number)
                 -> wrapped task: compare resolved-config fingerprints, then the user's task
    all        all_gather RankOutcome (ok/failed/pruned/interrupted, values, error)
    all        agree() -> one Verdict per trial, identical on every rank
    rank 0     study.tell(...)

Every control call is reached by every rank on every path: errors on rank 0 travel inside the next
Command instead of skipping it, and a failure on any rank travels inside its RankOutcome.

This module is named with a leading underscore so Hydra's plugin scanner skips it; it may import
optuna and torch at top level.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import signal
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import optuna
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig, OmegaConf, open_dict
from optuna.trial import TrialState

from . import _plots as plots, _results as results
from .config import SWEEPER_ONLY_KEYS
from ._errors import (
    ConfigMismatchError,
    DSOptunaSweeperError,
    Preempted,
    SweeperConfigError,
    TrainingGroupBrokenError,
    TrialFailedError,
)
from . import _storage as storage_mod
from ._ranks import RankContext, setup_ranks
from ._search_space import SearchSpace, build_search_space, describe_distribution, format_value, span_warnings
from ._trial import RankTrial, TrialPayload, trial_slot

log = logging.getLogger("hydra_plugins.ds_optuna_sweeper")

OK, FAILED, PRUNED, INTERRUPTED = "ok", "failed", "pruned", "interrupted"

#: User attribute marking trials queued by ``hydra.sweeper.enqueue_trials``.
ENQUEUED_ATTR = "ds_optuna:enqueued"

#: User attribute holding ``{seed: [values]}`` when ``repeats > 1``.
SEED_VALUES_ATTR = "ds_optuna:seed_values"

#: Trials that count against ``n_trials``: every state but WAITING (queued, not yet run).
COUNTED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)


@dataclass(frozen=True)
class Command:
    """Rank 0's order for the next round.

    Attributes:
        kind: ``"run"`` (run ``payloads``) or ``"stop"`` (leave the loop).
        payloads: the trials to run; exactly one when the world size is above 1.
        error: with ``"stop"``, the reason every rank must raise (failure rate, storage error...).
        reason: with ``"stop"`` and no error, why the sweep ended (budget, timeout, grid done).
    """

    kind: str
    payloads: tuple[TrialPayload, ...] = ()
    error: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class RankOutcome:
    """How one trial ended on one rank.

    Attributes:
        number: trial number.
        state: ``ok``, ``failed``, ``pruned`` or ``interrupted`` (SystemExit/KeyboardInterrupt).
        values: the objective values this rank's task returned (``ok`` only).
        error: one-line description of the failure, naming the exception type.
    """

    number: int
    state: str
    values: tuple[float, ...] | None = None
    error: str | None = None
    seed_values: dict[int, tuple[float, ...]] | None = None


@dataclass(frozen=True)
class Verdict:
    """What all ranks agree happened to one trial.

    Attributes:
        number: trial number.
        state: the Optuna state to tell: COMPLETE, PRUNED or FAIL.
        values: rank 0's objective values when COMPLETE, else None.
        error: why it failed, with the failing ranks named.
        interrupted: True when a rank was interrupted; every rank then stops the sweep.
    """

    number: int
    state: TrialState
    values: tuple[float, ...] | None
    error: str | None = None
    interrupted: bool = False
    seed_values: dict[int, tuple[float, ...]] | None = None


@dataclass(frozen=True)
class Setup:
    """Rank 0's sweep-level facts, broadcast once before the first trial."""

    sweep_dir: str | None
    resolver_cache: Any = None
    error: str | None = None


def objective_values(ret: Any, n_objectives: int) -> tuple[float, ...]:
    """Turn a task's return value into ``n_objectives`` finite floats.

    Accepts a number (int, float, a 0-d tensor or numpy scalar) or a sequence of them.

    Raises:
        ValueError: if the task returned nothing, a non-number, the wrong number of values, or NaN
            (case C06: facebookresearch/hydra#2237; a NaN trial is told FAIL, never COMPLETE).
    """
    if ret is None:
        raise ValueError(f"the task returned None; it must return {n_objectives} number(s) (the objective)")
    items = list(ret) if isinstance(ret, (list, tuple)) else [ret]
    if len(items) != n_objectives:
        raise ValueError(
            f"the task returned {len(items)} value(s) ({ret!r}) but the study has {n_objectives} "
            "direction(s); return one number per entry of hydra.sweeper.direction"
        )
    values = []
    for item in items:
        try:
            value = float(item)
        except (TypeError, ValueError) as e:
            raise ValueError(f"the task returned {item!r} ({type(item).__name__}), not a number") from e
        if math.isnan(value):
            raise ValueError("the task returned NaN")
        values.append(value)
    return tuple(values)


def agree(number: int, outcomes: Sequence[RankOutcome]) -> Verdict:
    """Combine every rank's :class:`RankOutcome` of one trial into one :class:`Verdict`.

    Pure and deterministic, so every rank computes the same verdict from the same gathered list.
    A failure or interruption on any rank fails the trial; a prune on any rank (all ranks normally
    agree, since the verdict is broadcast) prunes it; otherwise rank 0's values are the result.
    """
    bad = [(r, o) for r, o in enumerate(outcomes) if o.state in (FAILED, INTERRUPTED)]
    if bad:
        text = "; ".join(f"rank {r}: {o.error}" for r, o in bad)
        return Verdict(
            number,
            TrialState.FAIL,
            None,
            error=text,
            interrupted=any(o.state == INTERRUPTED for _, o in bad),
        )
    if any(o.state == PRUNED for o in outcomes):
        return Verdict(number, TrialState.PRUNED, None)
    return Verdict(number, TrialState.COMPLETE, outcomes[0].values, seed_values=outcomes[0].seed_values)


def combine_repeats(number: int, per_seed: Sequence[RankOutcome], seeds: Sequence[int]) -> RankOutcome:
    """One rank's outcome of a trial run once per seed: the first failure or interruption wins, then a
    prune; otherwise the values are the mean over the seeds (each objective separately) and the
    per-seed values are kept (``hydra.sweeper.repeats``, facebookresearch/hydra#1969)."""
    for state in (INTERRUPTED, FAILED):
        bad = [(s, o) for s, o in zip(seeds, per_seed) if o.state == state]
        if bad:
            return RankOutcome(number, state, error="; ".join(f"seed {s}: {o.error}" for s, o in bad))
    if any(o.state == PRUNED for o in per_seed):
        return RankOutcome(number, PRUNED)
    values = [o.values or () for o in per_seed]
    mean = tuple(sum(v[i] for v in values) / len(values) for i in range(len(values[0])))
    return RankOutcome(number, OK, mean, seed_values={s: o.values or () for s, o in zip(seeds, per_seed)})


def tell(study: optuna.Study, trial: optuna.trial.Trial, state: TrialState, values: list[float] | None) -> bool:
    """``study.tell`` that survives samplers asking to stop.

    ``GridSampler`` and ``BruteForceSampler`` call ``Study.stop()`` from ``after_trial`` once every
    point was tried, and ``Study.stop()`` raises ``RuntimeError`` outside ``Study.optimize``
    (optuna/samplers/_grid.py, optuna/study/study.py). Optuna stores the trial's state before that
    (optuna/study/_tell.py), so the error only means "no point left".

    Returns:
        True when the sampler asked the study to stop.

    Raises:
        RuntimeError: any other failure, or if the trial is still RUNNING afterwards.
    """
    try:
        if state == TrialState.COMPLETE:
            study.tell(trial, values)
        else:
            study.tell(trial, state=state)
    except RuntimeError:
        if study._storage.get_trial(trial._trial_id).state == TrialState.RUNNING:
            raise
        return True
    return False


def check_search_space_unchanged(study: optuna.Study, space: SearchSpace, allowed: bool) -> None:
    """Refuse a search space whose distributions differ from those of the stored trials.

    A resumed study whose ranges changed mixes trials from two problems: samplers model them as one,
    and best values stop being comparable. Params added or dropped are fine.

    Args:
        study: the loaded study.
        space: this run's search space.
        allowed: ``hydra.sweeper.allow_search_space_change``; when true, changes are only logged.

    Raises:
        SweeperConfigError: naming each changed param with its stored and new distribution.
    """
    from ._search_space import describe_distribution

    changed: dict[str, tuple[Any, Any]] = {}
    for trial in study.get_trials(deepcopy=False):
        for name, dist in trial.distributions.items():
            spec = space.params.get(name)
            if spec is not None and name not in changed and dist != spec.distribution:
                changed[name] = (dist, spec.distribution)
    if not changed:
        return
    text = "; ".join(
        f"'{n}': stored {describe_distribution(old)}, now {describe_distribution(new)}" for n, (old, new) in changed.items()
    )
    if allowed:
        log.warning("Search space changed since the stored trials (allowed): %s", text)
        return
    raise SweeperConfigError(
        f"Study '{study.study_name}' holds trials with other distributions: {text}. Resume with the same search "
        "space, use another study_name (or storage) for the new one, or set "
        "hydra.sweeper.allow_search_space_change=true to mix them. Nothing was run and no stored trial changed."
    )


def config_fingerprint(cfg: DictConfig) -> str:
    """SHA-256 of ``OmegaConf.to_yaml(cfg, resolve=True)``: equal configs, equal hashes, on any rank."""
    return hashlib.sha256(OmegaConf.to_yaml(cfg, resolve=True).encode()).hexdigest()


def flatten(container: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b.c": leaf}`` for a nested dict/list container."""
    out: dict[str, Any] = {}
    items = container.items() if isinstance(container, dict) else enumerate(container) if isinstance(container, list) else None
    if items is None:
        return {prefix: container}
    for k, v in items:
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, (dict, list)) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def differing_keys(flat_configs: Sequence[dict[str, Any]]) -> list[str]:
    """Keys whose value is not the same in every flattened config (missing counts as different)."""
    keys = set().union(*flat_configs)
    return sorted(k for k in keys if any(f.get(k, KeyError) != flat_configs[0].get(k, KeyError) for f in flat_configs))


def _normalize_directions(direction: Any) -> list[str]:
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
    return out


class SweepRunner:
    """Runs one sweep on one rank. Created by :class:`~hydra_plugins.ds_optuna_sweeper.sweeper.DSOptunaSweeper`.

    Args:
        sweeper_cfg: the ``hydra.sweeper`` node (a ``DSOptunaSweeperConf``), sampler and pruner
            still as configs (rank 0 alone instantiates them).
    """

    def __init__(self, sweeper_cfg: DictConfig) -> None:
        self.cfg = sweeper_cfg
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self.launcher: Launcher | None = None
        self.ctx = RankContext()
        self.directions: list[str] = []
        self.study: optuna.Study | None = None
        self.space: SearchSpace | None = None
        self.sweep_dir = ""
        self._asked: dict[int, optuna.trial.Trial] = {}
        self._pending_error: str | None = None
        self._sampler_requested_stop = False
        self._finished = 0
        self._failed = 0
        self._current_payload: TrialPayload | None = None
        self._checked: set[int] = set()
        self._trial_started: dict[int, float] = {}
        self._raise_after_broadcast: BaseException | None = None
        self._stopping = False
        self._timer = PhaseTimer(os.environ.get(TIMINGS_ENV))

    # --- Hydra entry points ---------------------------------------------------------------------

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Keep Hydra's context and create the launcher around our wrapped task function."""
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=self._run_task
        )

    def sweep(self, arguments: list[str]) -> None:
        """Run the sweep on this rank until rank 0 says stop.

        Raises:
            SweeperConfigError, SearchSpaceError: bad settings or search space, on every rank,
                before any trial is asked.
            TrialFailedError: failure rate above ``max_failure_rate``, or a rank was interrupted.
            RankTimeoutError: a peer rank did not answer within ``rank_timeout`` seconds.
        """
        assert self.config is not None
        self.ctx = setup_ranks(float(self.cfg.rank_timeout), self.cfg.get("backend"))
        created_group = self.ctx.distributed
        previous_sigterm = self._install_sigterm_handler() if self.ctx.is_main else None
        try:
            self._check_local_settings()
            self._start(arguments)
            self._loop()
        except BaseException as e:
            self._stopping = True
            if self.ctx.is_main and self.study is not None and self._asked:
                # Leaving with a trial still asked (a peer timed out, an interrupt): close it so the
                # study holds no RUNNING trial that nobody runs.
                why = "SIGTERM" if isinstance(e, Preempted) else f"the sweep stopped: {_describe(e)}"
                storage_mod.abandon(
                    self.study, list(self._asked), int(self.cfg.retry_failed_trials), why, self._storage_text()
                )
            raise
        finally:
            if previous_sigterm is not None:
                signal.signal(signal.SIGTERM, previous_sigterm)
            if self.ctx.is_main and self.study is not None:
                try:
                    log.info("Trials of study '%s':\n%s", self.study.study_name, results.summary_table(self.study))
                    results.write_results(self.study, self.space, self.sweep_dir, self.directions)
                    if self.cfg.plots:
                        plots.write_plots(self.study, self.sweep_dir)
                except Exception:  # never mask the sweep's own outcome
                    log.exception("Writing the results failed")
            if created_group:
                self._close_group()

    def _install_sigterm_handler(self) -> Any:
        """On rank 0, close the running trial(s) in storage when SIGTERM arrives (preemption, or
        torchrun stopping the group), then die of SIGTERM as before. Running the same command again
        resumes the study; with ``retry_failed_trials`` the closed trial is re-queued.

        Returns:
            The previous handler, or ``None`` when not in the main thread.
        """
        if threading.current_thread() is not threading.main_thread():
            return None

        def on_sigterm(signum: int, frame: Any) -> None:
            # No storage work here: the main thread may be inside a database commit. Unwind it
            # instead; sweep() closes the trial on the way out. A second SIGTERM during that
            # clean-up is ignored (torchrun sends SIGKILL 30 s after its SIGTERM anyway).
            if self._stopping:
                return
            self._stopping = True
            log.warning("rank 0 received SIGTERM: closing the running trial and exiting")
            raise Preempted(128 + signum)

        previous = signal.signal(signal.SIGTERM, on_sigterm)
        return previous if previous is not None else signal.SIG_DFL

    # --- start ----------------------------------------------------------------------------------

    def _check_local_settings(self) -> None:
        n_jobs = int(self.cfg.n_jobs)
        if n_jobs < 1:
            raise SweeperConfigError(f"hydra.sweeper.n_jobs must be >= 1, got {n_jobs=}")
        if n_jobs > 1 and self.ctx.world_size > 1:
            raise SweeperConfigError(
                f"hydra.sweeper.n_jobs={n_jobs} inside a torchrun world of {self.ctx.world_size} ranks: every "
                "rank takes part in each trial, so trials cannot run side by side inside one world. Use "
                "n_jobs=1, and for parallel trials start several torchrun groups on one shared storage "
                "(hydra.sweeper.storage=postgresql://... with the same study_name)."
            )
        if int(self.cfg.n_trials) < 0:
            raise SweeperConfigError(f"hydra.sweeper.n_trials must be >= 0, got {self.cfg.n_trials=}")
        rate = float(self.cfg.max_failure_rate)
        if not 0.0 <= rate <= 1.0:
            raise SweeperConfigError(f"hydra.sweeper.max_failure_rate must be within [0, 1], got {rate=}")
        if self.cfg.timeout is not None and float(self.cfg.timeout) <= 0:
            raise SweeperConfigError(f"hydra.sweeper.timeout must be > 0 seconds or null, got {self.cfg.timeout=}")
        self.directions = _normalize_directions(self.cfg.direction)
        repeats = int(self.cfg.repeats)
        if repeats < 1:
            raise SweeperConfigError(f"hydra.sweeper.repeats must be >= 1, got {repeats=}")
        if repeats > 1 and not self.cfg.seed_key:
            raise SweeperConfigError(
                f"hydra.sweeper.repeats={repeats} needs hydra.sweeper.seed_key: the config key that takes each "
                "repeat's seed (e.g. training.seed)"
            )
        if self.cfg.seeds is not None and len(self.cfg.seeds) != repeats:
            raise SweeperConfigError(
                f"hydra.sweeper.seeds has {len(self.cfg.seeds)} seed(s) but repeats={repeats}; give one per repeat"
            )

    def _start(self, arguments: list[str]) -> None:
        assert self.config is not None
        setup = Setup(None)
        if self.ctx.is_main:
            try:
                setup = self._start_main(arguments)
            except Exception as e:
                log.error("Sweep set-up failed on rank 0: %s", e)
                setup = Setup(None, error=f"{type(e).__name__}: {e}")
                if not self.ctx.distributed:
                    raise
                self._raise_after_broadcast = e
        setup = self.ctx.broadcast(setup, what="sweep set-up", trial=None)
        if setup.error:
            if self.ctx.is_main and self._raise_after_broadcast is not None:
                raise self._raise_after_broadcast
            raise DSOptunaSweeperError(f"rank 0 could not start the sweep: {setup.error}")
        self.sweep_dir = str(setup.sweep_dir)
        if not self.ctx.is_main:
            OmegaConf.set_cache(self.config, setup.resolver_cache)
            logging.getLogger("hydra._internal.core_plugins.basic_launcher").setLevel(logging.WARNING)
        with open_dict(self.config):
            self.config.hydra.sweep.dir = self.sweep_dir
        self._rank_overrides = self._make_rank_overrides()
        log.info("ds_optuna: %s", self.ctx.describe())

    def _start_main(self, arguments: list[str]) -> Setup:
        assert self.config is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        self.sweep_dir = str(sweep_dir)
        cache = OmegaConf.get_cache(self.config)
        self.space = build_search_space(self.cfg.params, arguments)
        if int(self.cfg.repeats) > 1 and str(self.cfg.seed_key) in self.space.params:
            raise SweeperConfigError(
                f"hydra.sweeper.seed_key={self.cfg.seed_key} is also searched; the repeats set it, so it "
                "cannot be a param of the study. Remove it from the search space."
            )
        for warning in span_warnings(self.space):
            log.warning(warning)
        pruner_target = str(self.cfg.pruner.get("_target_", ""))
        if len(self.directions) > 1 and not pruner_target.endswith("NopPruner"):
            raise SweeperConfigError(
                f"hydra.sweeper.pruner ({pruner_target}) with {len(self.directions)} objectives: Optuna's "
                "pruners need one intermediate value per step, and Trial.report is not supported for "
                "multi-objective studies. Use hydra/sweeper/pruner=nop, or one direction."
            )
        self.study = self._create_study(self.space)
        self._enqueue(self.study, self.space)
        log.info(
            "Study '%s' in %s, direction(s) %s, sampler %s, pruner %s; budget n_trials=%d (%d already counted)",
            self.study.study_name,
            _redact(self._storage_text()),
            self.directions,
            type(self.study.sampler).__name__,
            type(self.study.pruner).__name__,
            int(self.cfg.n_trials),
            len(self.study.get_trials(deepcopy=False, states=COUNTED_STATES)),
        )
        log.info("Sweep dir: %s", self.sweep_dir)
        self._warn_misplaced_keys()
        lines = self.space.describe() or ["(no searched params: every trial runs the fixed overrides)"]
        log.info("Search space:\n  %s", "\n  ".join(lines))
        if self.space.fixed:
            log.info("Fixed overrides: %s", self.space.fixed)
        return Setup(self.sweep_dir, dict(cache) if cache else {})

    def _enqueue(self, study: optuna.Study, space: SearchSpace) -> None:
        """Queue ``hydra.sweeper.enqueue_trials`` (skipping params already in the study).

        Raises:
            SweeperConfigError: for a param that is not in the search space or a value outside
                its distribution.
        """
        entries = self.cfg.enqueue_trials
        if not entries:
            return
        for i, entry in enumerate(OmegaConf.to_container(entries, resolve=True)):
            if not isinstance(entry, dict) or not entry:
                raise SweeperConfigError(f"hydra.sweeper.enqueue_trials[{i}] must be a non-empty mapping, got {entry!r}")
            for name, value in entry.items():
                spec = space.params.get(name)
                if spec is None:
                    raise SweeperConfigError(
                        f"hydra.sweeper.enqueue_trials[{i}] sets '{name}', which is not a searched param "
                        f"(searched: {sorted(space.params)})"
                    )
                dist = spec.distribution
                if not dist._contains(dist.to_internal_repr(value)):
                    raise SweeperConfigError(
                        f"hydra.sweeper.enqueue_trials[{i}]: {name}={value!r} is outside its distribution "
                        f"({describe_distribution(dist)})"
                    )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.enqueue_trial(entry, user_attrs={ENQUEUED_ATTR: True}, skip_if_exists=True)
        log.info("Warm start: %d enqueued config(s) (skipped when already in the study)", len(entries))

    def _warn_misplaced_keys(self) -> None:
        """Warn about sweeper settings at the top of the task config (case C15)."""
        assert self.config is not None
        misplaced = [k for k in SWEEPER_ONLY_KEYS if k in self.config and k != "hydra"]
        if misplaced:
            log.warning(
                "Key(s) %s at the top level of the task config look like sweeper settings, but only "
                "hydra.sweeper.* configures the sweep: they are ignored by the sweeper (effective direction %s, "
                "study '%s'). Move them under hydra: sweeper:, or rename them if they belong to your task.",
                misplaced,
                self.directions,
                self.study.study_name if self.study is not None else "?",
            )

    def _storage_text(self) -> str:
        storage = self.cfg.storage
        return str(storage) if storage is not None else f"sqlite:///{self.sweep_dir}/optuna.db"

    def _create_study(self, space: SearchSpace) -> optuna.Study:
        assert self.config is not None
        sampler_cfg = self.cfg.sampler
        kwargs: dict[str, Any] = {}
        if int(self.cfg.retry_failed_trials) < 0:
            raise SweeperConfigError(f"hydra.sweeper.retry_failed_trials must be >= 0, got {self.cfg.retry_failed_trials}")
        if str(sampler_cfg.get("_target_", "")).endswith("GridSampler") and not sampler_cfg.get("search_space"):
            kwargs["search_space"] = space.grid()
        sampler = instantiate(sampler_cfg, **kwargs)
        pruner = instantiate(self.cfg.pruner)
        study_name = self.cfg.study_name or str(self.config.hydra.job.name)
        try:
            storage: Any = self.cfg.storage
            if OmegaConf.is_config(storage):
                storage = instantiate(storage)
            else:
                storage = storage_mod.open_storage(
                    self._storage_text(),
                    heartbeat_interval_s=self.cfg.heartbeat_interval,
                    grace_period_s=self.cfg.grace_period,
                    max_retry=int(self.cfg.retry_failed_trials),
                )
            study = optuna.create_study(
                storage=storage,
                sampler=sampler,
                pruner=pruner,
                study_name=study_name,
                directions=self.directions,
                load_if_exists=True,
            )
        except Exception as e:
            raise SweeperConfigError(
                f"Cannot open the Optuna storage {_redact(self._storage_text())!r} for study '{study_name}': "
                f"{type(e).__name__}: {e}. Check hydra.sweeper.storage (a URL such as sqlite:///path/optuna.db "
                "or postgresql://user@host/db, reachable from rank 0)."
            ) from e
        stored = [d.name.lower() for d in study.directions]
        if stored != self.directions:
            raise SweeperConfigError(
                f"Study '{study_name}' in {_redact(self._storage_text())} was created with direction(s) {stored}, "
                f"but hydra.sweeper.direction is {self.directions}. Use the stored direction(s), or another "
                "study_name for a new study; the stored trials are kept."
            )
        check_search_space_unchanged(study, space, bool(self.cfg.allow_search_space_change))
        # A torchrun restart (--max-restarts) keeps TORCHELASTIC_RUN_ID: our own RUNNING trials
        # belong to the group that died (case C09).
        storage_mod.abandon(
            study,
            storage_mod.own_running_trials(study, storage_mod.group_id()),
            int(self.cfg.retry_failed_trials),
            "its torchrun group was restarted",
        )
        storage_mod.fail_stale(study)
        return study

    def _make_rank_overrides(self) -> list[str]:
        """Overrides this rank adds to every job: rank 0's sweep dir, per-rank log file, and no
        ``.hydra/`` writes on ranks other than 0 (two writers tear the files, NOTES-hydra.md)."""
        assert self.config is not None
        extra = [f"hydra.sweep.dir={format_value(self.sweep_dir)}"]
        if self.ctx.distributed:
            if OmegaConf.select(self.config, "hydra.job_logging.handlers.file") is not None:
                name = "'${hydra.runtime.output_dir}/${hydra.job.name}_rank" + str(self.ctx.rank) + ".log'"
                extra.append(f"hydra.job_logging.handlers.file.filename={name}")
            if not self.ctx.is_main:
                extra.append("hydra.output_subdir=null")
        return extra

    # --- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        self._t0 = time.monotonic()
        last_number: int | None = None
        timer = self._timer
        while True:
            timer.start()
            command = Command("stop")
            if self.ctx.is_main:
                with timer.phase("ask"):
                    try:
                        command = self._next_command()
                    except Exception as e:
                        log.exception("Rank 0 could not prepare the next trial")
                        command = Command("stop", error=f"rank 0 could not prepare the next trial: {type(e).__name__}: {e}")
            hint = None if last_number is None else last_number + 1
            with timer.phase("broadcast"):
                command = self.ctx.broadcast(command, what="trial payload", trial=hint)
            if command.kind == "stop":
                if command.error:
                    raise TrialFailedError(command.error)
                if self.ctx.is_main:
                    log.info("Sweep finished: %s", command.reason)
                return
            with timer.phase("launch"):
                outcomes = self._run_payloads(command.payloads)
            with timer.phase("gather"):
                gathered = self.ctx.all_gather(
                    outcomes, what="trial result", trial=command.payloads[0].number, patient=True
                )
            verdicts = [agree(p.number, [g[i] for g in gathered]) for i, p in enumerate(command.payloads)]
            if self.ctx.is_main:
                with timer.phase("tell"):
                    for verdict in verdicts:
                        self._tell(verdict)
            last_number = command.payloads[-1].number
            timer.finish(self.ctx, last_number)
            failed = [v for v in verdicts if v.state == TrialState.FAIL and not v.interrupted]
            if failed and self.ctx.distributed:
                self._check_training_group(failed[0])
            interrupted = [v for v in verdicts if v.interrupted]
            if interrupted:
                raise TrialFailedError(
                    f"trial {interrupted[0].number} was interrupted ({interrupted[0].error}); every rank stops. "
                    "Run the same command again to resume the study."
                )

    def _check_training_group(self, verdict: Verdict) -> None:
        """After a failed trial, check that the training process group still works on every rank.

        A rank released from a training collective by its timeout leaves the group broken: gloo
        closes the pair for good ("Application timeout caused pair closure"), and re-creating the
        default group in the same processes fails (NOTES-cpu.md). Then every rank stops with a
        non-zero exit so that ``torchrun --max-restarts`` restarts the group, which resumes the
        study from storage. A healthy group (the failure left no collective unmatched) goes on.

        Raises:
            TrainingGroupBrokenError: on every rank when the probe failed on any rank.
        """
        import torch
        import torch.distributed as dist

        try:
            probe = torch.zeros(1)
            dist.all_reduce(probe)
            mine: str | None = None
        except Exception as e:
            mine = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        errors = [(r, err) for r, err in enumerate(self.ctx.all_gather(mine, what="training group probe", trial=verdict.number)) if err]
        if errors:
            raise TrainingGroupBrokenError(
                f"trial {verdict.number} failed ({verdict.error}) and left the training process group broken: "
                + "; ".join(f"rank {r}: {err}" for r, err in errors)
                + ". Trial told FAIL; every rank exits non-zero so that torchrun --max-restarts N restarts the "
                "group, which resumes the study from storage (the same command resumes it too)."
            )

    def _next_command(self) -> Command:
        assert self.study is not None and self.space is not None
        if self._pending_error:
            return Command("stop", error=self._pending_error)
        rate = self._failed / self._finished if self._finished else 0.0
        if self._failed and rate > float(self.cfg.max_failure_rate):
            return Command(
                "stop",
                error=(
                    f"{self._failed} of {self._finished} trials of this run failed (failure rate {rate:.2f} > "
                    f"hydra.sweeper.max_failure_rate={float(self.cfg.max_failure_rate)}); see the errors logged "
                    "above. The study keeps every trial; fix the cause and run the same command to resume."
                ),
            )
        timeout = self.cfg.timeout
        if timeout is not None and time.monotonic() - self._t0 >= float(timeout):
            return Command("stop", reason=f"hydra.sweeper.timeout={float(timeout):g} s reached")
        if self._sampler_requested_stop:
            return Command("stop", reason="the sampler has no point left (every grid point was tried)")
        storage_mod.fail_stale(self.study)
        stored = len(self.study.get_trials(deepcopy=False, states=COUNTED_STATES))
        remaining = int(self.cfg.n_trials) - stored
        if remaining <= 0:
            return Command("stop", reason=f"the study holds {stored} trials (n_trials={int(self.cfg.n_trials)})")
        batch = min(int(self.cfg.n_jobs), remaining)
        payloads = []
        custom = get_method(self.cfg.custom_search_space) if self.cfg.custom_search_space else None
        group = storage_mod.group_id()
        for _ in range(batch):
            with warnings.catch_warnings():
                # We record heartbeats ourselves (storage.Heartbeat) outside Study.optimize.
                warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
                trial = self.study.ask(fixed_distributions=self.space.distributions())
            self._asked[trial.number] = trial
            if group is not None:
                trial.set_user_attr(storage_mod.GROUP_ATTR, group)
            try:
                if custom is not None:
                    custom(self.config, trial)
                params = dict(trial.params)
                payloads.append(TrialPayload(trial.number, params, self.space.overrides(params), self.sweep_dir))
            except Exception as e:
                self.study.tell(trial, state=TrialState.FAIL)
                self._asked.pop(trial.number, None)
                for p in payloads:  # asked but never run: do not leave them RUNNING
                    self.study.tell(self._asked.pop(p.number), state=TrialState.FAIL)
                raise DSOptunaSweeperError(f"custom_search_space failed for trial {trial.number}: {e}") from e
        return Command("run", tuple(payloads))

    def _tell(self, verdict: Verdict) -> None:
        assert self.study is not None
        trial = self._asked.pop(verdict.number)
        elapsed = time.monotonic() - self._trial_started.pop(verdict.number, time.monotonic())
        self._finished += 1
        if verdict.state == TrialState.FAIL:
            self._failed += 1
        try:
            if verdict.seed_values:
                trial.set_user_attr(SEED_VALUES_ATTR, {str(k): list(v) for k, v in verdict.seed_values.items()})
            values = list(verdict.values) if verdict.state == TrialState.COMPLETE and verdict.values else None
            if tell(self.study, trial, verdict.state, values):
                self._sampler_requested_stop = True
        except Exception as e:
            self._pending_error = f"study.tell failed for trial {verdict.number}: {type(e).__name__}: {e}"
            log.exception("study.tell failed for trial %d", verdict.number)
            return
        results.log_progress(self.study, verdict.number, trial.params, verdict.state, verdict.values, elapsed, verdict.error)
        every = int(self.cfg.plot_every)
        if self.cfg.plots and every > 0 and self._finished % every == 0:
            plots.write_plots(self.study, self.sweep_dir)

    # --- running one trial on this rank ---------------------------------------------------------

    def _run_payloads(self, payloads: Sequence[TrialPayload]) -> list[RankOutcome]:
        """Launch the payloads' jobs on this rank; consecutive trial numbers go in one batch.

        With ``repeats > 1`` each trial runs once per seed (``seed_key=<seed>``, job dir
        ``<number>/seed<seed>``), on every rank, whatever happened to the earlier seeds, so that all
        ranks make the same calls; the outcome's values are the mean over the seeds.
        """
        for p in payloads:
            self._trial_started[p.number] = time.monotonic()
        seeds = self._seeds()
        if seeds is None:
            outcomes: list[RankOutcome] = []
            batches: list[list[TrialPayload]] = []
            for p in payloads:
                if batches and batches[-1][-1].number + 1 == p.number:
                    batches[-1].append(p)
                else:
                    batches.append([p])
            for batch in batches:
                outcomes.extend(self._launch(batch, []))
            return outcomes
        combined = []
        for p in payloads:
            per_seed = []
            for seed in seeds:
                extra = [f"{self.cfg.seed_key}={format_value(seed)}", f"hydra.sweep.subdir={format_value(f'{p.number}/seed{seed}')}"]
                per_seed.append(self._launch([p], extra)[0])
            combined.append(combine_repeats(p.number, per_seed, seeds))
        return combined

    def _seeds(self) -> list[int] | None:
        repeats = int(self.cfg.repeats)
        if repeats <= 1:
            return None
        seeds = list(self.cfg.seeds) if self.cfg.seeds is not None else list(range(repeats))
        return seeds

    def _launch(self, batch: list[TrialPayload], extra: list[str]) -> list[RankOutcome]:
        """One ``launcher.launch`` of ``batch`` (consecutive trial numbers) with ``extra`` overrides."""
        assert self.launcher is not None
        outcomes: list[RankOutcome] = []
        self._current_payload = batch[0] if len(batch) == 1 else None
        beat = (
            storage_mod.Heartbeat(self.study, [self._asked[p.number]._trial_id for p in batch])
            if self.ctx.is_main and self.study is not None
            else contextlib.nullcontext()
        )
        try:
            with beat:
                rets = self.launcher.launch(
                    [list(p.overrides) + extra + self._rank_overrides for p in batch], initial_job_idx=batch[0].number
                )
            outcomes.extend(self._outcome(p, r) for p, r in zip(batch, rets))
        except Preempted:
            raise  # peers are being stopped too: do not wait for them
        except (KeyboardInterrupt, SystemExit) as e:
            self._log_failure(batch[0].number, e)
            outcomes.extend(RankOutcome(p.number, INTERRUPTED, error=_describe(e)) for p in batch)
        except BaseException as e:  # Hydra's own errors escape launch (NOTES-hydra.md)
            self._log_failure(batch[0].number, e)
            outcomes.extend(RankOutcome(p.number, FAILED, error=_describe(e)) for p in batch)
        finally:
            self._current_payload = None
        if self.ctx.distributed and batch[0].number not in self._checked:
            # The job failed before our task wrapper ran (Hydra could not compose the config):
            # the other ranks wait in the config check, so answer it with this failure.
            self._join_config_check(batch[0].number, outcomes[-1].error or "the job did not start")
        self._checked.discard(batch[0].number)
        return outcomes

    def _outcome(self, payload: TrialPayload, ret: JobReturn) -> RankOutcome:
        if ret.status == JobStatus.COMPLETED:
            try:
                return RankOutcome(payload.number, OK, objective_values(ret._return_value, len(self.directions)))
            except ValueError as e:
                log.error("rank %d, trial %d failed: %s", self.ctx.rank, payload.number, e)
                return RankOutcome(payload.number, FAILED, error=str(e))
        exc = ret._return_value
        if isinstance(exc, optuna.TrialPruned):
            return RankOutcome(payload.number, PRUNED)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            self._log_failure(payload.number, exc)
            return RankOutcome(payload.number, INTERRUPTED, error=_describe(exc))
        self._log_failure(payload.number, exc)
        return RankOutcome(payload.number, FAILED, error=_describe(exc))

    def _log_failure(self, number: int, exc: BaseException) -> None:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        log.error("rank %d/%d, trial %d failed:\n%s", self.ctx.rank, self.ctx.world_size, number, tb)

    def _run_task(self, cfg: DictConfig) -> Any:
        """The task function the launcher calls: check the config is equal on every rank, then run
        the user's task with :func:`current_trial` set."""
        assert self.task_function is not None
        payload = self._current_payload
        if payload is None:  # a batch (world size 1): find the trial by Hydra's job number
            from hydra.core.hydra_config import HydraConfig

            payload = TrialPayload(int(HydraConfig.get().job.num))
        if self.ctx.distributed:
            with self._timer.phase("config_check"):
                self._check_same_config(cfg, payload.number)
        optuna_trial = self._asked.get(payload.number) if self.ctx.is_main else None
        params = payload.params or (dict(optuna_trial.params) if optuna_trial is not None else {})
        rank_trial = RankTrial(payload.number, params, self.ctx, optuna_trial)
        # In every rank's own job log: the params this rank runs the trial with.
        log.info("rank %d/%d runs trial %d with params %s", self.ctx.rank, self.ctx.world_size, payload.number, params)
        with trial_slot(rank_trial), self._timer.phase("task"):
            return self.task_function(cfg)

    def _check_same_config(self, cfg: DictConfig, number: int) -> None:
        """Compare the resolved task config across ranks before the task runs.

        Raises:
            ConfigMismatchError: if any rank's resolved config differs from rank 0's; lists the keys.
            DSOptunaSweeperError: if the config could not be resolved on some rank.
        """
        self._checked.add(number)
        try:
            mine: tuple[str | None, str | None] = (config_fingerprint(cfg), None)
        except Exception as e:
            mine = (None, f"{type(e).__name__}: {e}")
        prints = self.ctx.all_gather(mine, what="config fingerprint", trial=number)
        errors = [(r, err) for r, (_, err) in enumerate(prints) if err]
        if errors:
            raise DSOptunaSweeperError(
                f"trial {number}: the task config could not be resolved on "
                + "; ".join(f"rank {r}: {err}" for r, err in errors)
            )
        if len({h for h, _ in prints}) == 1:
            return
        flat = flatten(OmegaConf.to_container(cfg, resolve=True))
        flats = self.ctx.all_gather(flat, what="config for comparison", trial=number)
        keys = differing_keys(flats)
        ranks = [r for r, (h, _) in enumerate(prints) if h != prints[0][0]]
        detail = ", ".join(
            f"{k}: rank 0 {flats[0].get(k, '<missing>')!r} vs rank {ranks[0]} {flats[ranks[0]].get(k, '<missing>')!r}"
            for k in keys[:5]
        )
        raise ConfigMismatchError(
            f"trial {number}: resolved config differs between rank 0 and rank(s) {ranks} at {keys} ({detail}). "
            "Every rank must compose the same config; per-rank values (local rank, device, environment "
            "variables) must not be part of the composed config."
        )

    def _join_config_check(self, number: int, error: str) -> None:
        prints = self.ctx.all_gather((None, f"the job failed before its task ran: {error}"), what="config fingerprint", trial=number)
        log.debug("trial %d: config check answered with a failure (%d ranks)", number, len(prints))

    def _close_group(self) -> None:
        import torch.distributed as dist

        try:
            if dist.is_initialized():
                import gc

                gc.collect()  # drop DDP reducers of finished trials before their group goes away
                dist.destroy_process_group()
        except Exception:  # the sweep's outcome matters more than a clean teardown
            log.debug("destroy_process_group failed", exc_info=True)


TIMINGS_ENV = "DS_OPTUNA_TIMINGS"


class PhaseTimer:
    """Seconds spent per phase of each trial on this rank, for ``bench/overhead.py``.

    Off unless the environment variable ``DS_OPTUNA_TIMINGS`` names a file; then every rank
    appends one JSON line per trial: ``{"rank", "world_size", "trial", "phases": {name: seconds}}``
    with phases ``ask`` and ``tell`` (rank 0), ``broadcast``, ``launch`` (Hydra's per-job config
    composition + ``run_job``, which contains ``config_check`` and ``task``) and ``gather``.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.phases: dict[str, float] = {}

    def start(self) -> None:
        self.phases = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Any:
        if self.path is None:
            yield
            return
        t = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t

    def finish(self, ctx: RankContext, number: int) -> None:
        if self.path is None:
            return
        import json

        line = {"rank": ctx.rank, "world_size": ctx.world_size, "trial": number, "phases": self.phases}
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _redact(url: str) -> str:
    """Hide a password in a storage URL for logs (``postgresql://u:secret@h/db`` -> ``u:***@``)."""
    if "://" in url and "@" in url:
        scheme, rest = url.split("://", 1)
        creds, host = rest.split("@", 1)
        if ":" in creds:
            creds = creds.split(":", 1)[0] + ":***"
        return f"{scheme}://{creds}@{host}"
    return url
