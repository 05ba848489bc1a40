"""How a rank ends when the sweep is refused or stopped by one of the package's own errors: one clean message.

A refused setting (a bad ``hydra.sweeper`` key or search space) and a sweep that rank 0 stopped (a failure rate
past ``max_failure_rate``, a failed refit) end every rank alike. Issue 38 (C59): the rank that speaks (rank 0)
logs the message once as one paragraph and writes it to torchrun's error file, so torchrun's "Root Cause" shows
it; every rank then ends with ``SystemExit(1)`` (Hydra's ``run_and_report`` reports ``Exception`` only: no
traceback). ``HYDRA_FULL_ERROR=1`` (Hydra's switch for full tracebacks) raises the typed error on every rank instead.
"""

import json
import logging
import os
import time

from .._secrets import redact
from ._signals import keep_exit_status
from ._whoami import first_process

log = logging.getLogger("hydra_plugins.ds_optuna_sweeper")

#: Seconds a rank waits after a refusal before it exits, at world size above 1: rank 0's message and torchrun's
#: error file are written before a peer's exit makes torchrun stop the launch, and the error file's timestamp is
#: the earliest, so torchrun's "Root Cause" is rank 0's.
REFUSAL_GRACE_S = 2.0


def write_torchrun_error_file(text: str, when: float) -> None:
    """Write ``text`` to torchrun's per-rank error file (``TORCHELASTIC_ERROR_FILE``; nothing without one).

    The format is torchrun's own (``torch.distributed.elastic.multiprocessing.errors.ErrorHandler
    .record_exception``): torchrun shows ``py_callstack`` as the failure's "traceback" and takes the failure with
    the smallest ``timestamp`` (seconds) as the root cause; ``when`` is the refusal's time, before the grace,
    so the rank that speaks is that root cause. An unwritable file is skipped (the log line has the message).
    """
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": text, "extraInfo": {"py_callstack": text, "timestamp": str(int(when))}}}
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        pass


def quiet_exit(world_size: int) -> SystemExit | None:
    """How a rank ends after a refusal: ``SystemExit(1)``, after :data:`REFUSAL_GRACE_S` at world size above 1;
    ``None`` with ``HYDRA_FULL_ERROR=1`` (the caller raises the typed error instead).

    At world size above 1 the rank first ignores SIGTERM (:func:`._signals.keep_exit_status`): every rank reaches
    its refusal at its own moment, torchrun SIGTERMs the others as soon as the first exits non-zero, and a rank a
    moment behind would end by the signal (-15; 143 and a ``Preempted`` on the study owner) instead of 1. Seen by
    a newcomer's launch under load; ``tests/test_signal_guard.py`` sends the SIGTERM.
    """
    if world_size > 1:
        keep_exit_status()
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return None
    if world_size > 1:
        time.sleep(REFUSAL_GRACE_S)
    return SystemExit(1)


def announce(text: str) -> None:
    """On the :func:`first_process`: log ``text`` (error level) and write it to torchrun's error file."""
    if first_process() and os.environ.get("HYDRA_FULL_ERROR") != "1":
        log.error("%s", text)
        write_torchrun_error_file(redact(text), time.time())  # the log line keeps the password, to paste


def refusal_exit(error: Exception, where: str, world_size: int) -> BaseException:
    """What every rank raises for a setting refused before trial 0, or a sweep rank 0 stopped (module docstring):
    rank 0 logs ``"<where>: <Type>: <message>"`` once (logger ``hydra_plugins.ds_optuna_sweeper``; ``where``
    e.g. ``"rank 0/2: hydra.sweeper refused"``). Returns the exception for the caller to raise
    (``raise refusal_exit(...) from None``).
    """
    announce(f"{where}: {type(error).__name__}: {error}")
    return quiet_exit(world_size) or error
