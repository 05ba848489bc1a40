"""Every rank: a worker that loses its torchrun agent stops its sweep, as torchrun stopping the group would (C55).

torchrun starts each worker in a session of its own (``start_new_session=True`` in torch's ``SubprocessHandler``),
so ``kill -9`` of the torchrun process reaches no worker: they would finish the sweep in the background, unchecked,
while the shell invited a second launch on the same study (pytorch/pytorch#150916). Two ways a worker learns it:

- **Its parent dies**: at the start of the sweep the worker asks the kernel for SIGTERM when its parent dies
  (``prctl(PR_SET_PDEATHSIG, SIGTERM)``, Linux; prctl(2): the signal comes when the *thread* that forked the
  worker ends, here the agent's main thread). A parent already gone (the worker was re-parented) is the same
  loss: SIGTERM at once. A death signal set already (by a launcher wrapper) is kept.
- **torchrun's store stops answering** (a worker started through a wrapper, or the agent of another node): the
  main thread's next store call fails (:mod:`._arrivals`, :mod:`._launch_end`); :func:`stop_if_lost` confirms it
  with a fresh connection (:func:`store_is_gone`) and sends this process SIGTERM. A task that makes no trial call
  is stopped at the end of its trial.

SIGTERM then does what torchrun's own SIGTERM does (docs/reference/failures.md). Once the search and the refit are
over the death signal is cleared (:func:`stop_watching`), so rank 0 finishes writing the results even if the agent
dies meanwhile. Imports nothing of the package.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys

#: Users filter the loss line by this logger name.
log = logging.getLogger("hydra_plugins.ds_optuna_sweeper._loop._launcher")

#: Linux ``prctl`` options (``<linux/prctl.h>``).
_PR_SET_PDEATHSIG = 1
_PR_GET_PDEATHSIG = 2
#: Seconds the fresh connection of :func:`store_is_gone` may take.
PROBE_TIMEOUT_S = 2.0

#: The parent pid seen when :func:`die_with_launcher` set the death signal (``None``: not set by us).
_watched_parent: int | None = None
#: Set by :func:`stop_for_lost_launcher`: the loss is known, no store call is worth trying.
_lost = False
#: torchrun's store address (``MASTER_ADDR``, ``MASTER_PORT``) when the sweep started, before trial groups
#: point those variables at a group's own store (served by a worker, not by the agent).
_agent_address: tuple[str, int] | None = None


def _prctl(option: int, arg: object) -> int:
    return int(ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0))


def _death_signal() -> int:
    """The death signal currently set for this process (0: none)."""
    value = ctypes.c_int(0)
    _prctl(_PR_GET_PDEATHSIG, ctypes.byref(value))
    return int(value.value)


def under_torchrun() -> bool:
    """True when this process is a torchrun worker (``TORCHELASTIC_RUN_ID`` is set by torchrun's agent)."""
    return bool(os.environ.get("TORCHELASTIC_RUN_ID"))


def die_with_launcher() -> bool:
    """Ask for SIGTERM when this worker's parent (torchrun's agent) dies; SIGTERM at once if it is gone. Does
    nothing outside torchrun, off Linux, or when a death signal is set already. True when this call set it;
    never raises."""
    global _watched_parent, _agent_address
    if not under_torchrun():
        return False
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT", "").isdigit():
        _agent_address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    if not sys.platform.startswith("linux"):
        return False
    try:
        if _death_signal() != 0:
            return False
        if _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM)) != 0:
            return False
    except (OSError, AttributeError):  # no libc prctl: the store check alone
        log.debug("prctl(PR_SET_PDEATHSIG) is not available", exc_info=True)
        return False
    _watched_parent = os.getppid()
    if _watched_parent == 1:  # re-parented to init: the agent died before the death signal was set
        stop_for_lost_launcher("its parent, torchrun's agent, was gone when the sweep started")
    return True


def stop_watching() -> None:
    """Clear the death signal :func:`die_with_launcher` set and forget the store address (the search is over:
    nothing is left to stop); never raises."""
    global _watched_parent, _agent_address
    _agent_address = None
    if _watched_parent is None:
        return
    _watched_parent = None
    with contextlib.suppress(OSError, AttributeError):
        _prctl(_PR_SET_PDEATHSIG, 0)


def launcher_gone() -> bool:
    """True when this worker lost torchrun's agent: the parent seen by :func:`die_with_launcher` is no longer
    its parent, or :func:`stop_for_lost_launcher` ran. Store calls are skipped then (each would fail and
    print torch's ``Broken pipe`` stack)."""
    if _lost:
        return True
    return _watched_parent is not None and (os.getppid() != _watched_parent or _is_dead(_watched_parent))


def _is_dead(pid: int) -> bool:
    """True when process ``pid`` is gone or exiting: ``/proc/<pid>/stat`` is missing or its main thread is a
    zombie. The death signal comes when the agent's main thread (the one that forked the workers) exits,
    while the agent's other threads may still be ending, so ``getppid()`` can still name the agent then."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X", "x")


def store_is_gone() -> bool:
    """True when nothing accepts a TCP connection at torchrun's store (``MASTER_ADDR:MASTER_PORT`` as the sweep
    started, :func:`die_with_launcher`) within :data:`PROBE_TIMEOUT_S` seconds, i.e. the agent that hosts it
    is gone. A plain socket, not a store client: torch's client retries for its whole timeout and logs each
    try. Outside torchrun, or with no address known, False; never raises."""
    import socket

    if not under_torchrun() or _agent_address is None:
        return False
    try:
        with socket.create_connection(_agent_address, timeout=PROBE_TIMEOUT_S):
            return False
    except OSError:  # refused, reset, unreachable or timed out
        return True


def stop_for_lost_launcher(why: str) -> None:
    """Log why, then send this process SIGTERM: the sweep stops as on torchrun's own SIGTERM (module docstring)."""
    global _lost
    _lost = True
    rank = os.environ.get("RANK", "0")
    log.error("rank %s lost its launcher (%s): stopping the sweep as on torchrun's SIGTERM", rank, why)
    os.kill(os.getpid(), signal.SIGTERM)


def stop_if_lost(why: str = "torchrun's store does not answer: its agent is gone, or the link to its host is down",
                 ) -> bool:
    """After a call of torchrun's store failed in the main thread: when the agent is gone (:func:`launcher_gone`,
    or nothing accepts a connection at its store, :func:`store_is_gone`), stop the sweep as on torchrun's SIGTERM
    (:func:`stop_for_lost_launcher`) and return True; else False (the store merely failed once). Never raises."""
    if _lost:
        return True
    if launcher_gone() or store_is_gone():
        stop_for_lost_launcher(why)
        return True
    return False
