"""Rank 0: the driver's set-up: the sweep dir, the search space checked against the task's config, the study
opened (created, loaded, or resumed after a torchrun restart), and the warm starts queued."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Sequence

from omegaconf import DictConfig

from .._errors import StorageUnavailableError, SweeperConfigError
from .._setting_keys import warn_misplaced_keys
from .._settings import Settings
from .._study import _grid, _queue, _study
from .._study._command import resume_command
from .._study._search_space import SearchSpace, build_search_space, span_warnings
from .._study._policy import Policy
from .._study._stop import StopCheck
from .._study._space_checks import check_baseline_keys, check_group_options, check_mutations, check_param_keys
from .._study._urls import redact_url
from .._study._warm_start import warm_start_params
from .._tracking._tracking import Tracking
from ._driver import Driver

log = logging.getLogger(__name__)


def start_driver(
    settings: Settings, config: DictConfig, arguments: Sequence[str],
    group_options: Callable[[str], list[str]] | None = None, *, group_id: str | None = None,
    restarted: bool = False,
) -> Driver:
    """Rank 0: resolve the sweep dir, build the search space, open the study and queue the warm starts.

    Args:
        settings: the checked settings.
        config: Hydra's master config (``hydra.sweep.dir``, ``hydra.job.name``).
        arguments: the command line's task overrides.
        group_options: ``group -> [options]`` from Hydra's config repository, to check config-group
            choices before trial 0 (case C22); ``None`` skips the check.
        group_id: this torchrun group's identity (``RankComm.group_id``), tagged on its trials.
        restarted: torchrun restarted this group: close its RUNNING trials (case C09).

    Raises:
        SearchSpaceError: a malformed or impossible sweep expression.
        SweeperConfigError: a stop terminator that cannot be built (:class:`.._study._stop.StopCheck`), see
            :func:`_study.open_study`, :func:`.._study._queue.enqueue_warm_starts`, a warm
            start that is no grid point on a grid sampler (:func:`_grid.warm_starts_on_grid`), or a
            ``seed_key`` that is also searched.
    """
    sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
    space = _checked_space(settings, config, arguments, group_options)
    stop = StopCheck(settings.stop, settings.directions[0])  # a terminator that cannot be built fails here
    sweep_dir.mkdir(parents=True, exist_ok=True)  # after the checks: a refused command line leaves no sweep dir
    storage_label = settings.storage_label(str(sweep_dir))  # the URL, or a _target_ node's text
    study_name = settings.study_name or str(config.hydra.job.name)
    try:
        study = _study.open_study(
            settings, space, storage_url=storage_label, study_name=study_name,
            restarted_group=group_id if restarted else None,
        )
    except StorageUnavailableError as e:  # an outage during set-up (C35): say how to resume
        raise e.with_resume(resume_command(str(sweep_dir))) from e
    log.info(
        "Study '%s' in %s, direction(s) %s, sampler %s, pruner %s; budget n_trials=%d (%d already counted)",
        study.study_name,
        redact_url(storage_label),
        list(settings.directions),
        _grid.sampler_name(study.sampler),
        type(study.pruner).__name__,
        settings.n_trials,
        _queue.counted_trials(study),
    )
    log.info("Sweep dir: %s", sweep_dir)
    driver = Driver(settings, config, study, space, str(sweep_dir), group_id)
    driver.policy = Policy(stop)
    if settings.stop:
        log.info("Stop rules: %s (checked before each ask)", settings.stop.describe())
    if settings.tracking.report_to:
        driver.tracking = Tracking.open(settings.tracking, sweep_dir=str(sweep_dir), study_name=study.study_name,
                                        study_key=redact_url(storage_label))
    warn_misplaced_keys(config, settings.directions, study.study_name)
    lines = space.describe() or ["(no searched params: every trial runs the fixed overrides)"]
    log.info("Search space:\n  %s", "\n  ".join(lines))
    if space.fixed:
        log.info("Fixed overrides: %s", space.fixed)
    return driver

def _checked_space(
    settings: Settings, config: DictConfig, arguments: Sequence[str], group_options: Callable[[str], list[str]] | None,
) -> SearchSpace:
    """The search space, checked before the study is opened (cases C22, C32, C33); logs span warnings.

    Raises:
        SearchSpaceError: a malformed or impossible sweep expression.
        SweeperConfigError: a warm start that is no grid point, a ``seed_key`` that is also searched, or a
            ``refit.baselines`` key the config does not have.
    """
    space = build_search_space(settings.params, arguments)
    if group_options is not None:
        check_group_options(space, group_options)
    check_param_keys(space, config, group_options)
    check_mutations(space, settings.scheduler.mutations)
    if settings.refit_enabled:
        check_baseline_keys(settings.refit_baselines, config, group_options)
    warm = warm_start_params(space, settings.enqueue_trials)  # checked before the study is opened (C33)
    grid = _grid.grid_of(settings.sampler, space)
    if grid is not None:
        _grid.warm_starts_on_grid(grid, warm)  # a warm start on a grid is a grid point (C32)
    if settings.repeats > 1 and str(settings.seed_key) in space.params:
        raise SweeperConfigError(
            f"hydra.sweeper.seed_key={settings.seed_key} is also searched; the repeats set it, so it "
            "cannot be a param of the study. Remove it from the search space."
        )
    for warning in span_warnings(space):
        log.warning(warning)
    return space
