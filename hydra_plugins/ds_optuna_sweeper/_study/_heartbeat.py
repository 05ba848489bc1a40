"""Optuna heartbeats of the running trials, recorded by a daemon thread on rank 0 during a trial.

On RDB storages rank 0 records a heartbeat for each running trial every ``heartbeat_interval``
seconds (Optuna's RDBStorage documentation); a trial whose heartbeat stops is closed by
:func:`._abandon.fail_stale` in whichever worker looks next.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Iterable, Optional

from .._upstream import storage_heartbeat_interval, study_storage
from ._transient import first_line

#: _storage's logger: tests and users filter by it.
log = logging.getLogger(__package__ + "._storage")


class Heartbeat:
    """Record Optuna heartbeats of the running trials ``trial_ids`` (storage ids) of ``study`` from a daemon thread
    (rank 0, during a trial). Use as a context manager; a no-op when the storage has no heartbeat."""

    def __init__(self, study: Any, trial_ids: Iterable[int]) -> None:
        self._storage: Any = study_storage(study)
        self._ids = list(trial_ids)
        self._interval = storage_heartbeat_interval(study) or None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._missed = 0  # beats missed in a row (the first of a streak is logged as a warning)

    def _beat(self) -> None:
        for trial_id in self._ids:
            try:
                self._storage.record_heartbeat(trial_id)
                self._missed = 0
            except Exception as e:  # a missed beat only risks a late stale check; the next one may pass
                self._missed += 1
                (log.warning if self._missed == 1 else log.debug)(
                    "Heartbeat of trial id %d missed (%s); the next one is due in %s s", trial_id, first_line(e),
                    self._interval)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._beat()

    def __enter__(self) -> "Heartbeat":
        if self._interval:
            self._beat()
            self._thread = threading.Thread(target=self._run, name="ds-optuna-heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
