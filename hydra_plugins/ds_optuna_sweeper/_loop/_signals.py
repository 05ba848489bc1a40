"""Signals during a sweep: SIGTERM (preemption) and Ctrl-C turned into exceptions that unwind the sweep."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Any, Callable

from .._errors import Preempted

log = logging.getLogger(__name__)


class SigtermGuard:
    """On rank 0, turn SIGTERM (preemption, or torchrun stopping the group) into :class:`Preempted`;
    on every rank, remember SIGINT (Ctrl-C) and raise ``KeyboardInterrupt``, so that a signal whose
    exception was swallowed still stops the sweep.

    Args:
        sigterm: handle SIGTERM (rank 0); with ``False`` SIGTERM keeps its action (other ranks).
        on_signal: called with the signal number at the first signal, before the exception: the sweep
            records it in torchrun's store (:func:`.._comm._leaving.record_leaving`, a key write of the store
            client, no Python-level lock), so peers whose waits break know the rank was interrupted (C41).

    No storage work happens in the handler: the main thread may be inside a database commit
    (SQLAlchemy's "prepared" state, then a hang, was seen). The exception unwinds the sweep instead,
    which closes the running trial on the way out; running the same command again resumes the study,
    and with ``retry_failed_trials`` the closed trial is re-queued. A second SIGTERM during that
    clean-up is ignored (torchrun sends SIGKILL 30 s after its SIGTERM anyway); a second Ctrl-C gets
    Python's own handler back. Outside the main thread (no signal handlers there) it does nothing.

    A handler's exception can be lost: Python runs it wherever the main thread is, and an exception
    raised inside a ``__del__`` or a garbage-collection callback is printed as "Exception ignored in"
    and dropped (seen at world size 1 with SQLAlchemy's ``_collection_gced``: Ctrl-C, then the sweep ran
    to its end with exit 0). :attr:`received` keeps such a signal, and the loop stops on it before it
    asks the next trial. A SIGINT that the process was started ignoring (``nohup``, ``cmd &``) stays ignored.
    """

    def __init__(self, sigterm: bool = True, on_signal: Callable[[int], None] | None = None) -> None:
        #: handle SIGTERM (rank 0); other ranks keep its default action.
        self.sigterm = sigterm
        #: called with the signal number first thing in the handler (records it in torchrun's store, C41).
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
        from .._comm._launcher import launcher_gone

        lost = " (torchrun's agent is gone: the kernel's death signal or its silent store)" if launcher_gone() else ""
        log.warning("rank 0 received SIGTERM%s: closing the running trial and exiting", lost)
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
            signal.signal(signum, previous)

