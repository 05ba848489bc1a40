"""Warm starts (``hydra.sweeper.enqueue_trials``) cast to their params' distributions (case C33).

Pure: no communication and no study. optuna is imported inside functions.
"""

from typing import Any, Mapping, Sequence

from .._errors import SearchSpaceError, SweeperConfigError
from .._upstream import distribution_contains
from ._distributions import ParamSpec, describe_distribution
from ._override_text import format_value, read_override_value
from ._search_space import SearchSpace


def warm_start_params(space: SearchSpace, entries: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """``hydra.sweeper.enqueue_trials`` with each value cast to its param's distribution (case C33), checked
    before the study is opened, so the task gets the value the study records. Casts:

    - float (``interval``, float ``range``): an int, a float, or a string that reads as a number
      (``'0.5'``, ``'1e-3'``) becomes a ``float``;
    - int (``int(interval)``, int ``range``): an int, an integral float (``2.0``) or a string that reads
      as one becomes an ``int``;
    - ``choice``: the choice itself (its own type): the same value of the same type, else the one
      number choice numerically equal to a number (``1.0`` for ``choice(1, 2)``), else the choice the
      text means in Hydra's grammar (``'1'`` for ``choice(1, 2)``, ``'true'``), else a string choice
      equal to the value's override text.

    A bool is never a number here (``True`` is an ``int`` in Python), and the cast value must lie in
    the distribution (bounds, step, choices).

    ``entries``: the warm starts, ``{param name: value}`` each (names without ``+``).

    Raises:
        SweeperConfigError: naming ``enqueue_trials[i]``, the param, the value, its distribution and
            expression, and the fix; for a name that is not a searched param, naming the searched ones.
    """
    out = []
    for i, entry in enumerate(entries):
        typed: dict[str, Any] = {}
        for name, value in entry.items():
            spec = space.params.get(str(name))
            if spec is None:
                raise SweeperConfigError(
                    f"hydra.sweeper.enqueue_trials[{i}] sets '{name}', which is not a searched param "
                    f"(searched: {sorted(space.params)}). Use the searched names (override keys without '+'), "
                    "or add the param to the search space. Nothing was asked from the study and no rank "
                    "started training."
                )
            try:
                typed[str(name)] = _cast_warm_value(spec, value)
            except ValueError as e:
                raise SweeperConfigError(
                    f"hydra.sweeper.enqueue_trials[{i}]: {name}={value!r} {e} (a {type(value).__name__}); '{name}' is "
                    f"searched as {describe_distribution(spec.distribution)} ('{spec.key}={spec.expression}'). "
                    f"Write a value of that distribution (e.g. {name}: {_example(spec)}) or remove it from the warm "
                    "start. Nothing was asked from the study and no rank started training."
                ) from None
        out.append(typed)
    return tuple(out)


def _cast_warm_value(spec: ParamSpec, value: Any) -> Any:
    """``value`` as the type of ``spec``'s distribution, inside it; ``ValueError`` (a reason) otherwise."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    dist = spec.distribution
    if isinstance(dist, CategoricalDistribution):
        return _matching_choice(list(dist.choices), value)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("is not a number")
    if isinstance(dist, FloatDistribution):
        try:
            cast: Any = float(value)
        except ValueError:
            raise ValueError("is not a number") from None
    elif isinstance(dist, IntDistribution):
        try:
            number = float(value) if not isinstance(value, int) else value
        except ValueError:
            raise ValueError("is not a number") from None
        if isinstance(number, float) and not number.is_integer():
            raise ValueError("is not an integer")
        cast = int(number)
    else:  # not made by this module
        return value
    try:
        inside = distribution_contains(dist, cast)
    except ValueError:  # NaN, or <= 0 on a log scale
        inside = False
    if inside:
        return cast
    raise ValueError("is outside its distribution")


def _matching_choice(choices: list[Any], value: Any) -> Any:
    """The choice ``value`` stands for (see :func:`warm_start_params`); ``ValueError`` when none does."""

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    same = [c for c in choices if type(c) is type(value) and c == value]
    if same:
        return same[0]
    if number(value):
        equal = [c for c in choices if number(c) and c == value]
        if len(equal) == 1:
            return equal[0]
    if isinstance(value, str):
        try:
            meant = read_override_value(value)
        except Exception:  # not override value syntax: no choice is meant by it
            meant = None
        parsed = [c for c in choices if type(c) is type(meant) and c == meant and not isinstance(meant, str)]
        if len(parsed) == 1:
            return parsed[0]
    try:
        text = format_value(value)
    except (TypeError, SearchSpaceError):
        text = None
    texts = [c for c in choices if isinstance(c, str) and c == text]
    if len(texts) == 1:
        return texts[0]
    raise ValueError(f"is not one of the choices {choices!r}")


def _example(spec: ParamSpec) -> str:
    """A valid value of ``spec`` as override text (its first choice or value, or its low bound)."""
    dist = spec.distribution
    first = spec.values[0] if spec.values else getattr(dist, "low", None)
    try:
        return format_value(first)
    except (TypeError, SearchSpaceError):
        return repr(first)
