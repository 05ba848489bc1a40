"""Hydra sweep overrides <-> Optuna distributions, and trial params -> exact Hydra override lines.

Hydra's grammar keeps its meaning (the official Optuna sweeper's documentation and
``hydra.core.override_parser``):

- ``choice(a, b, ...)`` and ``a,b,...``: ``CategoricalDistribution`` of str/int/float/bool/null.
- ``range(start, stop[, step])``: the values Hydra's own ``range`` yields, stop **excluded** for every
  sampler (case C11: the official sweeper 1.3 passed ``stop`` as Optuna's inclusive ``high``).
  Integer ranges become ``IntDistribution(low, high, step)``; float ranges a stepped
  ``FloatDistribution`` whose draws are snapped to Hydra's exact values.
- ``interval(low, high)``: ``FloatDistribution`` (linear), ``int(interval(...))``: ``IntDistribution``,
  ``tag(log, ...)``: log-scaled (case C12).
- Any other override passes through to every trial unchanged.

Pure: no communication and no study. optuna is imported inside functions.
"""


import difflib
import logging
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import (
    ChoiceSweep,
    IntervalSweep,
    Override,
    Quote,
    QuotedString,
    RangeSweep,
)
from hydra._internal.grammar.utils import escape_special_characters

from ._errors import SearchSpaceError

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution

log = logging.getLogger(__name__)

#: A linear ``interval`` whose bounds are this many decades apart or more gets a warning.
LINEAR_SPAN_WARN_DECADES = 3


@lru_cache(maxsize=1)
def _parser() -> OverridesParser:
    return OverridesParser.create()


def parse_overrides(lines: Sequence[str]) -> list[Override]:
    """Parse override strings with Hydra's own parser.

    Raises:
        SearchSpaceError: if a line is not valid Hydra override syntax; the message quotes it.
    """
    try:
        return _parser().parse_overrides(list(lines))
    except Exception as e:  # hydra.errors.OverrideParseException and friends
        raise SearchSpaceError(f"Cannot parse sweep overrides {list(lines)}: {e}") from e


# --- values -> override text -----------------------------------------------------------------------


def format_value(value: Any) -> str:
    """Text for the right side of an override that Hydra parses back to exactly ``value``.

    Types and text survive: ``"1"`` stays a string, ``1`` an int, ``1.0`` a float (shortest repr that
    round-trips float64), ``None`` is ``null``, booleans are ``true``/``false``; strings with
    spaces, commas, ``=``, quotes or backslashes are escaped or quoted the way Hydra's grammar
    says, and the result is checked by parsing it back.

    Args:
        value: a str, int, float, bool or None (Optuna's categorical types), or a list/dict of them.

    Returns:
        The override value text, e.g. ``"1e-05"``, ``"'a, b'"``, ``"null"``.

    Raises:
        TypeError: for any other type.
        SearchSpaceError: if no text round-trips (should not happen; reported rather than guessed).
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{format_value(str(k))}:{format_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        # Plain text when Hydra reads it back as the same string, else a quoted string (more
        # readable than backslash escapes), else escapes.
        candidates = (value, QuotedString(value, Quote.single).with_quotes(), escape_special_characters(value))
        for candidate in candidates:
            if _parses_to(candidate, value):
                return candidate
        raise SearchSpaceError(f"Cannot write the string {value!r} as a Hydra override value")
    raise TypeError(f"Cannot write a {type(value).__name__} as a Hydra override value: {value!r}")


def _parses_to(text: str, value: Any) -> bool:
    try:
        parsed = _parser().parse_override(f"k={text}").value()
    except Exception:
        return False
    return type(parsed) is type(value) and parsed == value


def override_line(key: str, value: Any) -> str:
    """``key=<format_value(value)>``: one override line for a sampled param."""
    return f"{key}={format_value(value)}"


# --- sweeps -> distributions ----------------------------------------------------------------------


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
        """Map a value drawn by Optuna to the value Hydra's ``range`` would have produced.

        For a float ``range`` Optuna returns ``low + k * step`` in float arithmetic while Hydra sums
        decimals; the nearest of Hydra's values is used so the task sees exactly Hydra's number.
        """
        if self.values is None or not isinstance(sampled, float):
            return sampled
        return min(self.values, key=lambda v: abs(v - sampled)) if self.values else sampled


@dataclass(frozen=True)
class SearchSpace:
    """The searched params and the overrides passed through unchanged.

    Attributes:
        params: ``{name: ParamSpec}`` in the order given (config params first, then the command line).
        fixed: non-sweep override lines, as typed, applied to every trial before the sampled ones.
    """

    params: dict[str, ParamSpec] = field(default_factory=dict)
    fixed: list[str] = field(default_factory=list)

    def distributions(self) -> dict[str, "BaseDistribution"]:
        """``{name: distribution}`` for ``Study.ask(fixed_distributions=...)``."""
        return {name: spec.distribution for name, spec in self.params.items()}

    def overrides(self, params: Mapping[str, Any]) -> list[str]:
        """The override list for one trial: the fixed overrides, then one line per param.

        Params not in the search space (added by ``custom_search_space`` or ``suggest_*`` in the
        task) are written with their name as the key.
        """
        return [*self.fixed, *self.param_lines(params)]

    def param_lines(self, params: Mapping[str, Any]) -> list[str]:
        """One override line per param (search-space params with their key as typed, others by name)."""
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
        SearchSpaceError: for a reversed or empty interval/range, ``step`` <= 0 where it must be
            positive, ``tag(log, ...)`` with a bound <= 0, an empty ``choice``, a choice of lists or
            dicts, or a ``glob`` sweep.
    """
    key = override.get_key_element()
    value = override.value()
    expression = override.get_value_string() if override.input_line else str(value)
    log_scale = "log" in getattr(value, "tags", set())
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

    choices = [Override._convert_value(c) for c in value.list]
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
    low, high = min(values), max(values)
    if log_scale and low <= 0:
        raise _reject(override, f"is log-scaled with a bound <= 0 (low {low})", "Use bounds above 0.")
    if all(isinstance(v, int) for v in values) and isinstance(step, int):
        if log_scale and abs(step) != 1:
            raise _reject(override, "is log-scaled with a step other than 1", "Optuna's log scale needs step 1.")
        return IntDistribution(low, high, log=log_scale, step=1 if log_scale else abs(step)), tuple(values)
    if log_scale:
        raise _reject(override, "is a log-scaled float range", "Use tag(log, interval(...)) instead.")
    if len(values) > 1:
        return FloatDistribution(float(low), float(high), step=float(abs(step))), tuple(values)
    return FloatDistribution(float(low), float(high)), tuple(values)


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


def build_search_space(params: Mapping[str, Any] | None, arguments: Iterable[str]) -> SearchSpace:
    """Combine ``hydra.sweeper.params`` and the command line into one :class:`SearchSpace`.

    Args:
        params: ``{override key: sweep expression}`` from ``hydra.sweeper.params`` (values may be
            strings like ``"choice(1,2)"`` or plain YAML values, which are then fixed).
        arguments: the task overrides from the command line (``Sweeper.sweep(arguments)``).

    Returns:
        The search space. A key given both in ``params`` and on the command line takes the command
        line's value (a fixed value there removes the key from the search).

    Raises:
        SearchSpaceError: see :func:`create_param`, or unparsable syntax.
    """
    lines: list[str] = []
    containers = {str(k): v for k, v in (params or {}).items() if _is_container(v)}
    if containers:
        raise SearchSpaceError(
            "hydra.sweeper.params takes Hydra sweep expressions (strings), but "
            + "; ".join(f"'{k}' is a YAML {_container_kind(v)} ({_plain(v)!r})" for k, v in containers.items())
            + ". Write "
            + ", ".join(f"'{k}: {_rewrite(v)}'" for k, v in containers.items())
            + " (facebookresearch/hydra#2555). Nothing was asked from the study and no rank started training."
        )
    for key, expr in (params or {}).items():
        lines.append(f"{key}={expr}" if isinstance(expr, str) else override_line(str(key), expr))
    lines.extend(arguments)
    by_key: dict[str, Override] = {}
    for ov in parse_overrides(lines):
        name = ov.get_key_element().lstrip("+")
        by_key.pop(name, None)  # last one wins, and keeps command-line order
        by_key[name] = ov
    space = SearchSpace()
    for name, ov in by_key.items():
        if ov.is_sweep_override():
            space.params[name] = create_param(ov)
        else:
            space.fixed.append(ov.input_line if ov.input_line else f"{ov.get_key_element()}={ov.get_value_element_as_str()}")
    return space


def _plain(value: Any) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _is_container(value: Any) -> bool:
    return isinstance(_plain(value), (list, tuple, dict))


def _container_kind(value: Any) -> str:
    return "mapping" if isinstance(_plain(value), dict) else "list"


def _rewrite(value: Any) -> str:
    """The sweep expression a YAML list most likely meant: ``choice(a, b)``."""
    plain = _plain(value)
    if isinstance(plain, dict):
        return "<a sweep expression such as choice(...) or interval(...)>"
    try:
        return "choice(" + ", ".join(format_value(v) for v in plain) + ")"
    except (TypeError, SearchSpaceError):
        return "choice(...)"


def check_group_options(space: SearchSpace, group_options: Callable[[str], list[str]]) -> None:
    """Refuse a ``choice``/``range`` over a config group whose options do not all exist (case C22).

    Without this check, a missing option fails only in the trial that draws it, possibly hours in,
    and fixing the list is then refused as a search-space change.

    Args:
        space: the search space.
        group_options: ``group name -> [option names]`` from Hydra's config repository (the
            config loader's ``get_group_options``); an empty list means "not a config group".

    Raises:
        SearchSpaceError: naming each missing option and the available ones.
    """
    problems = []
    for spec in space.params.values():
        group = spec.key.lstrip("+~").split("@", 1)[0]
        if spec.values is None:
            continue
        options = _options_of(group, group_options)
        if not options:
            continue
        missing = [v for v in spec.values if v is not None and str(v) not in options]
        if missing:
            problems.append(f"'{spec.key}={spec.expression}': no option {missing} in config group '{group}' "
                            f"(available: {sorted(options)})")
    if problems:
        raise SearchSpaceError(
            "Search space: " + "; ".join(problems) + ". Add the config file(s) or remove the option(s). Nothing "
            "was asked from the study and no rank started training."
        )


def check_param_keys(space: SearchSpace, config: Any, group_options: Callable[..., list[str]] | None) -> None:
    """Refuse a searched key that the task's config does not have and whose override does not add it.

    Hydra rejects ``lrr=0.1`` for a config without ``lrr`` ("Could not override 'lrr'") in every job,
    so without this check each trial failed at compose time and the study filled with FAIL trials
    that counted against ``n_trials`` (found by a new-user trial). Keys written with ``+``, ``++`` or
    ``~``, package overrides (``@``), config groups and keys below a searched config group (their
    node depends on the option drawn) are left to Hydra.

    A key close to a config key or config group at the same level (``deepspeeed`` for the group
    ``deepspeed``, case C44; :data:`CLOSE_KEY_CUTOFF`) is named as the likely meant one; ``+key=...``
    (which adds a new key and would sweep a junk key) is advised only when nothing is close.

    Args:
        space: the search space.
        config: the config Hydra composed for the sweep (primary config and fixed overrides).
        group_options: as for :func:`check_group_options`; ``None`` treats no key as a config group.
            Called as ``group_options(path, groups=True)`` it lists the config groups below ``path``
            (``""``: the top level), for the suggestions; a callable without that keyword, or one that
            raises, gives no group suggestions.

    Raises:
        SearchSpaceError: naming each unknown key, and either the close key or group meant, or the
            ``+key=...`` form that adds it.
    """
    from omegaconf import DictConfig

    keys = [spec.key for spec in space.params.values()]
    groups = [key for key in keys if _options_of(key, group_options)]
    chosen = _chosen_groups(config)
    problems = []
    for key in keys:
        if key[0] in "+~" or "@" in key:
            continue
        if key in groups:
            if chosen is not None and key not in chosen:  # Hydra: "No match in the defaults list"
                problems.append(f"'{key}' is a config group that is not in the defaults list (write '+{key}=...' "
                                "to add it)")
            continue
        if any(key.startswith(g + ".") for g in groups):
            continue
        node: Any = config
        parts = key.split(".")
        for depth, part in enumerate(parts):
            if not isinstance(node, DictConfig):  # a list index or a value below: left to Hydra
                break
            if part not in node.keys():
                level = ".".join(parts[:depth])
                meant = _close_names(part, [str(k) for k in node.keys()], _groups_below(level, group_options))
                if meant:
                    fixes = " or ".join(_as_written([*parts[:depth], m, *parts[depth + 1:]], chosen, group_options)
                                        for m in meant)
                    problems.append(
                        f"'{key}' is not a key or config group of the task's config (did you mean {fixes}?)")
                else:
                    problems.append(f"'{key}' is not a key of the task's config (write '+{key}=...' to add it)")
                break
            node = node._get_node(part)
    if problems:
        raise SearchSpaceError(
            "Search space: " + "; ".join(problems) + ". Nothing was asked from the study and no rank started training."
        )


#: ``difflib`` ratio from which a config key or group counts as the one a searched name misspelled:
#: ``deepspeeed``/``deepspeed`` 0.95, ``lrr``/``lr`` 0.8, ``modle``/``model`` 0.8; ``xx``/``x`` (0.67)
#: is not close, so ``+xx=`` is advised there.
CLOSE_KEY_CUTOFF = 0.8


def _close_names(name: str, keys: list[str], groups: list[str]) -> list[str]:
    """Config keys and config groups (at one level) close to ``name``, best first, at most 3."""
    candidates = sorted((set(keys) | set(groups)) - {"hydra"})
    return difflib.get_close_matches(name, candidates, n=3, cutoff=CLOSE_KEY_CUTOFF)


def _chosen_groups(config: Any) -> set[str] | None:
    """The config groups in the composed defaults list (``hydra.runtime.choices``, null options included);
    ``None`` when the config does not say (no ``hydra`` node)."""
    try:
        return {str(k) for k in config.hydra.runtime.choices.keys()}
    except Exception:
        return None


def _as_written(parts: list[str], chosen: set[str] | None, group_options: Callable[..., list[str]] | None) -> str:
    """``'key'`` as a suggestion, ``'+key'`` for a config group the defaults list lacks (Hydra only appends it)."""
    key = ".".join(parts)
    plus = len(parts) == 1 and chosen is not None and key not in chosen and bool(_options_of(key, group_options))
    return f"'+{key}'" if plus else f"'{key}'"


def _groups_below(path: str, group_options: Callable[..., list[str]] | None) -> list[str]:
    """The config groups directly below ``path`` (dotted; ``""`` for the top), ``[]`` when they cannot be listed."""
    if group_options is None:
        return []
    try:
        return [str(g) for g in group_options(path.replace(".", "/"), groups=True) or []]
    except Exception:  # a callable without the keyword, or a path Hydra cannot list
        return []


def _options_of(group: str, group_options: Callable[[str], list[str]] | None) -> list[str]:
    """The options of config group ``group``; ``[]`` for a plain config key (not a path Hydra can list)
    or without a config loader."""
    if group_options is None:
        return []
    try:
        return list(group_options(group) or [])
    except Exception:  # not a path Hydra can list: a plain config key
        return []


def warm_start_params(space: SearchSpace, entries: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """``hydra.sweeper.enqueue_trials`` with each value cast to its param's distribution (case C33).

    Checked like the search space, before the study is opened: a warm start queued as given reached
    the task as given (``'0.5'``, a string, while the study recorded 0.5), and a value outside the
    choices failed inside Optuna, where it was reported as a storage error. Casts:

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

    Args:
        space: the search space.
        entries: the warm starts, ``{param name: value}`` each (names without ``+``).

    Returns:
        The warm starts with typed values, in order.

    Raises:
        SweeperConfigError: naming ``enqueue_trials[i]``, the param, the value, its distribution and
            expression, and the fix; for a name that is not a searched param, naming the searched ones.
    """
    from ._errors import SweeperConfigError

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
        inside = dist._contains(dist.to_internal_repr(cast))
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
            meant = Override._convert_value(_parser().parse_override(f"k={value}").value())
        except Exception:
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


def span_warnings(space: SearchSpace) -> list[str]:
    """Warnings for linear float intervals that span ``LINEAR_SPAN_WARN_DECADES`` decades or more.

    A learning rate searched linearly over ``interval(1e-5, 1e-3)`` spends 99% of its draws above
    1e-5 * 10 (case C12); ``tag(log, interval(...))`` is almost always meant.
    """
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
