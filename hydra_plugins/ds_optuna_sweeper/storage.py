"""Where the study lives, and how trials of a dead or preempted worker are found and closed.

The code lives in ``_storage.py``. Hydra's plugin scanner re-executes every scanned module that is already
imported, in place (hydra/core/plugins.py), which would give its classes new identities after the
scan (an ``except`` or ``isinstance`` with a class imported earlier then misses); the scanner skips
``_``-named modules, so this module only re-exports the same objects.
"""

from ._storage import (  # noqa: F401
    GROUP_ATTR,
    RDB_SCHEMES,
    group_id,
    retry_callback,
    open_storage,
    heartbeat_enabled,
    fail_stale,
    abandon,
    own_running_trials,
    Heartbeat,
)

__all__ = ['GROUP_ATTR', 'RDB_SCHEMES', 'group_id', 'retry_callback', 'open_storage', 'heartbeat_enabled', 'fail_stale', 'abandon', 'own_running_trials', 'Heartbeat']
