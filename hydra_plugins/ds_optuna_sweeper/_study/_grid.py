"""Rank 0 only: the grid sampler, where a warm start counts as its grid point (case C32).

Optuna 5's ``GridSampler`` gives a fresh trial numbered ``n`` below the grid size the ``n``-th point
of its shuffled grid, and gives an enqueued trial (``fixed_params``) no grid point at all
(optuna/samplers/_grid.py ``before_trial``). So warm starts on a grid displaced grid points: with
``x: choice(0.1,0.2,0.3,0.4)`` and warm starts 0.1 and 0.2, trials 2 and 3 ran 0.2 and 0.1 again
and 0.3 and 0.4 never ran (optuna/optuna PR#2946, #3256). :class:`WarmStartGridSampler` marks each
warm start with its own grid point and hands fresh trials the points nobody holds yet.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any, Mapping, Sequence

import optuna
from optuna.samplers import GridSampler
from optuna.trial import FrozenTrial

from .. import _upstream as upstream
from .._errors import SweeperConfigError
from ._stored import FIXED_PARAMS_ATTR, GRID_ID_ATTR, GRID_SPACE_ATTR

#: The ``_target_`` values that mean Optuna's own grid sampler; these get :class:`WarmStartGridSampler`.
OPTUNA_GRID_TARGETS = ("optuna.samplers.GridSampler", "optuna.samplers._grid.GridSampler")


def same_value(a: Any, b: Any) -> bool:
    """Whether two param values are the same point: numbers (not bools) within a relative 1e-9
    (a float ``range`` grid holds ``0.30000000000000004`` where the user writes 0.3), others by ``==``."""
    if isinstance(a, Real) and isinstance(b, Real) and not isinstance(a, bool) and not isinstance(b, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0) or (math.isnan(float(a)) and math.isnan(float(b)))
    return type(a) is type(b) and a == b


def warm_starts_on_grid(grid: Mapping[str, Sequence[Any]], entries: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """The warm starts as grid points, each value replaced by the grid's own (so a warm start and a grid trial
    of the same point hold equal params).

    Args:
        grid: ``{param name: [values]}``, the grid sampler's search space.
        entries: the warm starts, already cast to their distributions (:func:`_search_space.warm_start_params`).

    Raises:
        SweeperConfigError: a warm start that leaves out a grid param (Optuna fails such a trial
            mid-sweep: "All parameters must be specified when using GridSampler with enqueue_trial"),
            or a value that is no grid point; naming ``enqueue_trials[i]``, the param, the value and
            the grid's values.
    """
    out = []
    for i, entry in enumerate(entries):
        missing = [name for name in grid if name not in entry]
        if missing:
            raise SweeperConfigError(
                f"hydra.sweeper.enqueue_trials[{i}] = {dict(entry)} leaves out {missing}; on the grid sampler a "
                f"warm start is a grid point and names every searched param (grid: {_show(grid)}). Add "
                f"{', '.join(f'{m}: <one of {list(grid[m])}>' for m in missing)} to it. Nothing was asked from "
                "the study and no rank started training."
            )
        point: dict[str, Any] = {}
        for name, value in entry.items():
            values = grid.get(name)
            match = [v for v in values if same_value(v, value)] if values is not None else []
            if not match:
                where = f"its grid values are {list(values)}" if values is not None else "it is not a grid param"
                raise SweeperConfigError(
                    f"hydra.sweeper.enqueue_trials[{i}]: {name}={value!r} is not a point of the grid sampler's grid "
                    f"({where}; grid: {_show(grid)}). On the grid sampler each point runs once and a warm start "
                    "counts as its point: use one of the grid values, or another sampler for off-grid warm starts. "
                    "Nothing was asked from the study and no rank started training."
                )
            point[name] = match[0]
        out.append(point)
    return tuple(out)


def _show(grid: Mapping[str, Sequence[Any]]) -> str:
    return "{" + ", ".join(f"{name}: {list(values)}" for name, values in grid.items()) + "}"


class WarmStartGridSampler(GridSampler):
    """``optuna.samplers.GridSampler`` (same ``search_space`` and ``seed``) where a warm start counts as its grid
    point. It differs in :meth:`before_trial` only:

    - a trial enqueued with every grid param (``fixed_params``) gets the grid point of its params,
      so the grid counts it as visited once it finishes (Optuna gives it none);
    - a fresh trial numbered ``n`` gets Optuna's choice, the ``n``-th point of the shuffled grid,
      unless another trial holds that point (stored ``grid_id``, or a waiting or running warm start
      of it); then the ``k``-th of the points nobody holds, ``k = n mod (their number)``, so two
      groups asking at once rarely pick the same one; when every point is held, Optuna's own choice.

    Relies on ``GridSampler``'s private attributes and system attributes (optuna 4.x-5.0), each read through
    :mod:`._upstream` (sentinels in tests/test_upstream_sentinels.py).
    """

    def grid_id_of(self, params: Mapping[str, Any]) -> int | None:
        """The grid point index of ``params`` (every grid param set to a grid value), else ``None``."""
        names, points = upstream.grid_points(self)
        if set(params) != set(names):
            return None
        for grid_id, point in enumerate(points):
            if all(same_value(point[i], params[name]) for i, name in enumerate(names)):
                return grid_id
        return None

    def held(self, study: optuna.Study, exclude: int | None = None) -> set[int]:
        """Grid points the trials of this grid hold (but trial number ``exclude``): a stored ``grid_id``
        (any state), or the point of a warm start not given one yet (WAITING)."""
        held: set[int] = set()
        for t in upstream.all_trials(study):
            if t.number == exclude:
                continue
            attrs = t.system_attrs
            if GRID_ID_ATTR in attrs:
                if upstream.grid_same_space(self, attrs.get(GRID_SPACE_ATTR, {})):
                    held.add(int(attrs[GRID_ID_ATTR]))
            elif FIXED_PARAMS_ATTR in attrs and not t.state.is_finished():
                grid_id = self.grid_id_of(attrs[FIXED_PARAMS_ATTR])
                if grid_id is not None:
                    held.add(grid_id)
        return held

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Give the trial its grid point (system attributes ``grid_id`` and ``search_space``); see the class."""
        attrs = trial.system_attrs
        if GRID_ID_ATTR in attrs:  # a retry (RetryFailedTrialCallback copies it)
            return
        if FIXED_PARAMS_ATTR in attrs:
            grid_id = self.grid_id_of(attrs[FIXED_PARAMS_ATTR])
            if grid_id is None:  # not a grid point: Optuna's own behaviour (refused before trial 0 by the sweeper)
                return
        else:
            held = self.held(study, exclude=trial.number)
            size = upstream.grid_size(self)
            free = [i for i in range(size) if i not in held]
            if trial.number < size and trial.number not in held:
                grid_id = trial.number
            elif free:
                grid_id = free[trial.number % len(free)]
            else:
                super().before_trial(study, trial)
                return
        upstream.set_trial_system_attr(study, trial, GRID_SPACE_ATTR, upstream.grid_search_space(self))
        upstream.set_trial_system_attr(study, trial, GRID_ID_ATTR, grid_id)


def points_left(study: optuna.Study) -> int | None:
    """How many trials the study can still ask without repeating a grid point, or ``None`` when its
    sampler is no :class:`WarmStartGridSampler`: the waiting trials (queued warm starts and retries,
    asked first) plus the grid points no trial holds. ``0`` with every point finished means the grid is done."""
    sampler = study.sampler
    if not isinstance(sampler, WarmStartGridSampler):
        return None
    waiting = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))
    return waiting + upstream.grid_size(sampler) - len(sampler.held(study))


def grid_of(sampler: Mapping[str, Any], space: Any) -> dict[str, list[Any]] | None:
    """The grid the ``hydra.sweeper.sampler`` node searches (its ``search_space``, else ``space.grid()``), or
    ``None`` when its ``_target_`` does not end in ``GridSampler``.

    Raises:
        SearchSpaceError: the node sets no ``search_space`` and a param is a continuous interval.
    """
    if not str(sampler.get("_target_", "")).endswith("GridSampler"):
        return None
    given = sampler.get("search_space")
    if given:
        return {str(name): list(values) for name, values in given.items()}
    return space.grid()


def sampler_name(sampler: Any) -> str:
    """The sampler's class name for the log: ``GridSampler`` for :class:`WarmStartGridSampler` (the
    class the user chose; it differs only for warm starts)."""
    return "GridSampler" if isinstance(sampler, WarmStartGridSampler) else type(sampler).__name__


def sampler_target(target: str) -> str:
    """The class to instantiate for a sampler ``_target_``: :class:`WarmStartGridSampler` for Optuna's
    own ``GridSampler`` (a user's subclass is kept), the target itself otherwise."""
    if target in OPTUNA_GRID_TARGETS:
        return f"{WarmStartGridSampler.__module__}.{WarmStartGridSampler.__qualname__}"
    return target
