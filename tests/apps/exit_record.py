"""Each rank's own exit status, observed rather than predicted: the one copy every test app uses.

With ``DSO_EXIT_DIR`` set, :func:`run_recorded` forks. The child runs the app (``main()``, then the
interpreter's own exit: ``atexit`` handlers, teardown, an abort in it). The parent (the process
torchrun started) only waits for it, appends what ``waitpid`` reports to
``$DSO_EXIT_DIR/exit_rank<R>.jsonl`` and ends the same way, so torchrun sees the same status::

    {"rank": 1, "restart": 0, "status": -9, "signal": "SIGKILL", "pid": 4242}

``status`` is :func:`os.waitstatus_to_exitcode`'s value (Popen's and torchrun's convention): the exit
code, or minus the signal number for a process killed by a signal (``-6`` for an abort at interpreter
exit, ``-9`` for ``kill -9``, ``-15`` for torchrun's SIGTERM when the app does not handle it);
``restart`` is torchrun's ``TORCHELASTIC_RESTART_COUNT``. One line per rank process, in start order.

Signals reach the child directly: torchrun signals each rank's whole process group (``os.killpg``) and
``tests/torchrun_utils.kill_tree`` kills every process that carries the run's tag, so the parent ignores
SIGTERM, SIGINT and SIGHUP while it waits (the child decides what they do) and forwards nothing. The
child dies with the parent (``PR_SET_PDEATHSIG``), so a parent killed with ``kill -9`` leaves no orphan.
A parent killed by SIGKILL before its child ended writes no line.

torchrun stops the surviving ranks as soon as one rank exits non-zero, so with ``DSO_EXIT_LINGER_S``
the parent of a child that ended non-zero waits up to that many seconds *after* writing its line: the other
ranks' own exits are then recorded too instead of being cut short. The wait ends as soon as every rank of
the world (``WORLD_SIZE``) has a line for this torchrun attempt, since nothing is left to record then; a
rank whose line never comes (its parent was SIGKILLed) keeps the others waiting the whole linger.

Without ``DSO_EXIT_DIR`` :func:`run_recorded` just calls ``main()`` (SLURM and the other runs).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable

#: Linux ``prctl`` option: the signal the kernel sends this process when its parent dies.
_PR_SET_PDEATHSIG = 1
#: Signals the waiting parent ignores; the child, in the same process group, receives them itself.
_PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def run_recorded(main: Callable[[], Any]) -> None:
    """Run ``main`` (a ``@hydra.main`` entry point) and record how this rank's process really ended.

    Call it as the script's last statement: ``if __name__ == "__main__": run_recorded(main)``. In the
    child (and without ``DSO_EXIT_DIR``) it calls ``main()`` and returns or raises what ``main`` does,
    so the interpreter ends the child as it would end the script. In the parent it never returns: the
    parent exits with the child's status, or kills itself with the child's signal.

    Raises:
        OSError: if ``fork`` fails or the exit file cannot be written (parent).
    """
    where = os.environ.get("DSO_EXIT_DIR")
    if not where:
        main()
        return
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        _die_with(parent)
        main()
        return
    for sig in _PASSED_ON:
        signal.signal(sig, signal.SIG_IGN)
    _, wait_status = os.waitpid(pid, 0)
    status = os.waitstatus_to_exitcode(wait_status)
    for sig in _PASSED_ON:
        signal.signal(sig, signal.SIG_DFL)  # a SIGTERM from torchrun during the linger ends us
    _append_line(Path(where), pid, status)
    if status != 0:
        _linger(Path(where), float(os.environ.get("DSO_EXIT_LINGER_S", "0")))
    if status < 0:
        try:
            signal.signal(-status, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL and SIGSTOP have no handler to reset (EINVAL)
            pass
        os.kill(os.getpid(), -status)
        time.sleep(5)  # the signal is delivered before this returns; this only guards against a blocked one
        os._exit(128 - status)
    os._exit(status)


def _die_with(parent: int) -> None:
    """In the child: get SIGKILL when ``parent`` dies, and end now if it already has (Linux only)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


def _append_line(where: Path, pid: int, status: int) -> None:
    """Append this rank's line (see the module docstring) to ``where/exit_rank<RANK>.jsonl``."""
    rank = int(os.environ.get("RANK", "0"))
    line = {
        "rank": rank,
        "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "status": status,
        "signal": _signal_name(-status) if status < 0 else None,
        "pid": pid,
    }
    where.mkdir(parents=True, exist_ok=True)
    with open(where / f"exit_rank{rank}.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


def _linger(where: Path, seconds: float) -> None:
    """Wait up to ``seconds`` for every rank of the world to have a line of this attempt in ``where``."""
    end = time.monotonic() + seconds
    world = int(os.environ.get("WORLD_SIZE", "1"))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    while time.monotonic() < end and not all(_has_line(where, rank, restart) for rank in range(world)):
        time.sleep(0.05)


def _has_line(where: Path, rank: int, restart: int) -> bool:
    """Whether ``where/exit_rank<rank>.jsonl`` holds a line of torchrun attempt ``restart``."""
    try:
        text = (where / f"exit_rank{rank}.jsonl").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        try:
            if json.loads(line)["restart"] == restart:
                return True
        except (ValueError, KeyError):  # a line being written
            continue
    return False


def _signal_name(number: int) -> str:
    """``"SIGKILL"`` for 9; ``"signal <n>"`` for a number :class:`signal.Signals` does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
