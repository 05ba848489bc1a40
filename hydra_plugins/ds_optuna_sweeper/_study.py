"""Rank 0 only: create or load the study, check it matches this run, queue the warm starts.

Everything here touches storage, so only the rank-0 driver calls it (DESIGN.md: "One sampler").
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import logging
import warnings
from typing import Any

import optuna
from hydra.utils import instantiate
from omegaconf import OmegaConf
from optuna.trial import TrialState

from . import _storage as storage
from ._errors import DSOptunaSweeperError, SweeperConfigError
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
            enqueue_warm_starts(study, settings.enqueue_trials, space)
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
            )
        return optuna.create_study(
            storage=opened, sampler=sampler, pruner=pruner, study_name=study_name,
            directions=list(settings.directions), load_if_exists=True,
        )
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
    if str(sampler_cfg.get("_target_", "")).endswith("GridSampler") and not sampler_cfg.get("search_space"):
        kwargs["search_space"] = space.grid()
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


def enqueue_warm_starts(study: optuna.Study, entries: tuple[dict[str, Any], ...], space: SearchSpace) -> None:
    """Queue ``hydra.sweeper.enqueue_trials`` (skipping params already in the study), each value cast to
    its param's distribution (:func:`_search_space.warm_start_params`, case C33), so the task gets the
    value the study records.

    Raises:
        SweeperConfigError: for a param that is not in the search space or a value that is not of its
            distribution (see :func:`_search_space.warm_start_params`); nothing is queued then.
    """
    if not entries:
        return
    typed = warm_start_params(space, entries)
    for entry in typed:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.enqueue_trial(entry, user_attrs={ENQUEUED_ATTR: True}, skip_if_exists=True)
    log.info("Warm start: %d enqueued config(s) (skipped when already in the study)", len(typed))


def counted_trials(study: optuna.Study) -> int:
    """Trials that count against ``n_trials``.

    Every trial in :data:`COUNTED_STATES` (all but WAITING) counts, except a FAIL trial that was
    re-queued as a retry (``retry_failed_trials``: Optuna's ``RetryHeartbeatStaleTrialCallback`` marks
    the copy with the system attribute ``failed_trial``): the retry replaces it, so a preempted trial
    and its retry count once (case C28).
    """
    trials = study.get_trials(deepcopy=False)
    retried = {t.system_attrs.get("failed_trial") for t in trials} - {None}
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
