"""Trial groups: a warning for a script that read torchrun's variables before the sweep rewrote them (case C58).

With ``hydra.sweeper.n_jobs`` above 1, :func:`._trial_groups.split_world` rewrites ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` ... to the trial group's values when the sweep starts, inside ``@hydra.main``. The script's module
ran before that: a ``RANK = int(os.environ["RANK"])`` at its top holds the launch's global rank (1 in trial
group 1 of 2 ranks, where the task's ``RANK`` and ``current_trial().rank`` are 0), so "rank 0 only" code never
runs in that group. Nothing the sweeper runs comes before the script's own imports, so the variables cannot be
fixed earlier; the sweeper names the stale values it finds instead. Only the standard library.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Mapping

log = logging.getLogger(__name__)

#: The rewritten variables a script typically keeps in a module global, by the global's name (any case).
WATCHED = {"RANK": "RANK", "GLOBAL_RANK": "RANK", "WORLD_SIZE": "WORLD_SIZE", "LOCAL_RANK": "LOCAL_RANK",
           "LOCAL_WORLD_SIZE": "LOCAL_WORLD_SIZE"}


def stale_globals(namespace: Mapping[str, Any], launch: Mapping[str, str | None],
                  group: Mapping[str, str]) -> dict[str, tuple[int, int]]:
    """``{global name: (its value, the trial group's value)}`` for each module global of ``namespace`` named like
    a :data:`WATCHED` variable (``RANK``, ``rank``, ``WORLD_SIZE`` ...) whose int value is the launch's and not the
    group's. ``launch``/``group``: the variables before and after the rewrite."""
    found: dict[str, tuple[int, int]] = {}
    for name, value in namespace.items():
        variable = WATCHED.get(name.upper())
        if variable is None or isinstance(value, bool) or not isinstance(value, (int, str)):
            continue
        before, after = launch.get(variable), group.get(variable)
        if before is None or after is None or before == after:
            continue
        try:
            if int(value) == int(before):
                found[name] = (int(value), int(after))
        except ValueError:
            continue
    return found


def warn_import_time_values(launch: Mapping[str, str | None], group: Mapping[str, str], where: str) -> bool:
    """Warn once when the script's module (``__main__``) holds a launch's value of a rewritten variable
    (:func:`stale_globals`); ``where`` names this process (``"trial group 1/2"``). Returns whether it warned."""
    main = sys.modules.get("__main__")
    found = stale_globals(vars(main), launch, group) if main is not None else {}
    if not found:
        return False
    names = ", ".join(f"{name}={value} (the trial group's: {now})" for name, (value, now) in sorted(found.items()))
    log.warning(
        "%s: the script read torchrun's variables before the sweep split the world into trial groups "
        "(hydra.sweeper.n_jobs), so its module globals hold the launch's values: %s. Inside the task, RANK, "
        "WORLD_SIZE and LOCAL_RANK are the trial group's: read the trial's rank as current_trial().rank (or "
        "os.environ['RANK'] inside the task), not at import time, or 'rank 0 only' code never runs in this group",
        where, names)
    return True
