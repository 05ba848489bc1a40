"""The control plane: who am I, and rank 0 <-> all ranks messages, each wait bounded by a timeout.

The code lives in ``_ranks.py``. Hydra's plugin scanner re-executes every scanned module that is already
imported, in place (hydra/core/plugins.py), which would give its classes new identities after the
scan (an ``except`` or ``isinstance`` with a class imported earlier then misses); the scanner skips
``_``-named modules, so this module only re-exports the same objects.
"""

from ._ranks import (  # noqa: F401
    RankContext,
    env_world,
    default_backend,
    setup_ranks,
)

__all__ = ['RankContext', 'env_world', 'default_backend', 'setup_ranks']
