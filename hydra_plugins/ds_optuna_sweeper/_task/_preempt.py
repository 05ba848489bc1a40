"""SIGTERM inside a trial's task, on any rank: a flag the task reads through ``trial.should_preempt()``.

SLURM (``scancel``, a preemption, the time limit's warning signal), torchrun stopping its workers, and a
spot node's shutdown all send SIGTERM, and torchrun sends SIGKILL 30 s later (its ``--signals-to-handle``
default). Without a task that saves, the sweeper closes the trial and the next launch trains it from
step 0 (README, "Failures"). With one, SIGTERM during the task only sets this flag on the rank that got
it; the task's next ``trial.should_preempt()`` (a collective: every rank's flag, OR-ed) answers True on
every rank at the same call, the task saves a checkpoint and returns (or raises
:class:`~.._errors.TrialPreempted`), and the sweeper closes the trial as interrupted and re-queues it.

A process becomes *preemption-aware* at its first ``should_preempt()`` call (:func:`mark_aware`): the
task shows it handles the flag. Before that (a task that never calls it, or the first trial's task
before its first call) SIGTERM does what it did before: the handler that was installed when the task
began runs (rank 0: the sweep's :class:`.._loop._signals.SigtermGuard`, which raises ``Preempted``), or
the default action ends the process (other ranks). The same happens when an aware task does not answer
True from ``should_preempt()`` within ``grace_s`` seconds of SIGTERM (``hydra.sweeper.checkpoints.
preempt_grace``): it is stuck, or blocked where it never checks, and torchrun's SIGKILL comes 30 s after its
SIGTERM. The grace is timed with ``SIGALRM`` (``signal.setitimer``), which also wakes a ``time.sleep``.

Only the standard library; the handler is installed in the main thread only (Python's rule for
``signal.signal``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from typing import Any, Iterator

from .._refusal import first_process

log = logging.getLogger(__name__)

#: This process called ``should_preempt()`` once: SIGTERM during a task only sets :data:`_received`.
_aware = False
#: SIGTERM arrived during the current task (cleared when a task begins).
_received = False
#: The SIGTERM handler installed before the current task (restored when it ends).
_previous: Any = None
#: ``should_preempt()`` answered True after the SIGTERM (the grace's alarm then does nothing).
_acknowledged = False
#: Seconds an aware task has from SIGTERM to a True ``should_preempt()`` (set by :func:`task_window`).
_grace_s = 15.0


def mark_aware() -> None:
    """Note that the task reads the preemption flag (``should_preempt()``); see the module docstring."""
    global _aware
    _aware = True


def acknowledge() -> None:
    """``should_preempt()`` answered True: the task saves and stops; the grace's alarm is cancelled."""
    global _acknowledged
    _acknowledged = True
    if threading.current_thread() is threading.main_thread():
        signal.setitimer(signal.ITIMER_REAL, 0)


def received() -> bool:
    """Whether SIGTERM arrived on this rank during the current task (this rank's own flag, not agreed)."""
    return _received


def _on_sigterm(signum: int, frame: Any) -> None:
    global _received
    if _aware:
        if not _received:
            # torchrun sends it to every rank: the launch's first process says it (issue 38, C59: with trial
            # groups every group's rank 0 said "rank 0 received SIGTERM"); the others note it at debug level
            (log.warning if first_process() else log.debug)(
                "rank %s received SIGTERM: the trial saves a checkpoint and stops at its next should_preempt() "
                "check (within %g s)", os.environ.get("RANK", "0"), _grace_s)
            signal.signal(signal.SIGALRM, _on_grace_over)
            signal.setitimer(signal.ITIMER_REAL, max(_grace_s, 0.001))
        _received = True
        return
    _as_before(signum, frame)


def _on_grace_over(signum: int, frame: Any) -> None:
    if _acknowledged or not _received:
        return
    log.warning("rank %s: the task did not stop on should_preempt() within %g s of SIGTERM "
                "(hydra.sweeper.checkpoints.preempt_grace); it stops as a task that does not check",
                os.environ.get("RANK", "0"), _grace_s)
    _as_before(signal.SIGTERM, frame)


def _as_before(signum: int, frame: Any) -> None:
    """What SIGTERM did before the task window: the earlier handler, or the default action."""
    previous = _previous
    if callable(previous):
        previous(signum, frame)  # rank 0: the sweep's guard (raises Preempted)
        return
    if previous == signal.SIG_IGN:
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the default action, as if no handler had been installed
    os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def task_window(grace_s: float = 15.0) -> Iterator[None]:
    """Around one task call: SIGTERM sets the flag (aware process) or acts as before; the flag starts clear.

    Args:
        grace_s: seconds an aware task has from SIGTERM to a True ``should_preempt()`` (module docstring).

    The flag's value at the end stays readable through :func:`received` until the next task begins, so the
    runner can tell the sweep that this rank was asked to stop even when the task did not check again.
    """
    global _received, _previous, _acknowledged, _grace_s
    _received, _acknowledged, _grace_s = False, False, float(grace_s)
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _previous = signal.getsignal(signal.SIGTERM)
    alarm = signal.getsignal(signal.SIGALRM)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, alarm if alarm is not None else signal.SIG_DFL)
        signal.signal(signal.SIGTERM, _previous if _previous is not None else signal.SIG_DFL)
        _previous = None


def _reset_for_tests() -> None:
    global _aware, _received, _previous, _acknowledged
    _aware, _received, _previous, _acknowledged = False, False, None, False
