"""Seconds spent per phase of each trial, for ``bench/overhead.py`` (off unless asked for)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, Iterator

#: Environment variable naming the file the timings are appended to.
TIMINGS_ENV = "DS_OPTUNA_TIMINGS"


class PhaseTimer:
    """Seconds spent per phase of each trial on this rank.

    Off unless the environment variable ``DS_OPTUNA_TIMINGS`` names a file; then every rank
    appends one JSON line per trial: ``{"rank", "world_size", "trial", "phases": {name: seconds}}``
    with phases ``ask`` and ``tell`` (rank 0), ``broadcast``, ``launch`` (Hydra's per-job config
    composition + ``run_job``, which contains ``config_check`` and ``task``) and ``gather``.
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = path if path is not None else os.environ.get(TIMINGS_ENV)
        self.phases: dict[str, float] = {}

    def start(self) -> None:
        """Forget the previous trial's phases."""
        self.phases = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the seconds spent inside the ``with`` block to phase ``name``."""
        if self.path is None:
            yield
            return
        t = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t

    def finish(self, rank: int, world_size: int, number: int) -> None:
        """Append this trial's line to the file (no-op when off)."""
        if self.path is None:
            return
        line: dict[str, Any] = {"rank": rank, "world_size": world_size, "trial": number, "phases": self.phases}
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")
