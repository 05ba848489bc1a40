"""The search space of a sweep: the searched params and the overrides passed through unchanged.

:func:`build_search_space` combines ``hydra.sweeper.params`` and the command line into one frozen
:class:`SearchSpace` (each sweep override becomes a :class:`~._distributions.ParamSpec`; any other
override passes through to every trial unchanged); :meth:`SearchSpace.overrides` turns a trial's params
back into exact Hydra override lines.

Pure: no communication and no study. optuna is imported inside functions.
"""

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from hydra.core.override_parser.types import Override

from .._errors import SearchSpaceError
from ._distributions import ParamSpec, create_param, describe_distribution
from ._override_text import format_value, override_line, parse_overrides

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

#: A linear ``interval`` whose bounds are this many decades apart or more gets a warning.
LINEAR_SPAN_WARN_DECADES = 3


@dataclass(frozen=True)
class SearchSpace:
    """The searched params and the overrides passed through unchanged.

    Built complete by :func:`build_search_space` and never changed after: the dict and the list are
    read-only by contract (plain containers, so the value stays picklable and compares to plain lists).

    Attributes:
        params: ``{name: ParamSpec}`` in the order given (config params first, then the command line).
        fixed: non-sweep override lines, as typed, applied to every trial before the sampled ones.
    """

    params: Mapping[str, ParamSpec] = field(default_factory=dict)
    fixed: list[str] = field(default_factory=list)

    def distributions(self) -> dict[str, "BaseDistribution"]:
        """``{name: distribution}`` for ``Study.ask(fixed_distributions=...)``."""
        return {name: spec.distribution for name, spec in self.params.items()}

    def overrides(self, params: Mapping[str, Any]) -> list[str]:
        """The override list for one trial: the fixed overrides, then :meth:`param_lines`."""
        return [*self.fixed, *self.param_lines(params)]

    def param_lines(self, params: Mapping[str, Any]) -> list[str]:
        """One override line per param: search-space params with their key as typed, others (added by
        ``custom_search_space`` or ``suggest_*`` in the task) by name."""
        lines: list[str] = []
        for name, value in params.items():
            spec = self.params.get(name)
            if spec is None:
                lines.append(override_line(name, value))
            else:
                lines.append(override_line(spec.key, spec.to_override_value(value)))
        return lines

    def grid(self) -> dict[str, list[Any]]:
        """``{name: [values]}`` for ``optuna.samplers.GridSampler``.

        Raises:
            SearchSpaceError: if a param is a continuous ``interval`` (a grid needs finite values).
        """
        grid: dict[str, list[Any]] = {}
        for name, spec in self.params.items():
            if spec.values is None:
                raise SearchSpaceError(
                    f"The grid sampler needs finite values, but '{spec.key}={spec.expression}' is a "
                    "continuous interval. Use choice(...) or range(...) for it, or another sampler."
                )
            grid[name] = list(spec.values)
        return grid

    def describe(self) -> list[str]:
        """One human-readable line per param, e.g. ``training.lr: float in [1e-05, 0.001], log``."""
        return [f"{name}: {describe_distribution(spec.distribution)}  <- {spec.expression}" for name, spec in self.params.items()]


def build_search_space(params: Mapping[str, Any] | None, arguments: Iterable[str]) -> SearchSpace:
    """Combine ``hydra.sweeper.params`` and the command line into one :class:`SearchSpace`. A key given both in
    ``params`` and on the command line takes the command line's value (a fixed value there removes the key from
    the search).

    Args:
        params: ``{override key: sweep expression}`` from ``hydra.sweeper.params`` (values may be
            strings like ``"choice(1,2)"`` or plain YAML values, which are then fixed).
        arguments: the task overrides from the command line (``Sweeper.sweep(arguments)``).

    Raises:
        SearchSpaceError: see :func:`._distributions.create_param`, or unparsable syntax.
    """
    lines: list[str] = []
    containers = {str(k): p for k, v in (params or {}).items() if isinstance(p := _plain(v), (list, tuple, dict))}
    if containers:
        raise SearchSpaceError(
            "hydra.sweeper.params takes Hydra sweep expressions (strings), but "
            + "; ".join(f"'{k}' is a YAML {'mapping' if isinstance(v, dict) else 'list'} ({v!r})"
                        for k, v in containers.items())
            + ". Write "
            + ", ".join(f"'{k}: {_rewrite(v)}'" for k, v in containers.items())
            + " (facebookresearch/hydra#2555). Nothing was asked from the study and no rank started training."
        )
    where: list[str] = []
    for key, expr in (params or {}).items():
        lines.append(f"{key}={expr}" if isinstance(expr, str) else override_line(str(key), expr))
        where.append(f"hydra.sweeper.params.{key}")
    lines.extend(arguments)
    where.extend("the command line" for _ in range(len(lines) - len(where)))
    by_key: dict[str, Override] = {}
    for ov in parse_overrides(lines, where):
        name = ov.get_key_element().lstrip("+")
        by_key.pop(name, None)  # last one wins, and keeps command-line order
        by_key[name] = ov
    params = {name: create_param(ov) for name, ov in by_key.items() if ov.is_sweep_override()}
    fixed = [ov.input_line or f"{ov.get_key_element()}={ov.get_value_element_as_str()}"
             for ov in by_key.values() if not ov.is_sweep_override()]
    return SearchSpace(params, fixed)


def _plain(value: Any) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _rewrite(plain: Any) -> str:
    """The sweep expression a plain YAML list most likely meant: ``choice(a, b)``."""
    if isinstance(plain, dict):
        return "<a sweep expression such as choice(...) or interval(...)>"
    try:
        return "choice(" + ", ".join(format_value(v) for v in plain) + ")"
    except (TypeError, SearchSpaceError):
        return "choice(...)"


def span_warnings(space: SearchSpace) -> list[str]:
    """Warnings for linear float intervals that span ``LINEAR_SPAN_WARN_DECADES`` decades or more: a learning rate
    searched linearly over ``interval(1e-5, 1e-3)`` spends 99% of its draws above 1e-5 * 10 (case C12)."""
    from optuna.distributions import FloatDistribution

    out = []
    for name, spec in space.params.items():
        d = spec.distribution
        if isinstance(d, FloatDistribution) and not d.log and d.step is None and d.low > 0:
            decades = math.log10(d.high / d.low)
            if decades >= LINEAR_SPAN_WARN_DECADES:
                out.append(
                    f"'{spec.key}={spec.expression}' is linear but spans {decades:.1f} decades: most draws "
                    f"land near the top. Write '{spec.key}=tag(log, {spec.expression})' for a log-uniform "
                    "search (silence this by narrowing the interval)."
                )
    return out
