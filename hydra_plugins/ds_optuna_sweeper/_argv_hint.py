"""Hints for sweep expressions that Hydra's parser refuses before any sweeper exists: one the shell split into
several arguments (case C59: ``lr=interval(1e-3, 3e-1)`` unquoted reaches Hydra as ``lr=interval(1e-3,`` and
``3e-1)``, and Hydra says only "no viable alternative at input"), and ``null`` inside ``choice(...)`` (case C58).

Printed from the search path plugin (:class:`..config.DSOptunaSearchPathPlugin`), which Hydra calls before it
parses the overrides. Standard library only: that module is imported by every Hydra app.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from typing import Sequence

_shown = False
#: Seconds a rank other than 0 waits before Hydra refuses its arguments, so that rank 0 prints the hint before
#: torchrun stops the launch at the first exit (as ``_comm._refusal.REFUSAL_GRACE_S``).
PEER_DELAY_S = 2.0


def _open_brackets(text: str) -> int:
    """Opening minus closing brackets (``()[]{}``) outside quotes (Hydra's quoted strings, ``\\`` escapes)."""
    depth, quote, escaped = 0, None, False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif quote is not None:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
    return depth


def split_overrides(argv: Sequence[str]) -> list[tuple[list[str], str]]:
    """Runs of the program's arguments (``sys.argv[1:]``) that only together make one override: ``[(pieces,
    joined with spaces), ...]``. A run starts at a ``key=value`` argument with more opening than closing brackets
    and ends at the first following argument that balances them; a run that never balances is not reported.
    """
    found, i = [], 0
    while i < len(argv):
        arg, j = argv[i], i + 1
        if "=" in arg and not arg.startswith("-") and _open_brackets(arg) > 0:
            joined = arg
            while j < len(argv) and _open_brackets(joined) > 0:
                joined, j = f"{joined} {argv[j]}", j + 1
            if _open_brackets(joined) == 0:
                found.append((list(argv[i:j]), joined))
                i = j
                continue
        i += 1
    return found


def split_hint(argv: Sequence[str]) -> str | None:
    """The hint for :func:`split_overrides`' runs (``None`` when there is none): each run and its quoted form."""
    runs = split_overrides(argv)
    if not runs:
        return None
    lines = [f"  got {len(pieces)} arguments {' '.join(repr(p) for p in pieces)}; write {shlex.quote(joined)}"
             for pieces, joined in runs]
    return ("ds_optuna: the shell split a sweep expression at a space into several arguments, which Hydra "
            "refuses; quote each whole override:\n" + "\n".join(lines))


def null_choice_hint(line: str) -> str | None:
    """The fix when ``line`` puts ``null`` inside ``choice(...)`` (Hydra's grammar refuses it, case C58).

    ``key=choice(a,null)`` becomes ``key=a,null``: Hydra's simple choice form builds the sweep without
    the typed ``choice`` function and keeps ``None``. ``None`` when ``line`` has no such null.
    """
    key, _, value = line.partition("=")
    unquoted = re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", "''", value)  # a quoted 'null' is a string
    if not re.search(r"choice\(([^()]*[(,])?\s*null\s*[,)]", unquoted):
        return None
    simple = re.fullmatch(r"\s*choice\(([^()]*)\)\s*", value)
    fix = f"write '{key}={simple.group(1)}' (Hydra's simple choice form, which keeps null)" if simple else (
        "write the choice in Hydra's simple form a,b,null")
    return f"Hydra's choice(...) does not take null; {fix}"


def argv_hint(argv: Sequence[str]) -> str | None:
    """Every hint for ``argv`` (:func:`split_hint`, then :func:`null_choice_hint` per override), or ``None``."""
    hints = [split_hint(argv)]
    for arg in [*argv, *(joined for _, joined in split_overrides(argv))]:
        found = null_choice_hint(arg)
        if found:
            hints.append(f"ds_optuna: '{arg if len(arg) <= 200 else arg[:200] + '...'}': {found}")
    return "\n".join(h for h in hints if h) or None


def print_argv_hint() -> None:
    """Print :func:`argv_hint` for ``sys.argv`` to stderr, once per process and on rank 0 only (torchrun); where
    there is one, every other rank first waits :data:`PEER_DELAY_S` seconds."""
    global _shown
    if _shown:
        return
    _shown = True
    hint = argv_hint(sys.argv[1:])
    if not hint:
        return
    if os.environ.get("RANK", "0") != "0":
        time.sleep(PEER_DELAY_S)
        return
    print(hint, file=sys.stderr, flush=True)
