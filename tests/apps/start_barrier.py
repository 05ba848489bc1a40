"""A start barrier for tests that run several torchrun groups (or SLURM array tasks) on one study.

Without it, a group whose start lags (5 s and more on a loaded 2-core machine) can find the study's
budget already spent by the others and run no trial, and "every group ran a trial" flakes. With
``DSO_START_BARRIER_DIR`` set, every rank process, in its *first* trial (so after its group opened the
study and asked a trial), writes ``$DSO_START_BARRIER_DIR/<host>_<pid>`` and waits until
``DSO_START_BARRIER_N`` such files exist (every rank of every group). A group's first trial therefore
cannot finish before every other group has asked its own first trial: each group runs at least one.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

_arrived = False  # this process passed the barrier (only its first trial waits)


def wait_at_start_barrier() -> None:
    """In this process's first trial, wait until every rank of every group reached its first trial.

    Environment: ``DSO_START_BARRIER_DIR`` (unset: return at once), ``DSO_START_BARRIER_N`` (int, the
    number of rank processes in all groups), ``DSO_START_BARRIER_TIMEOUT_S`` (float seconds, default 90).

    Raises:
        RuntimeError: fewer than ``N`` processes arrived within the timeout (the trial then fails,
            and the test with it, naming the barrier).
    """
    global _arrived
    directory = os.environ.get("DSO_START_BARRIER_DIR")
    if not directory or _arrived:
        return
    _arrived = True
    n = int(os.environ["DSO_START_BARRIER_N"])
    timeout_s = float(os.environ.get("DSO_START_BARRIER_TIMEOUT_S", "90"))
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{socket.gethostname()}_{os.getpid()}").write_text("")
    end = time.monotonic() + timeout_s
    while (arrived := len(list(path.iterdir()))) < n:
        if time.monotonic() > end:
            raise RuntimeError(f"start barrier: {arrived} of {n} rank processes reached their first trial "
                               f"within {timeout_s:g} s ({path})")
        time.sleep(0.1)
