"""Errors raised by the sweeper. One base class; each subclass says when it is raised.

The code lives in ``_errors.py``. Hydra's plugin scanner re-executes every scanned module that is already
imported, in place (hydra/core/plugins.py), which would give its classes new identities after the
scan (an ``except`` or ``isinstance`` with a class imported earlier then misses); the scanner skips
``_``-named modules, so this module only re-exports the same objects.
"""

from ._errors import (  # noqa: F401
    DSOptunaSweeperError,
    SearchSpaceError,
    SweeperConfigError,
    RankTimeoutError,
    ConfigMismatchError,
    TrialFailedError,
    ControlPlaneError,
    TrainingGroupBrokenError,
    Preempted,
)

__all__ = ['DSOptunaSweeperError', 'SearchSpaceError', 'SweeperConfigError', 'RankTimeoutError', 'ConfigMismatchError', 'TrialFailedError', 'ControlPlaneError', 'TrainingGroupBrokenError', 'Preempted']
