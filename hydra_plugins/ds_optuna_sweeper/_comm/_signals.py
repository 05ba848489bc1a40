"""Every rank: the sweeper's signal handlers, all of them (installed in the main thread only, Python's rule).

- **The sweep** (:class:`SigtermGuard`, around the whole loop): on the study owner SIGTERM (preemption, or
  torchrun stopping the group) becomes :class:`.._errors.Preempted`; on every rank SIGINT (Ctrl-C) is remembered
  and raised as ``KeyboardInterrupt``. Other ranks keep SIGTERM's default action outside a task: a Python
  handler could not run while a rank waits in gloo.
- **A trial's task** (:func:`task_window`): once the process is *preemption-aware* (its first
  ``trial.should_preempt()``, :func:`mark_aware`), SIGTERM or SIGINT only sets a flag; the next
  ``should_preempt()`` (every rank's flag, OR-ed) answers True on every rank, the task saves a checkpoint and
  returns, and the sweeper closes the trial as interrupted and re-queues it. Ctrl-C in a terminal reaches every
  rank twice, from the terminal and from torchrun's agent (``torch.distributed.elastic.agent.server.api``'s
  ``SignalException``): the flag counts it once. Before awareness, or when an aware task does not answer True
  within ``grace_s`` seconds (``hydra.sweeper.checkpoints.preempt_grace``; torchrun's SIGKILL follows its SIGTERM
  after 30 s), the signal gets the action it had when the task began. The grace is timed with ``SIGALRM``
  (``signal.setitimer``), which also wakes a ``time.sleep``. A SIGINT the flag takes never reaches Lightning's
  ``KeyboardInterrupt`` handling, so ``fit`` stops through the glue's preemption path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from typing import Any, Callable, Iterator

from .._errors import Preempted
from ._launcher import launcher_gone
from ._whoami import first_process

#: The loggers these handlers always used (users and tests filter by name).
_guard_log = logging.getLogger(__package__.rsplit(".", 1)[0] + "._loop._signals")
_task_log = logging.getLogger(__package__.rsplit(".", 1)[0] + "._task._preempt")


def signal_name(signum: int) -> str:
    """``"SIGINT (Ctrl-C)"`` or the signal's name (``"SIGTERM"``), for messages."""
    return "SIGINT (Ctrl-C)" if signum == signal.SIGINT else signal.Signals(signum).name


def restore_handler(signum: int, handler: Any) -> None:
    """Put ``handler`` back for ``signum`` (main thread only, Python's rule for ``signal.signal``); for the
    Lightning glue, which restores the handler Lightning's ``SignalConnector`` replaced during ``fit``."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signum, handler)


class SigtermGuard:
    """On rank 0, turn SIGTERM into :class:`Preempted`; on every rank, remember SIGINT (Ctrl-C) and raise
    ``KeyboardInterrupt``. Outside the main thread it does nothing.

    Args:
        sigterm: handle SIGTERM (rank 0); with ``False`` SIGTERM keeps its action (other ranks).
        on_signal: called with the signal number at the first signal, before the exception (the sweep records
            it in torchrun's store with a key write, no Python-level lock, so peers know why: C41).

    No storage work happens in the handler: the main thread may be inside a database commit (SQLAlchemy's
    "prepared" state, then a hang, was seen). A second SIGTERM during the clean-up is ignored; a second Ctrl-C
    gets Python's own handler back. An exception raised inside a ``__del__`` or a garbage-collection callback is
    dropped (seen with SQLAlchemy's ``_collection_gced``): :attr:`received` keeps the signal, and the loop stops
    on it before the next ask. A SIGINT the process was started ignoring (``nohup``) stays ignored.
    """

    def __init__(self, sigterm: bool = True, on_signal: Callable[[int], None] | None = None) -> None:
        self.sigterm = sigterm
        self.on_signal = on_signal
        self.stopping = False
        #: the first SIGTERM or SIGINT received (its number), ``None`` before one.
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.received = signum
        self._tell(signum)
        lost = " (torchrun's agent is gone: the kernel's death signal or its silent store)" if launcher_gone() else ""
        _guard_log.warning("rank 0 received SIGTERM%s: closing the running trial and exiting", lost)
        raise Preempted(128 + signum)

    def _tell(self, signum: int) -> None:
        if self.on_signal is not None:
            with contextlib.suppress(Exception):
                self.on_signal(signum)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.received is None:
            self._tell(signum)
        self.received = self.received or signum
        signal.signal(signal.SIGINT, self._previous.get(signal.SIGINT, signal.default_int_handler))
        raise KeyboardInterrupt

    def __enter__(self) -> "SigtermGuard":
        if threading.current_thread() is threading.main_thread():
            for signum, handler in ((signal.SIGTERM, self._on_sigterm), (signal.SIGINT, self._on_sigint)):
                if signum == signal.SIGTERM and not self.sigterm:
                    continue
                if signum == signal.SIGINT and signal.getsignal(signum) == signal.SIG_IGN:
                    continue  # a process started with Ctrl-C ignored (nohup, `cmd &`) keeps ignoring it
                previous = signal.signal(signum, handler)
                self._previous[signum] = previous if previous is not None else signal.SIG_DFL
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, previous in self._previous.items():
            if not (_exit_status_kept and signum == signal.SIGTERM):
                signal.signal(signum, previous)


#: :func:`keep_exit_status` was called: SIGTERM stays ignored until the process exits.
_exit_status_kept = False


def keep_exit_status() -> None:
    """Ignore SIGTERM from now until this process exits, so that it ends with the status it has decided (a
    refusal's 1, :func:`._refusal.quiet_exit`) and not by torchrun's SIGTERM, which torchrun sends to every rank
    still running once one rank exits non-zero. torchrun's SIGKILL, 30 s later (``PContext.close``), still ends
    a rank that does not exit. Main thread only (Python's rule for ``signal.signal``); elsewhere nothing changes.
    """
    global _exit_status_kept
    if threading.current_thread() is threading.main_thread():
        _exit_status_kept = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


#: The signals the task window takes: each only sets :data:`_received` in an aware task.
TASK_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: This process called ``should_preempt()`` once: SIGTERM or SIGINT during a task only sets :data:`_received`.
_aware = False
#: The first of :data:`TASK_SIGNALS` that arrived during the current task (cleared when a task begins), or None.
_received: int | None = None
#: The handlers installed before the current task, per signal (restored when it ends).
_previous: dict[int, Any] = {}
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


def received() -> int | None:
    """The signal (SIGTERM or SIGINT) that arrived on this rank during the current task, or ``None`` (this rank's
    own flag, not agreed)."""
    return _received


def _on_signal(signum: int, frame: Any) -> None:
    global _received
    if _aware:
        if _received is None:
            # torchrun sends it to every rank: the launch's first process says it (issue 38, C59)
            (_task_log.warning if first_process() else _task_log.debug)(
                "rank %s received %s: the trial saves a checkpoint and stops at its next should_preempt() "
                "check (within %g s)", os.environ.get("RANK", "0"), signal_name(signum), _grace_s)
            signal.signal(signal.SIGALRM, _on_grace_over)
            signal.setitimer(signal.ITIMER_REAL, max(_grace_s, 0.001))
            _received = signum
        return
    _as_before(signum, frame)


def _on_grace_over(signum: int, frame: Any) -> None:
    if _acknowledged or _received is None:
        return
    _task_log.warning("rank %s: the task did not stop on should_preempt() within %g s of %s "
                      "(hydra.sweeper.checkpoints.preempt_grace); it stops as a task that does not check",
                      os.environ.get("RANK", "0"), _grace_s, signal_name(_received))
    _as_before(_received, frame)


def _as_before(signum: int, frame: Any) -> None:
    """What ``signum`` did before the task window: the earlier handler (rank 0's :class:`SigtermGuard`, Python's
    ``KeyboardInterrupt``), or the default action."""
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    signal.signal(signum, signal.SIG_DFL)  # the default action, as if no handler had been installed
    os.kill(os.getpid(), signum)


@contextlib.contextmanager
def task_window(grace_s: float = 15.0) -> Iterator[None]:
    """Around one task call: SIGTERM or SIGINT sets the flag (aware process) or acts as before; ``grace_s``: seconds
    an aware task has from the signal to a True ``should_preempt()``. The flag stays readable through
    :func:`received` until the next task begins."""
    global _received, _previous, _acknowledged, _grace_s
    _received, _acknowledged, _grace_s = None, False, float(grace_s)
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _previous = {signum: signal.getsignal(signum) for signum in TASK_SIGNALS}
    alarm = signal.getsignal(signal.SIGALRM)
    for signum in TASK_SIGNALS:
        if _previous[signum] != signal.SIG_IGN:
            signal.signal(signum, _on_signal)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, alarm if alarm is not None else signal.SIG_DFL)
        for signum, previous in _previous.items():
            if not (_exit_status_kept and signum == signal.SIGTERM):
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        _previous = {}


def _reset_for_tests() -> None:
    global _aware, _received, _previous, _acknowledged, _exit_status_kept
    _aware, _received, _previous, _acknowledged, _exit_status_kept = False, None, {}, False, False
