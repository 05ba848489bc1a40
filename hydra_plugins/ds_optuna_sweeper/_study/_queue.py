"""Rank 0 only: the study's queue (warm starts queued once, their runs found again) and the
``n_trials`` count, where a retry replaces the trial it retries (cases C28, C30, C32, C33, C36).

The warm starts (``hydra.sweeper.enqueue_trials``) are first cast to their params' distributions
(:func:`warm_start_params`, case C33): pure, no communication and no study.
"""

from __future__ import annotations

import collections
import json
import logging
from typing import Any, Mapping, Sequence

import optuna
from optuna.trial import TrialState

from .. import _upstream as upstream
from .._errors import SearchSpaceError, SweeperConfigError
from . import _grid
from ._distributions import ParamSpec, describe_distribution
from ._override_text import format_value, read_override_value
from ._search_space import SearchSpace
from ._stored import ENQUEUED_ATTR, FAILED_TRIAL_ATTR, FIXED_PARAMS_ATTR, NEVER_RAN_ATTR, RETRY_HISTORY_ATTR

#: _study's logger: tests and users filter by it.
log = logging.getLogger(__package__ + "._study")

#: Trials that count against ``n_trials``: every state but WAITING (queued, not yet run).
COUNTED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)


def enqueue_warm_starts(
    study: optuna.Study, entries: tuple[dict[str, Any], ...], space: SearchSpace, *, grid: dict[str, list[Any]] | None = None
) -> None:
    """Queue ``hydra.sweeper.enqueue_trials`` (``{param name: value}`` each) that have not run yet, or whose every
    run failed, logging one line per warm start that says which (cases C33, C32, C36).

    Each value is cast to its param's distribution (:func:`warm_start_params`, C33); on a grid
    sampler (``grid``: :func:`_grid.grid_of`, else ``None``) each warm start must be a grid point and takes the
    grid's value (C32). The study's trials with the same params (:func:`_same_point`) decide:

    - none: queued;
    - one WAITING or RUNNING: not queued twice;
    - one COMPLETE or PRUNED: not queued (it ran);
    - all FAIL (a config error fixed since, case C36, transformers PR#12831): queued again, as a
      retry of the last failed run (``failed_trial`` and ``retry_history``, as Optuna's
      ``RetryFailedTrialCallback`` writes them), so it replaces them in the budget (:func:`counted_trials`).

    Call it under the first-contact lock (:func:`open_study`): two groups then never queue one warm
    start twice (case C30).

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
        _queue_warm_start(study, entry, [t.number for t in runs], shown)  # every run failed, or none ran


def _queue_warm_start(study: optuna.Study, entry: dict[str, Any], failed: list[int], shown: str) -> None:
    """Queue one warm start (WAITING, marked :data:`ENQUEUED_ATTR`); after ``failed`` runs, as their retry."""
    system_attrs: dict[str, Any] = {FIXED_PARAMS_ATTR: entry}
    if failed:
        system_attrs.update({FAILED_TRIAL_ATTR: failed[-1], RETRY_HISTORY_ATTR: failed})
    # What Study.enqueue_trial stores, plus the retry marks; the storage call hands back the number.
    number = upstream.create_trial_from_template(study, optuna.trial.create_trial(
        state=TrialState.WAITING, system_attrs=system_attrs, user_attrs={ENQUEUED_ATTR: True}
    ))
    if failed:
        log.info("Warm start %s: failed before (trial%s %s); queued again (trial %d)", shown,
                 "s" if len(failed) > 1 else "", ", ".join(map(str, failed)), number)
    else:
        log.info("Warm start %s: queued (trial %d)", shown, number)


def warm_start_runs(trials: list[optuna.trial.FrozenTrial]) -> list[int]:
    """Each warm start's last COMPLETE run, in trial-number order (``refit.trials: [enqueued]``). A warm start is a
    trial marked :data:`ENQUEUED_ATTR`, known by its ``fixed_params``; when one ran more than once (case C36, or a
    retry), its last COMPLETE run stands for it; warm starts with no COMPLETE run are left out."""
    last: dict[str, int] = {}
    for t in trials:
        if t.user_attrs.get(ENQUEUED_ATTR) and t.state == TrialState.COMPLETE:
            point = json.dumps(t.system_attrs.get(FIXED_PARAMS_ATTR, t.params), sort_keys=True, default=repr)
            last[point] = max(t.number, last.get(point, -1))
    return sorted(last.values())


def _same_point(trial: optuna.trial.FrozenTrial, entry: dict[str, Any]) -> bool:
    """Whether ``trial`` ran (or will run) the warm start ``entry``: its ``fixed_params`` (else its params)
    have the same names and values (:func:`_grid.same_value`), as Optuna's ``enqueue_trial(skip_if_exists=True)``."""
    params = trial.system_attrs.get(FIXED_PARAMS_ATTR, trial.params)
    return params.keys() == entry.keys() and all(_grid.same_value(params[k], v) for k, v in entry.items())


def continued_trials(trials: list[optuna.trial.FrozenTrial]) -> set[int]:
    """The numbers of the trials a later trial continues (a retry, a re-queued warm start, an ASHA promotion):
    Optuna's ``failed_trial`` and ``retry_history`` system attributes of the later trials. A trial no rank ran
    (:data:`._stored.NEVER_RAN_ATTR`) continues nothing: the trial it was to continue is still owed."""
    ran = [t for t in trials if not t.user_attrs.get(NEVER_RAN_ATTR)]
    continued = {t.system_attrs.get(FAILED_TRIAL_ATTR) for t in ran} - {None}
    return continued | {n for t in ran for n in t.system_attrs.get(RETRY_HISTORY_ATTR, ())}


def counted_trials(study: optuna.Study) -> int:
    """Trials that count against ``n_trials``: every trial in :data:`COUNTED_STATES` (all but WAITING), except a
    FAIL trial that a retry continues
    (:func:`continued_trials`; a re-queued warm start is marked the same way): the retry replaces it, so a
    preempted trial and its retry count once (cases C28, C36). Likewise a PRUNED trial paused at an ASHA rung and
    promoted (:mod:`._asha`), and a FAIL continuation of one that ASHA promoted again: the budget counts
    configurations, never attempts; a FAIL trial closed before its payload left rank 0
    (:data:`._stored.NEVER_RAN_ATTR`) never ran and is not counted.
    """
    trials = study.get_trials(deepcopy=False)
    retried = continued_trials(trials)
    parents = {t.number: continues(t) for t in trials}
    children = collections.Counter(p for p in parents.values() if p is not None)
    superseded = {n for n, p in parents.items() if p is not None and children[p] > 1}
    closed = (TrialState.FAIL, TrialState.PRUNED)  # PRUNED: a paused trial that ASHA promoted (_asha)
    return sum(1 for t in trials if t.state in COUNTED_STATES and not (
        t.state in closed and t.number in retried or t.state == TrialState.FAIL and t.number in superseded
        or t.state == TrialState.FAIL and t.user_attrs.get(NEVER_RAN_ATTR)))


def lineage(trial: optuna.trial.FrozenTrial) -> list[int]:
    """The trials ``trial`` continues, oldest first (its ``retry_history``, else its ``failed_trial``), then itself:
    ``[number]`` for a trial of its own."""
    history = list(trial.system_attrs.get(RETRY_HISTORY_ATTR) or ())
    if not history and trial.system_attrs.get(FAILED_TRIAL_ATTR) is not None:
        history = [trial.system_attrs[FAILED_TRIAL_ATTR]]
    return [*history, trial.number]


def continues(trial: optuna.trial.FrozenTrial) -> int | None:
    """The trial ``trial`` directly continues (the last of :func:`lineage` before it), or ``None``."""
    chain = lineage(trial)
    return chain[-2] if len(chain) > 1 else None


def warm_start_params(space: SearchSpace, entries: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """``hydra.sweeper.enqueue_trials`` with each value cast to its param's distribution (case C33), checked
    before the study is opened, so the task gets the value the study records. Casts:

    - float (``interval``, float ``range``): an int, a float, or a string that reads as a number
      (``'0.5'``, ``'1e-3'``) becomes a ``float``;
    - int (``int(interval)``, int ``range``): an int, an integral float (``2.0``) or a string that reads
      as one becomes an ``int``;
    - ``choice``: the choice itself (its own type): the same value of the same type, else the one
      number choice numerically equal to a number (``1.0`` for ``choice(1, 2)``), else the choice the
      text means in Hydra's grammar (``'1'`` for ``choice(1, 2)``, ``'true'``), else a string choice
      equal to the value's override text.

    A bool is never a number here (``True`` is an ``int`` in Python), and the cast value must lie in
    the distribution (bounds, step, choices).

    ``entries``: the warm starts, ``{param name: value}`` each (names without ``+``).

    Raises:
        SweeperConfigError: naming ``enqueue_trials[i]``, the param, the value, its distribution and
            expression, and the fix; for a name that is not a searched param, naming the searched ones.
    """
    out = []
    for i, entry in enumerate(entries):
        typed: dict[str, Any] = {}
        for name, value in entry.items():
            spec = space.params.get(str(name))
            if spec is None:
                raise SweeperConfigError(
                    f"hydra.sweeper.enqueue_trials[{i}] sets '{name}', which is not a searched param "
                    f"(searched: {sorted(space.params)}). Use the searched names (override keys without '+'), "
                    "or add the param to the search space. Nothing was asked from the study and no rank "
                    "started training."
                )
            try:
                typed[str(name)] = _cast_warm_value(spec, value)
            except ValueError as e:
                raise SweeperConfigError(
                    f"hydra.sweeper.enqueue_trials[{i}]: {name}={value!r} {e} (a {type(value).__name__}); '{name}' is "
                    f"searched as {describe_distribution(spec.distribution)} ('{spec.key}={spec.expression}'). "
                    f"Write a value of that distribution (e.g. {name}: {_example(spec)}) or remove it from the warm "
                    "start. Nothing was asked from the study and no rank started training."
                ) from None
        out.append(typed)
    return tuple(out)


def _cast_warm_value(spec: ParamSpec, value: Any) -> Any:
    """``value`` as the type of ``spec``'s distribution, inside it; ``ValueError`` (a reason) otherwise."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    dist = spec.distribution
    if isinstance(dist, CategoricalDistribution):
        return _matching_choice(list(dist.choices), value)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("is not a number")
    if isinstance(dist, FloatDistribution):
        try:
            cast: Any = float(value)
        except ValueError:
            raise ValueError("is not a number") from None
    elif isinstance(dist, IntDistribution):
        try:
            number = float(value) if not isinstance(value, int) else value
        except ValueError:
            raise ValueError("is not a number") from None
        if isinstance(number, float) and not number.is_integer():
            raise ValueError("is not an integer")
        cast = int(number)
    else:  # not made by this module
        return value
    try:
        inside = upstream.distribution_contains(dist, cast)
    except ValueError:  # NaN, or <= 0 on a log scale
        inside = False
    if inside:
        return cast
    raise ValueError("is outside its distribution")


def _matching_choice(choices: list[Any], value: Any) -> Any:
    """The choice ``value`` stands for (see :func:`warm_start_params`); ``ValueError`` when none does."""

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    same = [c for c in choices if type(c) is type(value) and c == value]
    if same:
        return same[0]
    if number(value):
        equal = [c for c in choices if number(c) and c == value]
        if len(equal) == 1:
            return equal[0]
    if isinstance(value, str):
        try:
            meant = read_override_value(value)
        except Exception:  # not override value syntax: no choice is meant by it
            meant = None
        parsed = [c for c in choices if type(c) is type(meant) and c == meant and not isinstance(meant, str)]
        if len(parsed) == 1:
            return parsed[0]
    try:
        text = format_value(value)
    except (TypeError, SearchSpaceError):
        text = None
    texts = [c for c in choices if isinstance(c, str) and c == text]
    if len(texts) == 1:
        return texts[0]
    raise ValueError(f"is not one of the choices {choices!r}")


def _example(spec: ParamSpec) -> str:
    """A valid value of ``spec`` as override text (its first choice or value, or its low bound)."""
    dist = spec.distribution
    first = spec.values[0] if spec.values else getattr(dist, "low", None)
    try:
        return format_value(first)
    except (TypeError, SearchSpaceError):
        return repr(first)
