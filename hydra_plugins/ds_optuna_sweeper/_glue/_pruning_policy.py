"""Whether a pruning callback reports to the running trial or stands aside: one rule for both glues.

The Hugging Face callback (:mod:`._hf_pruning`) and the Lightning callback (:mod:`._lightning`) ask
:func:`callback_policy` at each hook, and nothing else. The rule, one row per situation the task can
run in (``tests/test_pruning_policy.py`` checks each row with a real study and the real slot):

=====================  =====================================  =======  ====================
situation              how it is recognised                   reports  sweeper's SIGTERM
=====================  =====================================  =======  ====================
sweep                  a live trial in the slot, 1 objective  yes      yes
several objectives     a live trial in the slot, 2+           no       yes
refit                  a replayed trial in the slot           no       yes
rerun line             empty slot, ``DS_OPTUNA_TRIAL`` set    no       no
plain run              empty slot, no ``DS_OPTUNA_TRIAL``     no       no
=====================  =====================================  =======  ====================

Why it stands aside: with several objectives Optuna's pruners compare one value per step
(``Trial.report`` is single-objective only); a refit or rerun line replays a finished trial, which has
nothing to report to and whose metrics may have other names (``test_*``); a plain run has no trial.
The callbacks check their metric's name only after this rule says "report" (REVIEW A.0).
Only the standard library at module level.
"""

import enum
from dataclasses import dataclass
from typing import Optional

from .._task._handle import TrialHandle
from .._task._replayed import ReplayedTrial
from .._task._slot import current_trial, in_trial, run_by_sweeper


class Situation(enum.Enum):
    """The five situations a task (and its pruning callback) can run in; see the module's table."""

    SWEEP = "sweep"
    SEVERAL_OBJECTIVES = "several objectives"
    REFIT = "refit"
    RERUN = "rerun line"
    PLAIN = "plain run"


@dataclass(frozen=True)
class CallbackPolicy:
    """What a pruning callback does now.

    Attributes:
        situation: which of the five situations the process is in.
        report_to: the trial to ``report`` to and ask ``should_prune`` (a live, single-objective trial
            of the sweep), or ``None``: stand aside.
        progress_to: in a refit, the replayed trial, told the step of each evaluation (``note_step``) with no
            metric: a part of a replayed PBT schedule pauses at the step where the trial did
            (``hydra.sweeper.refit.schedule``); ``None`` otherwise.
    """

    situation: Situation
    report_to: Optional[TrialHandle] = None
    progress_to: Optional[ReplayedTrial] = None

    @property
    def sweeper_runs(self) -> bool:
        """True when the sweeper runs the task (sweep, several objectives, refit): its SIGTERM handler
        is the one to keep; False in a rerun line and a plain run, which keep the library's own."""
        return self.situation in (Situation.SWEEP, Situation.SEVERAL_OBJECTIVES, Situation.REFIT)


def callback_policy() -> CallbackPolicy:
    """Whether a pruning callback reports to the running trial or stands aside (the module's table).

    Returns:
        A :class:`CallbackPolicy`; its ``report_to`` is the trial to report to, or ``None``.

    Raises:
        RuntimeError: outside the sweeper, when ``DS_OPTUNA_TRIAL`` is set but malformed (as
            :func:`._slot.current_trial`).
    """
    if run_by_sweeper():
        trial = current_trial()
        if isinstance(trial, ReplayedTrial):
            return CallbackPolicy(Situation.REFIT, progress_to=trial)
        if trial.n_objectives > 1:
            return CallbackPolicy(Situation.SEVERAL_OBJECTIVES)
        return CallbackPolicy(Situation.SWEEP, trial)
    if in_trial():
        current_trial()  # a malformed DS_OPTUNA_TRIAL raises here, as it always has at the first evaluation
        return CallbackPolicy(Situation.RERUN)
    return CallbackPolicy(Situation.PLAIN)


def pruning_trial() -> Optional[TrialHandle]:
    """The trial a pruning callback reports to, or ``None``: ``callback_policy().report_to``."""
    return callback_policy().report_to
