"""``hydra.sweeper.stop``, checked: the goal, the patience and Optuna's terminator as the user set them.

Only the standard library and omegaconf at module level: :class:`._settings.Settings` builds this on every rank
before any process group exists (the package root imports no folder, docs/design.md). What the rules decide
from the study is :mod:`._study._stop`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from ._errors import SweeperConfigError


@dataclasses.dataclass(frozen=True)
class StopRules:
    """The checked ``hydra.sweeper.stop`` node.

    Attributes:
        goal: the best value that ends the search (the study's direction decides ``<=`` or ``>=``), or ``None``.
        patience: finished trials without a new best that end the search (>= 1), or ``None``.
        terminator: ``True`` (the default pairing, module docstring), a ``_target_`` mapping, or ``None`` (off).
    """

    goal: float | None = None
    patience: int | None = None
    terminator: Any = None

    @classmethod
    def from_node(cls, node: DictConfig | Mapping[str, Any] | None, directions: tuple[str, ...]) -> "StopRules":
        """Check ``hydra.sweeper.stop`` against the study's directions.

        Raises:
            SweeperConfigError: a goal that is no finite number, a patience below 1, a terminator that is
                neither a bool nor a node with ``_target_``, or any rule with several objectives.
        """
        if node is None:
            return cls()
        if isinstance(node, DictConfig):
            node = OmegaConf.to_container(node, resolve=True)
        goal, patience, terminator = node.get("goal"), node.get("patience"), node.get("terminator")
        if goal is not None:
            if isinstance(goal, bool) or not isinstance(goal, (int, float)) or not math.isfinite(float(goal)):
                raise SweeperConfigError(f"hydra.sweeper.stop.goal must be a finite number (the best value that ends "
                                         f"the search), got {goal!r}")
            goal = float(goal)
        if patience is not None and (isinstance(patience, bool) or not isinstance(patience, int) or patience < 1):
            raise SweeperConfigError(f"hydra.sweeper.stop.patience must be an integer >= 1 (finished trials "
                                     f"without a new best), got {patience!r}")
        if terminator is False:
            terminator = None
        if terminator is not None and terminator is not True:
            if not isinstance(terminator, Mapping) or not isinstance(terminator.get("_target_"), str):
                raise SweeperConfigError(
                    "hydra.sweeper.stop.terminator must be true (Optuna's Terminator with EMMR and the median "
                    "error, no cross-validation scores needed), false, or a node with _target_ building an "
                    "optuna.terminator.BaseTerminator (docs/how-to/stop-rules.md); got " + repr(terminator))
        rules = cls(goal, patience, terminator)
        if rules and len(directions) > 1:
            raise SweeperConfigError(
                f"hydra.sweeper.stop ({rules.describe()}) needs a single objective; the study has "
                f"{len(directions)} directions {list(directions)}. Use n_trials or timeout to bound it.")
        return rules

    def __bool__(self) -> bool:
        return self.goal is not None or self.patience is not None or self.terminator is not None

    def describe(self) -> str:
        """The rules that are on, as ``key=value`` text, e.g. ``goal=0.9, patience=5``; ``""`` when none is."""
        parts = [f"goal={self.goal:g}" if self.goal is not None else "",
                 f"patience={self.patience}" if self.patience is not None else "",
                 "terminator" if self.terminator is not None else ""]
        return ", ".join(p for p in parts if p)
