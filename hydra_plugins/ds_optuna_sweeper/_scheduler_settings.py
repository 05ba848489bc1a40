"""``hydra/sweeper/scheduler``, checked: which scheduler pauses and promotes trials, and its rungs.

Only the standard library and omegaconf at module level (:class:`._settings.Settings` builds this on every rank
before any process group exists; the package root imports no folder, docs/design.md). Which paused trial rank 0
promotes is :mod:`._study._asha` (promotion ASHA: Li et al., MLSys 2020, Algorithm 2) and :mod:`._study._pbt`
(population-based training: Jaderberg et al. 2017, asynchronous as Ray Tune's ``PopulationBasedTraining``); the
group's options and their keys are :mod:`._config_groups`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from ._config_groups import SCHEDULERS
from ._errors import SweeperConfigError


@dataclasses.dataclass(frozen=True)
class Scheduler:
    """The checked ``hydra.sweeper.scheduler`` node: ``name`` (``"none"``, ``"asha"`` or ``"pbt"``) and the keys
    of its group option, as :mod:`._config_groups` describes them; steps are in the unit of ``trial.report``'s
    ``step``. ``keep_paused_bytes`` is in bytes (:func:`parse_bytes`); ``keep_paused`` is applied by
    :func:`._study._asha.over_cap`; PBT's ``population`` replaces ``n_trials`` when set.
    """

    name: str = "none"
    min_steps: int = 1
    max_steps: int | None = None
    reduction_factor: int = 3
    keep_paused: int | None = None
    keep_paused_bytes: int | None = None
    interval: int = 1
    population: int | None = None
    quantile: float = 0.25
    resample_probability: float = 0.25
    perturbation: tuple[float, ...] = (0.8, 1.2)
    mutations: tuple[str, ...] = ()

    @property
    def pauses(self) -> bool:
        """Whether trials pause at rungs (``asha`` and ``pbt``)."""
        return self.name in ("asha", "pbt")

    @property
    def rungs(self) -> tuple[int, ...]:
        """The rungs' steps, ascending: ASHA's ``min_steps * reduction_factor**k``, PBT's multiples of ``interval``,
        below ``max_steps`` (empty for ``none``)."""
        if not self.pauses or self.max_steps is None:
            return ()
        if self.name == "pbt":
            return tuple(range(self.interval, self.max_steps, self.interval))
        steps, step = [], self.min_steps
        while step < self.max_steps:
            steps.append(step)
            step *= self.reduction_factor
        return tuple(steps)

    def pause_step(self, start: int | None) -> int | None:
        """The rung a trial that resumes after step ``start`` (``None``: a new trial) pauses at: the first rung
        above ``start``, or ``None`` (no scheduler, or past the last rung: the trial runs to its end)."""
        return next((r for r in self.rungs if start is None or r > start), None)

    @classmethod
    def from_node(cls, node: DictConfig | Mapping[str, Any] | None, directions: tuple[str, ...],
                  pruner: Any = None) -> "Scheduler":
        """Check ``hydra.sweeper.scheduler`` (``node``: the composed group option, ``None`` when not composed)
        against the study's directions and the composed pruner node.

        Raises:
            SweeperConfigError: an unknown name, ``max_steps`` missing or not above ``min_steps``, ``min_steps``
                below 1, a ``reduction_factor`` that is no integer >= 2, a ``keep_paused`` below 0, several
                objectives, or a pruner other than ``nop`` beside ``asha``.
        """
        if node is None:
            return cls()
        if isinstance(node, DictConfig):
            node = OmegaConf.to_container(node, resolve=True)
        name = node.get("name", "none")
        if name not in tuple(SCHEDULERS):  # a tuple: an unhashable name is refused, not a TypeError
            raise SweeperConfigError(f"hydra.sweeper.scheduler.name={name!r} is no scheduler; choose one with "
                                     f"hydra/sweeper/scheduler=<{'|'.join(SCHEDULERS)}>. Nothing was run.")
        _check_keys(name, node)
        if name == "none":
            return cls()
        if name == "pbt":
            return _pbt_from_node(node, directions, pruner)
        min_steps, max_steps, eta = node.get("min_steps", 1), node.get("max_steps"), node.get("reduction_factor", 3)
        if not _is_int(min_steps) or min_steps < 1:
            raise _bad("min_steps", "an integer >= 1 (the first rung, in trial.report's steps)", min_steps)
        if not _is_int(max_steps) or max_steps <= min_steps:
            raise SweeperConfigError(
                f"hydra.sweeper.scheduler.max_steps must be an integer above min_steps={min_steps} (the task's full "
                f"length in trial.report's steps: no trial pauses at or past it), got {max_steps!r}. Set it, e.g. "
                f"hydra.sweeper.scheduler.max_steps=<your task's last step>. Nothing was run.")
        if not _is_int(eta) or eta < 2:
            raise _bad("reduction_factor", "an integer >= 2 (the ASHA paper's eta)", eta)
        keep = node.get("keep_paused")
        if keep is not None and (not _is_int(keep) or keep < 0):
            raise _bad("keep_paused", "null (every paused trial keeps its checkpoint) or an integer >= 0", keep)
        _check_one_objective_no_pruner("asha", directions, pruner)
        return cls("asha", int(min_steps), int(max_steps), int(eta), keep,
                   parse_bytes(node.get("keep_paused_bytes"), "hydra.sweeper.scheduler.keep_paused_bytes"))


#: Units of :func:`parse_bytes`: powers of 1024, as ``du -h`` and ``ls -lh`` print sizes.
_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_bytes(value: Any, key: str) -> int | None:
    """A size in bytes from an int (``5000000000``) or a string with a unit (``"20G"``, ``"512MiB"``, ``"1.5T"``:
    K, M, G, T are powers of 1024, an optional ``i``/``B`` after them); ``None`` stays ``None``.

    Raises:
        SweeperConfigError: naming ``key``, for a negative size or a string that is no size.
    """
    if value is None:
        return None
    if _is_int(value) and value >= 0:
        return int(value)
    size = r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*"
    match = re.fullmatch(size, value, flags=re.I) if isinstance(value, str) else None
    if match is None:
        raise SweeperConfigError(f"{key} must be null, a number of bytes >= 0 or a size such as 20G or 512M (powers "
                                 f"of 1024), got {value!r}. Nothing was run.")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def _check_keys(name: str, node: Mapping[str, Any]) -> None:
    """Refuse a key the scheduler does not take (``+hydra.sweeper.scheduler.mutation=[lr]``), naming the closest
    valid key."""
    from ._setting_keys import with_hint

    valid = [f.name for f in dataclasses.fields(SCHEDULERS[name])]
    unknown = [k for k in node if k not in valid]
    if unknown:
        hints = [with_hint(f"'{k}'", k, valid) for k in unknown]
        raise SweeperConfigError(f"Unknown hydra.sweeper.scheduler key(s) for hydra/sweeper/scheduler={name}: "
                                 f"{', '.join(hints)}. Valid keys: {', '.join(valid)}. Nothing was run.")


def _check_one_objective_no_pruner(name: str, directions: tuple[str, ...], pruner: Any) -> None:
    """A pausing scheduler ranks one objective and decides at its rungs itself (no stopping pruner beside it)."""
    if len(directions) != 1:
        raise SweeperConfigError(f"hydra/sweeper/scheduler={name} ranks one objective at each rung; this study has "
                                 f"{len(directions)} directions. Nothing was run.")
    target = (pruner or {}).get("_target_", "") if isinstance(pruner, (Mapping, DictConfig)) else ""
    if target and not target.endswith("NopPruner"):
        raise SweeperConfigError(
            f"hydra/sweeper/scheduler={name} pauses trials at its rungs and decides there; a pruner ({target}) would "
            "stop them at the same steps. Use hydra/sweeper/pruner=nop with it. Nothing was run.")


def _pbt_from_node(node: Mapping[str, Any], directions: tuple[str, ...], pruner: Any) -> Scheduler:
    """Check ``hydra/sweeper/scheduler=pbt`` (:meth:`Scheduler.from_node`'s errors, with PBT's keys)."""
    interval, max_steps = node.get("interval"), node.get("max_steps")
    if not _is_int(interval) or interval < 1:
        raise _bad("interval", "an integer >= 1 (steps between two pauses of a member, in trial.report's steps)",
                  interval)
    if not _is_int(max_steps) or max_steps <= interval:
        raise _bad("max_steps", f"an integer above interval={interval} (the task's full length in trial.report's "
                  "steps: no member pauses at or past it)", max_steps)
    population = node.get("population")
    if population is not None and (not _is_int(population) or population < 2):
        raise _bad("population", "null (n_trials members) or an integer >= 2", population)
    quantile = node.get("quantile", 0.25)
    if not _is_number(quantile) or not 0 < quantile <= 0.5:
        raise _bad("quantile", "a number in (0, 0.5] (the bottom share clones the top share)", quantile)
    resample = node.get("resample_probability", 0.25)
    if not _is_number(resample) or not 0 <= resample <= 1:
        raise _bad("resample_probability", "a number in [0, 1]", resample)
    factors = tuple(node.get("perturbation", (0.8, 1.2)) or ())
    if not factors or any(not _is_number(f) or f <= 0 for f in factors):
        raise _bad("perturbation", "a non-empty list of positive factors, e.g. [0.8, 1.2]", list(factors))
    mutations = node.get("mutations") or ()
    if isinstance(mutations, str) or not mutations or not all(isinstance(m, str) for m in mutations):
        raise _bad("mutations", "a non-empty list of the search-space params a clone may change, e.g. "
                  "[training.learning_rate]", mutations)
    _check_one_objective_no_pruner("pbt", directions, pruner)
    return Scheduler("pbt", max_steps=int(max_steps), interval=int(interval), population=population,
                     quantile=float(quantile), resample_probability=float(resample),
                     perturbation=tuple(float(f) for f in factors), mutations=tuple(mutations))


def _bad(key: str, want: str, value: Any) -> SweeperConfigError:
    return SweeperConfigError(f"hydra.sweeper.scheduler.{key} must be {want}, got {value!r}. Nothing was run.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
