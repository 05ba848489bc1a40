"""One Hydra sweep override -> one searched param (:class:`ParamSpec`, an Optuna distribution).

Hydra's grammar keeps its meaning (the official Optuna sweeper's documentation and
``hydra.core.override_parser``):

- ``choice(a, b, ...)`` and ``a,b,...``: ``CategoricalDistribution`` of str/int/float/bool/null.
- ``range(start, stop[, step])``: the values Hydra's own ``range`` yields, stop **excluded** for every
  sampler (case C11: the official sweeper 1.3 passed ``stop`` as Optuna's inclusive ``high``).
  Integer ranges become ``IntDistribution(low, high, step)``; float ranges a stepped
  ``FloatDistribution`` whose draws are snapped to Hydra's exact values.
- ``interval(low, high)``: ``FloatDistribution`` (linear), ``int(interval(...))``: ``IntDistribution``,
  ``tag(log, ...)``: log-scaled (case C12).

Pure: no communication and no study. optuna is imported inside functions.
"""

import math
from dataclasses import dataclass
from typing import Any

from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep

from .._errors import SearchSpaceError
from .._upstream import plain_override_value


@dataclass(frozen=True)
class ParamSpec:
    """One searched parameter.

    Attributes:
        name: the param name in the study: the override key without ``+``/``++`` (``training.lr``).
        key: the override key as typed, prefix included (``+training.lr``), used to write overrides.
        distribution: the Optuna distribution.
        expression: the sweep as the user wrote it, for messages.
        values: for ``choice``/``range``, the exact values Hydra enumerates (grid points, and the
            values float draws are snapped to); ``None`` for ``interval``.
    """

    name: str
    key: str
    distribution: Any
    expression: str
    values: tuple[Any, ...] | None = None

    def to_override_value(self, sampled: Any) -> Any:
        """Map a value drawn by Optuna to the value Hydra's ``range`` would have produced: for a float ``range``
        Optuna returns ``low + k * step`` in float arithmetic while Hydra sums decimals, so the nearest of Hydra's
        values is used."""
        if self.values is None or not isinstance(sampled, float):
            return sampled
        return min(self.values, key=lambda v: abs(v - sampled)) if self.values else sampled


def describe_distribution(dist: Any) -> str:
    """Short text for an Optuna distribution: ``float in [a, b], log`` / ``int in [a, b] step s`` / ``one of [...]``."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if isinstance(dist, CategoricalDistribution):
        return f"one of {list(dist.choices)!r}"
    if isinstance(dist, (FloatDistribution, IntDistribution)):
        kind = "int" if isinstance(dist, IntDistribution) else "float"
        text = f"{kind} in [{dist.low!r}, {dist.high!r}]"
        if dist.step is not None and not (kind == "int" and dist.step == 1):
            text += f" step {dist.step!r}"
        if dist.log:
            text += ", log"
        return text
    return repr(dist)


def _reject(override: Override, why: str, fix: str) -> SearchSpaceError:
    return SearchSpaceError(
        f"Search space: '{override.input_line}' {why}. {fix} Nothing was asked from the study and no "
        "rank started training."
    )


def create_param(override: Override) -> ParamSpec:
    """Turn one sweep override into a :class:`ParamSpec`.

    Raises:
        SearchSpaceError: for a reversed or empty interval/range, a range that yields one value (case
            C59: ``range(0.001, 0.3)`` with the default step 1), ``step`` <= 0 where it must be
            positive, ``tag(log, ...)`` with a bound <= 0, a tag other than ``log`` (Hydra takes any tag), an
            empty ``choice``, a choice of lists or dicts, or a ``glob`` sweep.
    """
    key = override.get_key_element()
    value = override.value()
    expression = expression_text(override)
    tags = set(getattr(value, "tags", set()) or ())
    unknown = sorted(tags - {"log"})
    if unknown:  # Hydra takes any tag: a mistyped 'log' swept the range linearly without a word (a newcomer's 'lgo')
        raise _reject(override, f"has the tag(s) {', '.join(repr(t) for t in unknown)}, which this sweeper does not "
                      "read", "The one tag it reads is 'log' (a log-uniform interval or range): write "
                      "tag(log, ...), or drop the tag.")
    log_scale = "log" in tags
    makers = {ChoiceSweep: _choice_param, RangeSweep: _range_param, IntervalSweep: _interval_param}
    for sweep_type, make in makers.items():
        if isinstance(value, sweep_type):
            dist, values = make(override, value, log_scale)
            return ParamSpec(key.lstrip("+"), key, dist, expression, values)
    raise _reject(
        override,
        f"is a {override.value_type.name.lower() if override.value_type else 'value'} sweep, which this sweeper cannot sample",
        "Use choice(...), range(...) or interval(...); glob(...) is not supported.",
    )


def _choice_param(override: Override, value: ChoiceSweep, log_scale: bool) -> tuple[Any, tuple[Any, ...]]:
    """``CategoricalDistribution`` of the choices (str, int, float, bool or null, as Optuna stores them)."""
    from optuna.distributions import CategoricalDistribution

    choices = [plain_override_value(c) for c in value.list]
    if not choices:
        raise _reject(override, "is an empty choice", "Give at least one value.")
    for c in choices:
        if not (c is None or isinstance(c, (str, int, float, bool))):
            raise _reject(
                override,
                f"has a choice of type {type(c).__name__} ({c!r})",
                "Optuna stores categorical choices as str, int, float, bool or null; sweep a config "
                "group or several keys instead.",
            )
    if log_scale:
        raise _reject(override, "puts tag(log) on a choice", "Log scale applies to interval and range only.")
    return CategoricalDistribution(choices), tuple(choices)


def _range_param(override: Override, value: RangeSweep, log_scale: bool) -> tuple[Any, tuple[Any, ...]]:
    """The values Hydra's ``range`` yields (stop excluded, case C11), as an int or stepped float distribution."""
    from optuna.distributions import FloatDistribution, IntDistribution

    start, stop, step = value.start, value.stop, value.step
    if step == 0:
        raise _reject(override, "has step 0", "Give a non-zero step.")
    values = list(value.range())
    if not values:
        raise _reject(
            override,
            f"is empty: range({start}, {stop}, step={step}) yields no value (stop is excluded, as in "
            "Python and Hydra)",
            "Check the order of start and stop and the sign of step.",
        )
    if len(values) == 1:  # case C59: 'lr=range(0.001,0.3)' ran the whole sweep at 0.001 without a word
        lo, hi = sorted((start, stop))
        log = f" (or tag(log, interval({lo}, {hi})))" if lo > 0 else ""
        raise _reject(
            override,
            f"yields one value ({values[0]!r}): range(start, stop, step) counts from start in steps of {step!r}"
            f"{' (the default)' if value.step == 1 and 'step' not in expression_text(override) else ''} and "
            "excludes stop",
            f"For a float search write interval({lo}, {hi}){log}; for steps give a smaller step, e.g. "
            f"range({start}, {stop}, step={_example_step(start, stop)}); for a fixed value write "
            f"{override.get_key_element()}={values[0]!r}.",
        )
    low, high = min(values), max(values)
    if log_scale and low <= 0:
        raise _reject(override, f"is log-scaled with a bound <= 0 (low {low})", "Use bounds above 0.")
    if all(isinstance(v, int) for v in values) and isinstance(step, int):
        if log_scale and abs(step) != 1:
            raise _reject(override, "is log-scaled with a step other than 1", "Optuna's log scale needs step 1.")
        return IntDistribution(low, high, log=log_scale, step=1 if log_scale else abs(step)), tuple(values)
    if log_scale:
        raise _reject(override, "is a log-scaled float range", "Use tag(log, interval(...)) instead.")
    return FloatDistribution(float(low), float(high), step=float(abs(step))), tuple(values)  # 2+ values here


def _example_step(start: float, stop: float) -> float:
    """A step that gives a range of 10 to 100 values (for a message): a power of ten, signed as ``stop - start``."""
    span = stop - start
    return math.copysign(10.0 ** math.floor(math.log10(abs(span) / 10)), span) if span else 1


def expression_text(override: Override) -> str:
    """The sweep expression as typed (``range(1, 5)``), for messages."""
    return override.get_value_string() if override.input_line else str(override.value())


def _interval_param(override: Override, value: IntervalSweep, log_scale: bool) -> tuple[Any, None]:
    """``interval(low, high)``: linear, or log-uniform under ``tag(log, ...)`` (case C12); int bounds give ints."""
    from optuna.distributions import FloatDistribution, IntDistribution

    low, high = value.start, value.end
    if low is None or high is None or not (low < high):
        raise _reject(
            override,
            f"is reversed or empty (low {low!r}, high {high!r})",
            "Write interval(low, high) with low < high.",
        )
    if any(isinstance(b, float) and not math.isfinite(b) for b in (low, high)):
        raise _reject(override, "has an infinite or NaN bound", "Use finite bounds.")
    if log_scale and low <= 0:
        raise _reject(override, f"is log-scaled with a bound <= 0 (low {low!r})", "Use bounds above 0.")
    if isinstance(low, int) and isinstance(high, int):
        return IntDistribution(low, high, log=log_scale), None
    return FloatDistribution(float(low), float(high), log=log_scale), None
