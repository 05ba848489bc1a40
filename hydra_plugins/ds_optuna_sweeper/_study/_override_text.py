"""Plain values <-> the text of a Hydra override: read it with Hydra's parser, write it so Hydra reads it back.

``format_value`` writes a trial's sampled value as override text that Hydra parses back to exactly that
value (type included); :func:`parse_overrides` and :func:`read_override_value` read override text with
Hydra's own grammar (``hydra.core.override_parser``). Pure: no communication and no study.
"""

from functools import lru_cache
from typing import Any, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, Quote, QuotedString

from .._errors import SearchSpaceError
from .._upstream import escape_override_text, plain_override_value


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


def read_override_value(text: str) -> Any:
    """The plain value Hydra reads from the right side of an override (``'1'`` -> ``1``, ``'true'`` -> ``True``).

    Raises:
        SearchSpaceError: if ``text`` is not valid override value syntax.
    """
    try:
        value = _parser().parse_override(f"k={text}").value()
    except Exception as e:  # hydra.errors.OverrideParseException and friends
        raise SearchSpaceError(f"Cannot parse the override value {text!r}: {e}") from e
    return plain_override_value(value)


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
        candidates = (value, QuotedString(value, Quote.single).with_quotes(), escape_override_text(value))
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
