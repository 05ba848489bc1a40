"""Plain values <-> the text of a Hydra override: read it with Hydra's parser (``hydra.core.override_parser``),
write it so Hydra reads it back. Pure: no communication and no study.
"""

import re
from functools import lru_cache
from typing import Any, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, Quote, QuotedString

from .._argv_hint import null_choice_hint
from .._errors import SearchSpaceError
from .._upstream import escape_override_text, plain_override_value


@lru_cache(maxsize=1)
def _parser() -> OverridesParser:
    return OverridesParser.create()


#: the most characters of a user's override (and of Hydra's message about it) a refusal quotes: a YAML
#: ``params`` node of 200 keys with one bad value printed a 6.6 kB one-line message (case C58).
SHOWN_CHARS = 200


def shorten(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` cut to ``limit`` characters, with ``...`` and the number of characters left out."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def parse_overrides(lines: Sequence[str], where: Sequence[str] | None = None) -> list[Override]:
    """Parse override strings with Hydra's own parser, one at a time.

    Args:
        lines: ``key=value`` override strings.
        where: for each line, where it came from (``"hydra.sweeper.params.lr"``, ``"the command line"``),
            named in the refusal; ``None``: not named.

    Raises:
        SearchSpaceError: for the first line that is not valid Hydra override syntax; the message names
            that line and its origin only, each at most :data:`SHOWN_CHARS` characters, with a fix for
            ``null`` inside ``choice(...)``, which Hydra's grammar refuses (``_argv_hint.null_choice_hint``).
    """
    parsed = []
    for i, line in enumerate(lines):
        try:
            parsed.append(_parser().parse_override(line))
        except Exception as e:  # hydra.errors.OverrideParseException and friends
            origin = f" ({where[i]})" if where is not None else ""
            reason = shorten(str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__)
            hint = null_choice_hint(line)
            raise SearchSpaceError(f"Cannot parse the sweep override '{shorten(line)}'{origin}: {reason}"
                                   + (f". {hint}" if hint else "")) from e
    return parsed


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
    """Text for the right side of an override (``"1e-05"``, ``"'a, b'"``, ``"null"``) that Hydra parses back to
    exactly ``value``: a str, int, float, bool or None (Optuna's categorical types), or a list/dict of them.

    Types and text survive: ``"1"`` stays a string, ``1`` an int, ``1.0`` a float (shortest repr that
    round-trips float64), ``None`` is ``null``, booleans are ``true``/``false``; strings with
    spaces, commas, ``=``, quotes or backslashes are escaped or quoted the way Hydra's grammar
    says, and the result is checked by parsing it back.

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
        # Hydra's grammar has no quoted dict key: a key is plain text read as a value ({2:x} has the int key 2),
        # so a str key that needs quotes cannot be written; the whole text is checked by parsing it back.
        text = "{" + ",".join(f"{format_value(k)}:{format_value(v)}" for k, v in value.items()) + "}"
        if not _parses_to(text, value):
            raise SearchSpaceError(f"Cannot write the dict {value!r} as a Hydra override value")
        return text
    if isinstance(value, str):
        # Plain text when Hydra reads it back as the same string, else a quoted string (more
        # readable than backslash escapes), else escapes.
        candidates = (value, QuotedString(value, Quote.single).with_quotes(), escape_override_text(value))
        for candidate in candidates:
            if _parses_to(candidate, value):
                return candidate
        raise SearchSpaceError(f"Cannot write the string {value!r} as a Hydra override value")
    raise TypeError(f"Cannot write a {type(value).__name__} as a Hydra override value: {value!r}")


def literal_value(text: str) -> str:
    """Override text that sets a config value to exactly ``text`` (a path): Hydra-quoted, OmegaConf-escaped.

    :func:`format_value` writes what Hydra's parser reads back; the config then resolves ``${...}``
    in it, so ``${`` is escaped first (OmegaConf's ``\\${``, with the backslashes just before it
    doubled). Used for the sweep and run dirs in rerun and resume lines and in each job's overrides (case C52;
    Hydra docs, "Override grammar", quoted values and escaping).

    Raises:
        SearchSpaceError: if no text round-trips through Hydra's parser (see :func:`format_value`).
    """
    return format_value(re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text))


def _parses_to(text: str, value: Any) -> bool:
    try:
        parsed = _parser().parse_override(f"k={text}").value()
    except Exception:
        return False
    return type(parsed) is type(value) and parsed == value


def command_line_overrides(config: Any, kind: str = "hydra") -> list[str]:
    """The run's command-line overrides of ``kind`` (``"hydra"`` or ``"task"``) as typed, interpolations kept.

    Read unresolved as Hydra does (``hydra/_internal/hydra.py`` ``multirun``): ``${hydra.job.num}`` resolves
    per job only (case C51, hydra#2247/#3427).

    Args:
        config: Hydra's master config (``hydra.overrides`` present); ``None`` gives ``[]``.
        kind: which list of ``hydra.overrides``.
    """
    from omegaconf import OmegaConf

    node = config.hydra.overrides.get(kind) if config is not None else None
    return [str(o) for o in OmegaConf.to_container(node, resolve=False)] if node is not None else []


def override_line(key: str, value: Any) -> str:
    """``key=<format_value(value)>``: one override line for a sampled param."""
    return f"{key}={format_value(value)}"
