"""What rank 0 reports: a log line per trial, and ``optimization_results.yaml`` in the sweep dir.

The code lives in ``_results.py``. Hydra's plugin scanner re-executes every scanned module that is already
imported, in place (hydra/core/plugins.py), which would give its classes new identities after the
scan (an ``except`` or ``isinstance`` with a class imported earlier then misses); the scanner skips
``_``-named modules, so this module only re-exports the same objects.
"""

from ._results import (  # noqa: F401
    RESULTS_FILE,
    log_progress,
    rerun_overrides,
    app_command,
    summarize,
    write_results,
    summary_table,
)

__all__ = ['RESULTS_FILE', 'log_progress', 'rerun_overrides', 'app_command', 'summarize', 'write_results', 'summary_table']
