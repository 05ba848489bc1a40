"""Hydra sweep overrides <-> Optuna distributions, and trial params -> exact Hydra override lines.

The code lives in ``_search_space.py``. Hydra's plugin scanner re-executes every scanned module that is already
imported, in place (hydra/core/plugins.py), which would give its classes new identities after the
scan (an ``except`` or ``isinstance`` with a class imported earlier then misses); the scanner skips
``_``-named modules, so this module only re-exports the same objects.
"""

from ._search_space import (  # noqa: F401
    LINEAR_SPAN_WARN_DECADES,
    parse_overrides,
    format_value,
    override_line,
    ParamSpec,
    SearchSpace,
    describe_distribution,
    create_param,
    build_search_space,
    span_warnings,
)

__all__ = ['LINEAR_SPAN_WARN_DECADES', 'parse_overrides', 'format_value', 'override_line', 'ParamSpec', 'SearchSpace', 'describe_distribution', 'create_param', 'build_search_space', 'span_warnings']
