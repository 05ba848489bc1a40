"""Rank 0 only: create or load the study, check it matches this run, queue the warm starts.

Everything here touches storage, so only the rank-0 driver calls it (docs/design.md: "One sampler").
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from typing import Any, Mapping

import optuna
from hydra.utils import instantiate
from omegaconf import OmegaConf

from .._errors import DSOptunaSweeperError, StorageUnavailableError, SweeperConfigError
from .._settings import Settings
from . import _abandon, _grid, _owners
from . import _storage as storage
from . import _storage_text as urls
from ._queue import enqueue_warm_starts
from ._search_space import SearchSpace, describe_distribution
from ._stored import RUNS_ATTR, SCHEMA_VERSION, SCHEMA_VERSION_ATTR, stored_version

log = logging.getLogger(__name__)


def open_study(
    settings: Settings, space: SearchSpace, *, storage_url: str, study_name: str, restarted_group: str | None = None
) -> optuna.Study:
    """Create the study, or load it when it exists, check that it fits this run, queue the warm starts.

    All of it happens under :func:`_storage.first_contact_lock` (cases C17, C30). Also closes RUNNING trials this
    torchrun group left behind before a ``--max-restarts`` restart (case C09), RUNNING trials whose launch is gone
    (:mod:`._owners`, case C54) and stale trials (Optuna's heartbeat); takes this launch's owner lock; counts this
    run in the study (:data:`._stored.RUNS_ATTR`) and gives a seeded sampler this run's seed (:func:`run_seed`).

    Args:
        settings: the checked ``hydra.sweeper`` settings.
        space: this run's search space (a grid sampler takes its points from it).
        storage_url: the storage URL (``settings.storage_url(sweep_dir)``), used when the storage
            is not given as a ``_target_`` node.
        restarted_group: the id of this torchrun group when torchrun restarted it (its RUNNING
            trials are closed, case C09); ``None`` otherwise (heartbeats decide, case C29).

    Raises:
        SweeperConfigError: the storage cannot be opened (the message hides the password and names
            the cause), the stored study has other directions, its params' distributions changed, or
            a warm start does not fit the search space. Nothing stored is changed then.
        SearchSpaceError: a grid sampler over a continuous interval.
    """
    lock = contextlib.nullcontext() if OmegaConf.is_config(settings.storage) else storage.first_contact_lock(
        storage_url, timeout_s=settings.rank_timeout_s
    )
    try:
        with lock:
            study = _create_or_load(settings, space, storage_url, study_name)
            _check_fits(study, settings, space, storage_url)
            if restarted_group is not None:  # our own RUNNING trials belong to the attempt that died (C09)
                _abandon.abandon(
                    study,
                    _abandon.own_running_trials(study, restarted_group),
                    settings.retry_failed_trials,
                    "its torchrun group was restarted",
                )
            _owners.close_orphans(study, settings.retry_failed_trials)  # launches that are gone (C54)
            _owners.hold(study)
            _abandon.fail_stale(study)
            enqueue_warm_starts(study, settings.enqueue_trials, space, grid=_grid.grid_of(settings.sampler, space))
            run_index = _count_run(study)
    except DSOptunaSweeperError:
        raise
    except Exception as e:  # the lock's own connection, or a storage error under it
        raise storage_error(storage_url, study_name, e) from e
    _reseed_sampler(study, settings, space, run_index)
    return study


def _check_fits(study: optuna.Study, settings: Settings, space: SearchSpace, storage_url: str) -> None:
    """Refuse a stored study with other directions or changed distributions (nothing is changed)."""
    directions = list(settings.directions)
    stored = [d.name.lower() for d in study.directions]
    if stored != directions:
        raise SweeperConfigError(
            f"Study '{study.study_name}' in {urls.redact_url(storage_url)} was created with direction(s) {stored}, "
            f"but hydra.sweeper.direction is {directions}. Use the stored direction(s), or another "
            "study_name for a new study; the stored trials are kept."
        )
    check_search_space_unchanged(study, space, settings.allow_search_space_change)


def _count_run(study: optuna.Study) -> int:
    """This run's 0-based index among the runs that opened the study (call under the first-contact lock). Also
    stores :data:`~._stored.SCHEMA_VERSION` on the study, unless a newer sweeper stored a higher one (then it is
    kept, and a warning says this version may not read everything it stored)."""
    index = int(study.user_attrs.get(RUNS_ATTR, 0))
    study.set_user_attr(RUNS_ATTR, index + 1)
    stored = stored_version(study.user_attrs)
    if stored > SCHEMA_VERSION:
        log.warning("Study '%s' was written by a newer ds_optuna sweeper (stored schema version %d, this version "
                    "reads %d); attributes it added are ignored", study.study_name, stored, SCHEMA_VERSION)
    elif SCHEMA_VERSION_ATTR not in study.user_attrs or stored < SCHEMA_VERSION:
        study.set_user_attr(SCHEMA_VERSION_ATTR, SCHEMA_VERSION)
    return index


def storage_error(storage_url: str, study_name: str, e: BaseException) -> SweeperConfigError:
    """The error for a storage that cannot be opened: the URL without its password, the cause, the fix."""
    return SweeperConfigError(
        f"Cannot open the Optuna storage {urls.redact_url(storage_url)!r} for study '{study_name}': "
        f"{type(e).__name__}: {e}. Check hydra.sweeper.storage, reachable from rank 0: a URL "
        "(sqlite:///path/optuna.db, postgresql://user@host:5432/db, redis://host:6379/0) or a _target_ node, "
        "e.g. '{_target_:optuna.storages.JournalStorage,log_storage:{_target_:optuna.storages.journal."
        "JournalFileBackend,file_path:/path/journal.log}}' (a journal backend alone, such as "
        "{_target_:optuna.storages.journal.JournalRedisBackend,url:'redis://host:6379/0'}, is wrapped in "
        "JournalStorage)."
    )


def run_seed(seed: int, run_index: int) -> int:
    """The sampler seed of the ``run_index``-th run of a study whose sampler is configured with ``seed``:
    ``seed`` for run 0 (a new study is reproducible), else the first 4 bytes of ``sha256(f"{seed}/{run_index}")``
    as an unsigned int (numpy's seed range), so a resumed or shared study never replays the params it drew before
    (case C18, optuna/optuna#3255).
    """
    if run_index == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}/{run_index}".encode()).digest()[:4], "big")


def _reseed_sampler(study: optuna.Study, settings: Settings, space: SearchSpace, run_index: int) -> None:
    """Give a seeded sampler this run's seed (:func:`run_seed`); the grid sampler keeps its own."""
    seed = settings.sampler_seed
    target = str(settings.sampler.get("_target_", ""))
    if seed is None or run_index == 0 or target.endswith("GridSampler"):
        return
    derived = run_seed(seed, run_index)
    study.sampler = _sampler(settings, space, seed=derived)
    log.info(
        "Sampler seed %d for run %d of study '%s' (configured seed %d; a resumed or shared study gets a "
        "seed of its own per run, so it never replays earlier params)", derived, run_index, study.study_name, seed,
    )


def _create_or_load(settings: Settings, space: SearchSpace, storage_url: str, study_name: str) -> optuna.Study:
    """Instantiate sampler, pruner and storage, then ``optuna.create_study(load_if_exists=True)``; raises
    SweeperConfigError when the storage cannot be opened (the message hides the password)."""
    sampler = _sampler(settings, space)
    fallbacks = predicted_fallbacks(settings.sampler, space.params)
    if fallbacks:
        log.warning("%s", fallback_text(settings.sampler, fallbacks))
    say_each_fallback_once()
    pruner = instantiate(settings.pruner)
    try:
        configured = settings.storage
        if OmegaConf.is_config(configured):
            opened: Any = storage.journal_storage(instantiate(configured))  # a bare journal backend (C56)
        else:
            opened = storage.open_storage(
                storage_url,
                heartbeat_interval_s=settings.heartbeat_interval_s,
                grace_period_s=settings.grace_period_s,
                max_retry=settings.retry_failed_trials,
                retry_timeout_s=settings.storage_retry_budget_s,
            )
        return optuna.create_study(
            storage=opened, sampler=sampler, pruner=pruner, study_name=study_name,
            directions=list(settings.directions), load_if_exists=True,
        )
    except StorageUnavailableError:  # the storage answered, then stayed away (C35): not a config error
        raise
    except Exception as e:
        raise storage_error(storage_url, study_name, e) from e


def _sampler(settings: Settings, space: SearchSpace, **overrides: Any) -> Any:
    """Instantiate the sampler node; a grid sampler gets its points from the search space."""
    sampler_cfg = settings.sampler
    kwargs: dict[str, Any] = dict(overrides)
    target = str(sampler_cfg.get("_target_", ""))
    if target.endswith("GridSampler") and not sampler_cfg.get("search_space"):
        kwargs["search_space"] = space.grid()
    if _grid.sampler_target(target) != target:  # a warm start counts as its grid point (C32)
        kwargs["_target_"] = _grid.sampler_target(target)
    if predicted_fallbacks(sampler_cfg, space.params):  # said once before trial 0 instead (C59)
        kwargs["warn_independent_sampling"] = False
    return instantiate(sampler_cfg, **kwargs)


def check_search_space_unchanged(study: optuna.Study, space: SearchSpace, allowed: bool) -> None:
    """Refuse a search space whose distributions differ from those of the stored trials (samplers would model
    two problems as one); params added or dropped are fine. ``allowed``:
    ``hydra.sweeper.allow_search_space_change``; when true, changes are only logged.

    Raises:
        SweeperConfigError: naming each changed param with its stored and new distribution.
    """
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


# --- Optuna's "sampled independently" warning: said once, not once per trial (issue 38, C59) -----------------
# A sampler that models the params jointly logs it in every trial for a param it cannot model
# (optuna/samplers/_base.py, _INDEPENDENT_SAMPLING_WARNING_TEMPLATE; CmaEsSampler never models a
# CategoricalDistribution, optuna/samplers/_cmaes.py).

#: The sampler modules whose loggers emit the fallback warning (optuna 4.x/5.x).
SAMPLER_LOGGERS = ("optuna.samplers._cmaes", "optuna.samplers._qmc", "optuna.samplers._gp.sampler",
                   "optuna.samplers._tpe.sampler")
#: Samplers that never model categorical params (their ``_target_``).
NO_CATEGORICAL = ("optuna.samplers.CmaEsSampler",)
_TRIAL = re.compile(r"Trial#\d+")


def predicted_fallbacks(sampler_node: Mapping[str, Any], params: Mapping[str, Any]) -> list[str]:
    """The searched params (``{name: ParamSpec}``) the class of ``sampler_node`` (the ``hydra.sweeper.sampler``
    node) samples independently in every trial: the categorical ones for a sampler of :data:`NO_CATEGORICAL`
    whose node does not set ``warn_independent_sampling``, else ``[]``."""
    from optuna.distributions import CategoricalDistribution

    if str(sampler_node.get("_target_", "")) not in NO_CATEGORICAL or "warn_independent_sampling" in sampler_node:
        return []
    return [name for name, spec in params.items() if isinstance(spec.distribution, CategoricalDistribution)]


def fallback_text(sampler_node: Mapping[str, Any], names: list[str]) -> str:
    """The one line said before trial 0 for :func:`predicted_fallbacks`' ``names``."""
    sampler = str(sampler_node.get("_target_", "")).rsplit(".", 1)[-1]
    listed = ", ".join(f"'{n}'" for n in names)
    return (f"{sampler} does not model categorical params: {listed} will be sampled independently (by its "
            f"independent sampler, RandomSampler by default) in every trial. Optuna's per-trial warning about it "
            f"is off; set +hydra.sweeper.sampler.warn_independent_sampling=true to have it back.")


class _OncePerParam(logging.Filter):
    """Passes a record once per text with its ``Trial#N`` taken out; drops the repeats."""

    def __init__(self) -> None:
        super().__init__("ds_optuna.fallback_once")
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "is sampled independently" not in text:
            return True
        key = _TRIAL.sub("Trial#", text)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


_FILTER = _OncePerParam()


def say_each_fallback_once() -> None:
    """Attach the once-per-param filter to the sampler loggers of :data:`SAMPLER_LOGGERS` (idempotent), and start
    its count afresh: each sweep (each study opened in this process) says each fallback once."""
    _FILTER.seen.clear()
    for name in SAMPLER_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
