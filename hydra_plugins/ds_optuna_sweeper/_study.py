"""Rank 0 only: create or load the study, check it matches this run, queue the warm starts.

Everything here touches storage, so only the rank-0 driver calls it (DESIGN.md: "One sampler").
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import logging
from typing import Any

import optuna
from hydra.utils import instantiate
from omegaconf import OmegaConf
from optuna.trial import TrialState

from . import _grid, _storage as storage
from ._errors import DSOptunaSweeperError, StorageUnavailableError, SweeperConfigError
from ._search_space import SearchSpace, describe_distribution, warm_start_params
from ._settings import Settings

log = logging.getLogger(__name__)

#: User attribute marking trials queued by ``hydra.sweeper.enqueue_trials``.
ENQUEUED_ATTR = "ds_optuna:enqueued"

#: User attribute holding ``{seed: [values]}`` when ``repeats > 1``.
SEED_VALUES_ATTR = "ds_optuna:seed_values"

#: Trials that count against ``n_trials``: every state but WAITING (queued, not yet run).
COUNTED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)


def open_study(
    settings: Settings, space: SearchSpace, *, storage_url: str, study_name: str, restarted_group: str | None = None
) -> optuna.Study:
    """Create the study, or load it when it exists, check that it fits this run, queue the warm starts.

    All of it happens under :func:`_storage.first_contact_lock`, so workers started together on a new
    storage neither race on the schema nor enqueue a warm start twice (cases C17, C30). Also closes
    RUNNING trials this torchrun group left behind before a ``--max-restarts`` restart (case C09) and
    stale trials of dead workers (Optuna's heartbeat), counts this run in the study's
    ``ds_optuna:runs`` user attribute and gives a seeded sampler this run's seed (:func:`run_seed`,
    case C18).

    Args:
        settings: the checked ``hydra.sweeper`` settings.
        space: this run's search space (a grid sampler takes its points from it).
        storage_url: the storage URL (``settings.storage_url(sweep_dir)``), used when the storage
            is not given as a ``_target_`` node.
        study_name: the study's name.
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
                storage.abandon(
                    study,
                    storage.own_running_trials(study, restarted_group),
                    settings.retry_failed_trials,
                    "its torchrun group was restarted",
                )
            storage.fail_stale(study)
            enqueue_warm_starts(study, settings.enqueue_trials, space, grid=_grid.grid_of(settings.sampler, space))
            run_index = _count_run(study)
    except DSOptunaSweeperError:
        raise
    except Exception as e:  # the lock's own connection, or a storage error under it
        raise SweeperConfigError(
            f"Cannot open the Optuna storage {storage.redact_url(storage_url)!r} for study '{study_name}': "
            f"{type(e).__name__}: {e}. Check hydra.sweeper.storage (a URL such as sqlite:///path/optuna.db "
            "or postgresql://user@host/db, reachable from rank 0)."
        ) from e
    _reseed_sampler(study, settings, space, run_index)
    return study


def _check_fits(study: optuna.Study, settings: Settings, space: SearchSpace, storage_url: str) -> None:
    """Refuse a stored study with other directions or changed distributions (nothing is changed)."""
    directions = list(settings.directions)
    stored = [d.name.lower() for d in study.directions]
    if stored != directions:
        raise SweeperConfigError(
            f"Study '{study.study_name}' in {storage.redact_url(storage_url)} was created with direction(s) {stored}, "
            f"but hydra.sweeper.direction is {directions}. Use the stored direction(s), or another "
            "study_name for a new study; the stored trials are kept."
        )
    check_search_space_unchanged(study, space, settings.allow_search_space_change)


#: Study user attribute counting the runs (sweeps, restarts, groups) that opened the study.
RUNS_ATTR = "ds_optuna:runs"


def _count_run(study: optuna.Study) -> int:
    """This run's 0-based index among the runs that opened the study (call under the first-contact lock)."""
    index = int(study.user_attrs.get(RUNS_ATTR, 0))
    study.set_user_attr(RUNS_ATTR, index + 1)
    return index


def run_seed(seed: int, run_index: int) -> int:
    """The sampler seed of the ``run_index``-th run of a study whose sampler is configured with ``seed``.

    Run 0 (a new study) uses ``seed`` itself, so a new study is reproducible. Every later run (a
    resume, a torchrun restart, another group sharing the study) gets its own seed derived from both,
    so a seeded sampler never replays the params it drew before (case C18, optuna/optuna#3255).
    Two groups started together on one study get different seeds: the first-contact lock orders them.

    Returns:
        ``seed`` when ``run_index == 0``, else the first 4 bytes of ``sha256(f"{seed}/{run_index}")`` as
        an unsigned int (numpy's seed range).
    """
    if run_index == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}/{run_index}".encode()).digest()[:4], "big")


def _reseed_sampler(study: optuna.Study, settings: Settings, space: SearchSpace, run_index: int) -> None:
    """Give a seeded sampler this run's seed (:func:`run_seed`); the grid sampler keeps its own."""
    seed = settings.sampler.get("seed")
    target = str(settings.sampler.get("_target_", ""))
    if seed is None or run_index == 0 or target.endswith("GridSampler"):
        return
    derived = run_seed(int(seed), run_index)
    study.sampler = _sampler(settings, space, seed=derived)
    log.info(
        "Sampler seed %d for run %d of study '%s' (configured seed %d; a resumed or shared study gets a "
        "seed of its own per run, so it never replays earlier params)", derived, run_index, study.study_name, int(seed),
    )


def _create_or_load(settings: Settings, space: SearchSpace, storage_url: str, study_name: str) -> optuna.Study:
    """Instantiate sampler, pruner and storage, then ``optuna.create_study(load_if_exists=True)``.

    Raises:
        SweeperConfigError: the storage cannot be opened (the message hides the password).
    """
    sampler = _sampler(settings, space)
    pruner = instantiate(settings.pruner)
    try:
        configured = settings.storage
        if OmegaConf.is_config(configured):
            opened: Any = instantiate(configured)
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
        raise SweeperConfigError(
            f"Cannot open the Optuna storage {storage.redact_url(storage_url)!r} for study '{study_name}': "
            f"{type(e).__name__}: {e}. Check hydra.sweeper.storage (a URL such as sqlite:///path/optuna.db "
            "or postgresql://user@host/db, reachable from rank 0)."
        ) from e


def _sampler(settings: Settings, space: SearchSpace, **overrides: Any) -> Any:
    """Instantiate the sampler node; a grid sampler gets its points from the search space."""
    sampler_cfg = settings.sampler
    kwargs: dict[str, Any] = dict(overrides)
    target = str(sampler_cfg.get("_target_", ""))
    if target.endswith("GridSampler") and not sampler_cfg.get("search_space"):
        kwargs["search_space"] = space.grid()
    if _grid.sampler_target(target) != target:  # a warm start counts as its grid point (C32)
        kwargs["_target_"] = _grid.sampler_target(target)
    return instantiate(sampler_cfg, **kwargs)


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


def enqueue_warm_starts(
    study: optuna.Study, entries: tuple[dict[str, Any], ...], space: SearchSpace, *, grid: dict[str, list[Any]] | None = None
) -> None:
    """Queue ``hydra.sweeper.enqueue_trials`` that have not run yet, or whose every run failed, logging
    one line per warm start that says which (cases C33, C32, C36).

    Each value is cast to its param's distribution (:func:`_search_space.warm_start_params`, C33), so
    the task gets the value the study records; on a grid sampler each warm start must be a grid point
    and takes the grid's value (:func:`_grid.warm_starts_on_grid`, C32). The study's trials with the
    same params (an enqueued trial's ``fixed_params``, else its params, compared as Optuna's
    ``enqueue_trial(skip_if_exists=True)`` does) decide:

    - none: queued;
    - one WAITING or RUNNING: not queued twice;
    - one COMPLETE or PRUNED: not queued (it ran);
    - all FAIL (a config error fixed since, case C36, transformers PR#12831): queued again, as a
      retry of the last failed run (system attributes ``failed_trial`` and ``retry_history``, as
      Optuna's ``RetryFailedTrialCallback`` writes them), so the retry replaces the failed runs in
      the ``n_trials`` budget (:func:`counted_trials`).

    Call it under the first-contact lock (:func:`open_study`): two groups then never queue one warm
    start twice (case C30).

    Args:
        study: the study.
        entries: the warm starts, ``{param name: value}`` each.
        space: this run's search space.
        grid: the grid sampler's ``{param name: [values]}`` (:func:`_grid.grid_of`); ``None`` for other samplers.

    Raises:
        SweeperConfigError: for a param that is not in the search space, a value that is not of its
            distribution (see :func:`_search_space.warm_start_params`), or on a grid sampler a warm start
            that is not a grid point; nothing is queued then.
    """
    if not entries:
        return
    typed = warm_start_params(space, entries)
    if grid is not None:
        typed = _grid.warm_starts_on_grid(grid, typed)
    for entry in typed:
        runs = [t for t in study.get_trials(deepcopy=False) if _same_point(t, entry)]
        shown = "{" + ", ".join(f"{k}: {v!r}" for k, v in entry.items()) + "}"
        pending = [t for t in runs if t.state in (TrialState.WAITING, TrialState.RUNNING)]
        ran = [t for t in runs if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
        if pending:
            t = pending[0]
            log.info("Warm start %s: already %s (trial %d); not queued twice", shown,
                     "queued" if t.state == TrialState.WAITING else "running in another worker", t.number)
            continue
        if ran:
            t = ran[-1]
            log.info("Warm start %s: ran before (trial %d, %s); not queued again", shown, t.number, t.state.name)
            continue
        failed = [t.number for t in runs]  # every run failed, or none ran
        system_attrs: dict[str, Any] = {"fixed_params": entry}
        if failed:
            system_attrs.update(failed_trial=failed[-1], retry_history=failed)
        # What Study.enqueue_trial stores, plus the retry marks; the storage call hands back the number.
        trial_id = study._storage.create_new_trial(
            study._study_id,
            template_trial=optuna.trial.create_trial(
                state=TrialState.WAITING, system_attrs=system_attrs, user_attrs={ENQUEUED_ATTR: True}
            ),
        )
        number = study._storage.get_trial_number_from_id(trial_id)
        if failed:
            log.info("Warm start %s: failed before (trial%s %s); queued again (trial %d)", shown,
                     "s" if len(failed) > 1 else "", ", ".join(map(str, failed)), number)
        else:
            log.info("Warm start %s: queued (trial %d)", shown, number)


def warm_start_runs(trials: list[optuna.trial.FrozenTrial]) -> list[int]:
    """Each warm start's last COMPLETE run, in trial-number order (``refit.trials: [enqueued]``).

    A warm start is a trial marked :data:`ENQUEUED_ATTR`, known by its ``fixed_params``; when one ran
    more than once (it failed, was queued again and completed, case C36; or a retry), its last
    COMPLETE run stands for it. Warm starts with no COMPLETE run are left out.
    """
    last: dict[str, int] = {}
    for t in trials:
        if t.user_attrs.get(ENQUEUED_ATTR) and t.state == TrialState.COMPLETE:
            point = json.dumps(t.system_attrs.get("fixed_params", t.params), sort_keys=True, default=repr)
            last[point] = max(t.number, last.get(point, -1))
    return sorted(last.values())


def _same_point(trial: optuna.trial.FrozenTrial, entry: dict[str, Any]) -> bool:
    """Whether ``trial`` ran (or will run) the warm start ``entry``: its ``fixed_params`` (else its params)
    have the same names and values (:func:`_grid.same_value`), as Optuna's ``enqueue_trial(skip_if_exists=True)``."""
    params = trial.system_attrs.get("fixed_params", trial.params)
    return params.keys() == entry.keys() and all(_grid.same_value(params[k], v) for k, v in entry.items())


def counted_trials(study: optuna.Study) -> int:
    """Trials that count against ``n_trials``.

    Every trial in :data:`COUNTED_STATES` (all but WAITING) counts, except a FAIL trial that was
    re-queued as a retry (``retry_failed_trials``: Optuna's ``RetryHeartbeatStaleTrialCallback`` marks
    the copy with the system attributes ``failed_trial``, the lineage's first trial, and
    ``retry_history``, every trial it retries; a failed warm start queued again is marked the same
    way, :func:`enqueue_warm_starts`): the retry replaces it, so a preempted trial and its retry count
    once (cases C28, C36).
    """
    trials = study.get_trials(deepcopy=False)
    retried = {t.system_attrs.get("failed_trial") for t in trials} - {None}
    retried |= {n for t in trials for n in t.system_attrs.get("retry_history", ())}
    return sum(1 for t in trials if t.state in COUNTED_STATES and not (t.state == TrialState.FAIL and t.number in retried))


def tell(study: optuna.Study, trial: optuna.trial.Trial, state: TrialState, values: list[float] | None) -> TellResult:
    """``study.tell`` that survives samplers asking to stop and trials closed by another worker.

    ``GridSampler`` and ``BruteForceSampler`` call ``Study.stop()`` from ``after_trial`` once every
    point was tried, and ``Study.stop()`` raises ``RuntimeError`` outside ``Study.optimize``
    (optuna/samplers/_grid.py, optuna/study/study.py). Optuna stores the trial's state before that
    (optuna/study/_tell.py), so the error only means "no point left".

    Another worker may have failed the trial already (its heartbeat looked stale to it, case C20,
    optuna/optuna#5470); ``skip_if_finished`` then leaves the stored state alone instead of raising
    "Cannot tell a FAIL trial".

    Returns:
        What happened: :attr:`TellResult.TOLD`, :attr:`TellResult.SAMPLER_STOP` or
        :attr:`TellResult.CLOSED_ELSEWHERE`.

    Raises:
        RuntimeError: any other failure, or if the trial is still RUNNING afterwards.
    """
    stored = study._storage.get_trial(trial._trial_id).state
    if stored.is_finished():
        log.warning(
            "Trial %d was already closed (%s) by another worker of the study, which took its heartbeat for "
            "stale; this group's result (%s) is not stored. The sweep goes on. Check that every worker uses "
            "the same hydra.sweeper.heartbeat_interval and grace_period", trial.number, stored.name, state.name,
        )
        return TellResult.CLOSED_ELSEWHERE
    try:
        if state == TrialState.COMPLETE:
            study.tell(trial, values, skip_if_finished=True)
        else:
            study.tell(trial, state=state, skip_if_finished=True)
    except RuntimeError:
        if study._storage.get_trial(trial._trial_id).state == TrialState.RUNNING:
            raise
        return TellResult.SAMPLER_STOP
    return TellResult.TOLD


class TellResult(enum.Enum):
    """What :func:`tell` did."""

    TOLD = "told"
    #: The sampler has no point left (grid or brute force done); the state was stored.
    SAMPLER_STOP = "sampler stop"
    #: The trial was already finished by another worker; nothing was stored.
    CLOSED_ELSEWHERE = "closed elsewhere"


def close_orphan(study: optuna.Study, known: int) -> None:
    """Fail the trial a raising ``study.ask`` left RUNNING (rank 0).

    Optuna creates the trial before the sampler runs (optuna/study/study.py ``ask``); a sampler
    that raises then leaves a RUNNING trial whose number nobody learned, with no heartbeat, so no
    stale check would ever close it and it would count against ``n_trials`` for good. The orphan
    is the RUNNING trial numbered ``known`` or later that no group tagged yet; with several
    candidates (another group asked at the same instant) none is touched and a warning names them.

    Args:
        study: the study.
        known: the number of trials the study held before the ask.
    """
    try:
        candidates = [
            t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if t.number >= known and storage.GROUP_ATTR not in t.user_attrs
        ]
        if len(candidates) == 1:
            study.tell(candidates[0], state=TrialState.FAIL)
            log.warning("Trial %d marked FAIL (the sampler raised while it was asked)", candidates[0])
        elif candidates:
            log.warning("The sampler raised while asking; RUNNING trials %s may be left open", candidates)
    except Exception:  # the ask's own error matters more
        log.debug("closing the trial of a failed ask failed", exc_info=True)
