"""The message rank 0 broadcasts for each trial (and each refit) to every rank.

A control-plane message, not what the task sees: the task sees a :class:`._handle.TrialHandle` built
from it. Only the standard library: the package root imports this module's neighbours at plugin
discovery.
"""

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class TrialPayload:
    """What rank 0 broadcasts for one trial; equal (``==``) on every rank.

    Attributes:
        number: the Optuna trial number (also Hydra's ``job.num`` and the job dir's name).
        params: ``{param name: value}`` as sampled on rank 0 (exact Python values, float64).
        overrides: the resolved Hydra override list the task config is composed from.
        checkpoint_dir: the trial's checkpoint directory (absolute; the same for every retry of the trial),
            ``""`` when there is none (a refit without ``refit.from_checkpoint``).
        resume_from: the newest complete checkpoint in it when the trial was asked (``None``: start from step 0).
        continues: the number of the trial this one retries (and resumes), or ``None``.
        inherited_steps: the steps of the intermediate values the retried trial reported; they are kept in
            this trial and ``report`` at one of them again is skipped on every rank.
        tracking_env: environment variables the task runs with, so that its own logging joins the trial's
            tracker runs (:mod:`.._tracking._task_env`); empty without ``hydra.sweeper.tracking``.
        pause_at: the ASHA rung (a step) this trial pauses at, or ``None`` (``hydra/sweeper/scheduler``): at its
            first ``should_preempt()`` after reporting a step at or past it, every rank answers True.
        baseline: the name of a ``hydra.sweeper.refit.baselines`` config this refit run trains (``number`` is
            then negative, ``-1`` for the first baseline, and no trial of the study has it); ``""`` otherwise.
        part: ``"part k of n"`` for a refit that replays a PBT schedule in ``n`` parts (``.._loop._refit``);
            ``""`` otherwise.
    """

    number: int
    params: dict = field(default_factory=dict)
    overrides: list = field(default_factory=list)
    checkpoint_dir: str = ""
    resume_from: Optional[str] = None
    continues: Optional[int] = None
    inherited_steps: tuple = ()
    tracking_env: dict = field(default_factory=dict)
    baseline: str = ""
    pause_at: Optional[int] = None
    part: str = ""

    @property
    def what(self) -> str:
        """``trial <number>`` or ``baseline <name>``, for log lines and errors."""
        what = f"baseline {self.baseline}" if self.baseline else f"trial {self.number}"
        return f"{what} ({self.part})" if self.part else what
