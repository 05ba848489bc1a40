"""The message rank 0 broadcasts for each trial (and each refit) to every rank.

A control-plane message, not what the task sees: the task sees a :class:`._handle.TrialHandle` built
from it. Only the standard library: the package root imports this module's neighbours at plugin
discovery.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TrialPayload:
    """What rank 0 broadcasts for one trial; equal (``==``) on every rank.

    Attributes:
        number: the Optuna trial number (also Hydra's ``job.num`` and the job dir's name).
        params: ``{param name: value}`` as sampled on rank 0 (exact Python values, float64).
        overrides: the resolved Hydra override list the task config is composed from.
    """

    number: int
    params: dict = field(default_factory=dict)
    overrides: list = field(default_factory=list)
