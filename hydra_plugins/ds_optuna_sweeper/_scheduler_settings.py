"""``hydra/sweeper/scheduler``, checked: which scheduler pauses and promotes trials, and its rungs.

Only the standard library and omegaconf at module level (:class:`._settings.Settings` builds this on every rank
before any process group exists; the package root imports no folder, docs/design.md). Which paused trial rank 0
promotes is :mod:`._study._asha`.

Promotion ASHA (Li et al., "A System for Massively Parallel Hyperparameter Tuning", MLSys 2020, Algorithm 2): the
rungs lie at ``min_steps * reduction_factor**k`` steps (``k = 0, 1, ...``) below ``max_steps``. A trial that
reports a step at or past its next rung pauses there at its next ``should_preempt()`` (it saves a checkpoint and
returns, as on a preemption); rank 0 promotes a paused trial, which continues from its checkpoint, when it ranks in
the top ``1/reduction_factor`` of its rung; a trial past the last rung runs to its end.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from ._errors import SweeperConfigError

#: The schedulers of ``hydra/sweeper/scheduler`` (the group's options, ``config.SCHEDULERS``).
NAMES = ("none", "asha")


@dataclasses.dataclass(frozen=True)
class Scheduler:
    """The checked ``hydra.sweeper.scheduler`` node.

    Attributes:
        name: ``"none"`` (no pausing) or ``"asha"`` (promotion ASHA).
        min_steps: the first rung, in the unit of ``trial.report``'s ``step`` (>= 1).
        max_steps: the task's full length in that unit (> ``min_steps``); no trial pauses at or past it.
        reduction_factor: the paper's eta (an integer >= 2).
        keep_paused: how many paused trials keep their checkpoint (``None``: all); see :func:`._study._asha.over_cap`.
    """

    name: str = "none"
    min_steps: int = 1
    max_steps: int | None = None
    reduction_factor: int = 3
    keep_paused: int | None = None

    @property
    def pauses(self) -> bool:
        """Whether trials pause at rungs (``asha``)."""
        return self.name == "asha"

    @property
    def rungs(self) -> tuple[int, ...]:
        """The rungs' steps, ascending: ``min_steps * reduction_factor**k`` below ``max_steps`` (empty for ``none``)."""
        if not self.pauses or self.max_steps is None:
            return ()
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
        """Check ``hydra.sweeper.scheduler``.

        Args:
            node: the composed group option (``None``: not composed, e.g. settings built in code).
            directions: the study's directions (ASHA ranks one objective).
            pruner: the composed pruner node (ASHA decides at the rungs itself; a stopping pruner is refused).

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
        if name not in NAMES:
            raise SweeperConfigError(f"hydra.sweeper.scheduler.name={name!r} is no scheduler; choose one with "
                                     f"hydra/sweeper/scheduler=<{'|'.join(NAMES)}>. Nothing was run.")
        if name == "none":
            return cls()
        min_steps, max_steps, eta = node.get("min_steps", 1), node.get("max_steps"), node.get("reduction_factor", 3)
        if not _is_int(min_steps) or min_steps < 1:
            raise SweeperConfigError(f"hydra.sweeper.scheduler.min_steps must be an integer >= 1 (the first rung, in "
                                     f"trial.report's steps), got {min_steps!r}. Nothing was run.")
        if not _is_int(max_steps) or max_steps <= min_steps:
            raise SweeperConfigError(
                f"hydra.sweeper.scheduler.max_steps must be an integer above min_steps={min_steps} (the task's full "
                f"length in trial.report's steps: no trial pauses at or past it), got {max_steps!r}. Set it, e.g. "
                f"hydra.sweeper.scheduler.max_steps=<your task's last step>. Nothing was run.")
        if not _is_int(eta) or eta < 2:
            raise SweeperConfigError(f"hydra.sweeper.scheduler.reduction_factor must be an integer >= 2 (the ASHA "
                                     f"paper's eta), got {eta!r}. Nothing was run.")
        keep = node.get("keep_paused")
        if keep is not None and (not _is_int(keep) or keep < 0):
            raise SweeperConfigError(f"hydra.sweeper.scheduler.keep_paused must be null (every paused trial keeps its "
                                     f"checkpoint) or an integer >= 0, got {keep!r}. Nothing was run.")
        if len(directions) != 1:
            raise SweeperConfigError("hydra/sweeper/scheduler=asha ranks one objective at each rung; this study has "
                                     f"{len(directions)} directions. Nothing was run.")
        target = (pruner or {}).get("_target_", "") if isinstance(pruner, (Mapping, DictConfig)) else ""
        if target and not target.endswith("NopPruner"):
            raise SweeperConfigError(
                f"hydra/sweeper/scheduler=asha pauses and promotes trials at its rungs; a pruner ({target}) would stop "
                "them at the same steps. Use hydra/sweeper/pruner=nop with it. Nothing was run.")
        return cls("asha", int(min_steps), int(max_steps), int(eta), keep)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
