"""Optuna's plots of the study, written by rank 0 into ``<sweep dir>/plots/`` as PNG and HTML.

The code lives in ``_plots.py``. Hydra's plugin scanner re-executes every scanned module that is already
imported, in place (hydra/core/plugins.py), which would give its classes new identities after the
scan (an ``except`` or ``isinstance`` with a class imported earlier then misses); the scanner skips
``_``-named modules, so this module only re-exports the same objects.
"""

from ._plots import (  # noqa: F401
    PLOTS_DIR,
    write_plots,
)

__all__ = ['PLOTS_DIR', 'write_plots']
