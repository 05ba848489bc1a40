"""A search that stops itself: ``hydra.sweeper.stop`` (goal, patience, Optuna's terminator), read from the study.

Rank 0 asks :meth:`StopCheck.reason` before each ask (:class:`._policy.StopRulesMet`); a reason becomes the STOP
command every rank and trial group receives, and trials already running finish. The rules read the whole study, so
a resumed study that already meets one stops before its first new trial.

- ``goal``: the study's best value reached it (``<=`` when minimizing, ``>=`` when maximizing). The best value is
  Optuna's ``study.best_value``: COMPLETE trials only.
- ``patience``: ``patience`` finished trials (COMPLETE or PRUNED, in the order they finished) since the trial
  that set the best value; before any COMPLETE trial, every finished trial counts. FAIL trials are not counted:
  they say nothing about the search space (a crash, a preemption).
- ``terminator``: Optuna's ``optuna.terminator`` (Makarova et al. 2022, "Automatic termination for
  hyperparameter optimization"): stop once the estimated room for improvement is below the estimated
  statistical error. ``true`` builds ``Terminator(EMMREvaluator(), MedianErrorEvaluator(EMMREvaluator()))``,
  the pairing Optuna documents for objectives without cross-validation scores (``MedianErrorEvaluator``'s
  docstring); a node with ``_target_`` is instantiated by Hydra (any ``optuna.terminator.BaseTerminator``).
  Optuna deprecated the module in 4.9.0 for removal in 6.0.0 (its warning is shown once).

All three need a single objective (``SweeperConfigError`` otherwise).
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any

import optuna
from optuna.trial import TrialState

from .._errors import SweeperConfigError
from .._settings import StopRules

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StopReason:
    """Why the search stopped: ``rule`` (``goal``, ``patience`` or ``terminator``) and one sentence (``text``)."""

    rule: str
    text: str

    def as_dict(self) -> dict[str, str]:
        """``{"rule": ..., "reason": ...}``, as written under ``stopped_by:`` in optimization_results.yaml."""
        return {"rule": self.rule, "reason": self.text}


class StopCheck:
    """Rank 0's evaluation of :class:`StopRules` on the study (module docstring). Build it before the study
    opens so that a terminator node that cannot be instantiated fails before any trial.

    Raises:
        SweeperConfigError: (constructor) the terminator node failed to instantiate or is no
            ``optuna.terminator.BaseTerminator``.
    """

    def __init__(self, rules: StopRules, direction: str) -> None:
        self.rules = rules
        self.maximize = direction == "maximize"
        self._terminator = _build_terminator(rules.terminator) if rules.terminator is not None else None

    def reason(self, study: optuna.Study) -> StopReason | None:
        """The first rule the study meets (goal, then patience, then the terminator), or ``None``: go on."""
        if not self.rules:
            return None
        trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        complete = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
        # The first trial that reached the best value (Optuna's best_trial): a later equal value is no improvement.
        best = min(complete, key=lambda t: (-t.value if self.maximize else t.value, t.number)) if complete else None
        goal = self.rules.goal
        if goal is not None and best is not None and (best.value >= goal if self.maximize else best.value <= goal):
            sign = ">=" if self.maximize else "<="
            return StopReason("goal", f"hydra.sweeper.stop.goal reached: best value {best.value:.6g} {sign} "
                                      f"{goal:g} (trial {best.number})")
        patience = self.rules.patience
        if patience is not None:
            since = _finished_since(trials, best)
            if since >= patience:
                after = f"trial {best.number}'s best value {best.value:.6g}" if best else "the start (no COMPLETE trial)"
                return StopReason("patience", f"hydra.sweeper.stop.patience={patience} reached: {since} finished "
                                              f"trials without improving on {after}")
        if self._terminator is not None and self._should_terminate(study):
            return StopReason("terminator", f"Optuna's terminator ({type(self._terminator).__name__}) found the "
                                            f"room left for improvement below the statistical error after "
                                            f"{len(complete)} COMPLETE trials")
        return None

    def _should_terminate(self, study: optuna.Study) -> bool:
        """The terminator's verdict. One that raises (a bare ``optuna.terminator.Terminator()`` wants
        cross-validation scores, ``report_cross_validation_scores``, and raises ``ValueError`` without them) is
        logged once with the fix and turned off: the search goes on under the other rules."""
        try:
            return bool(self._terminator.should_terminate(study))
        except Exception as e:  # noqa: BLE001 - any terminator error only turns the rule off
            log.warning("hydra.sweeper.stop.terminator is off for the rest of this sweep: %s raised %s: %s. A bare "
                        "optuna.terminator.Terminator needs cross-validation scores; give it an error_evaluator "
                        "(e.g. {_target_: optuna.terminator.MedianErrorEvaluator, paired_improvement_evaluator: "
                        "{_target_: optuna.terminator.EMMREvaluator}}) or use stop.terminator=true",
                        type(self._terminator).__name__, type(e).__name__, str(e).split("\n")[0])
            self._terminator = None
            return False


def _finished_since(trials: list[optuna.trial.FrozenTrial], best: optuna.trial.FrozenTrial | None) -> int:
    """Trials among ``trials`` (COMPLETE or PRUNED) that finished after ``best`` did (all of them when ``None``)."""
    if best is None:
        return len(trials)
    end = best.datetime_complete
    return sum(1 for t in trials if t.number != best.number and t.datetime_complete is not None
               and end is not None and (t.datetime_complete, t.number) > (end, best.number))


def _build_terminator(node: Any) -> Any:
    """Optuna's terminator for ``node`` (``True`` or a ``_target_`` mapping); see the module docstring."""
    from hydra.utils import instantiate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the module's deprecation (4.9.0): said once below instead
        from optuna import terminator as term

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            warnings.simplefilter("ignore", FutureWarning)
            if node is True:
                built = term.Terminator(improvement_evaluator=term.EMMREvaluator(),
                                        error_evaluator=term.MedianErrorEvaluator(term.EMMREvaluator()))
            else:
                built = instantiate(dict(node))
    except Exception as e:
        raise SweeperConfigError(f"hydra.sweeper.stop.terminator could not be built: {type(e).__name__}: {e}") from e
    if not isinstance(built, term.BaseTerminator):
        raise SweeperConfigError(f"hydra.sweeper.stop.terminator must build an optuna.terminator.BaseTerminator, "
                                 f"got {type(built).__name__}")
    log.warning("hydra.sweeper.stop.terminator uses optuna.terminator, which Optuna deprecated in 4.9.0 for "
                "removal in 6.0.0; stop.goal and stop.patience do not depend on it")
    return built
