"""The trial a task is running, seen from inside the task function on every rank.

The code lives in ``_trial.py``. Hydra's plugin scanner re-executes every scanned module that is already
imported, in place (hydra/core/plugins.py), which would give its classes new identities after the
scan (an ``except`` or ``isinstance`` with a class imported earlier then misses); the scanner skips
``_``-named modules, so this module only re-exports the same objects.
"""

from ._trial import (  # noqa: F401
    TrialPayload,
    RankTrial,
    current_trial,
    in_trial,
    trial_slot,
    _reset_for_tests,
)

__all__ = ['TrialPayload', 'RankTrial', 'current_trial', 'in_trial', 'trial_slot', '_reset_for_tests']
