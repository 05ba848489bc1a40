"""Each rank's job log: the files a job's logging writes to, and the trial's outcome appended to them.

Hydra's ``hydra.job_logging`` is in place only while the job runs, but the trial's outcome is known once every
rank's result is agreed, after it (case C42: a failing trial's per-rank logs held one line each). So the runner
notes the job's log files while the job runs and appends the agreed outcome to them afterwards, in the job's format.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from ._agree import Verdict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobLogFile:
    """One file a job's logging wrote to: a ``logging.FileHandler``'s ``baseFilename`` and formatter."""

    path: str
    formatter: logging.Formatter | None = None


def append_line(files: list[JobLogFile], message: str, *, level: int = logging.INFO, name: str = __name__) -> None:
    """Append one log record (``message``, ``level``, logger ``name``) to each file, formatted as the job's own
    lines. Never raises: a log line is not worth a failed sweep (an error is logged at DEBUG instead)."""
    record = logging.LogRecord(name, level, __file__, 0, message, None, None)
    for f in files:
        handler = logging.FileHandler(f.path, mode="a", encoding="utf-8", delay=True)
        try:
            if f.formatter is not None:
                handler.setFormatter(f.formatter)
            handler.handle(record)
        except Exception:  # noqa: BLE001 - a removed job dir, a full disk
            log.debug("could not append to the job log %s", f.path, exc_info=True)
        finally:
            handler.close()


#: Threads whose records never go to a job's log: the study service serves other trial groups' trials.
FOREIGN_THREADS = ("ds-optuna-study-service",)
#: Global rank 0's console handler for the study service's records, in the sweep's own format.
_service_console: logging.Handler | None = None


class _OtherTrialsFilter(logging.Filter):
    """Drops records logged from :data:`FOREIGN_THREADS` (a job log holds its own trial's lines)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName not in FOREIGN_THREADS


def remember_sweep_console() -> None:
    """At the start of the sweep on global rank 0 (Hydra's ``hydra_logging`` in place): keep a console handler in
    the sweep's format for the study service's records, set beside each job's (:func:`keep_other_trials_out`)."""
    global _service_console
    for handler in logging.getLogger().handlers:
        if type(handler) is logging.StreamHandler:
            console = logging.StreamHandler(handler.stream)
            console.setFormatter(handler.formatter)
            console.setLevel(handler.level)
            console.addFilter(lambda record: record.threadName in FOREIGN_THREADS)
            _service_console = console
            return


def keep_other_trials_out() -> None:
    """Inside a job: the job's handlers drop the study service's records, which go to the console in the sweep's
    format instead. Idempotent."""
    root = logging.getLogger()
    for handler in root.handlers:
        if handler is not _service_console and not any(isinstance(f, _OtherTrialsFilter) for f in handler.filters):
            handler.addFilter(_OtherTrialsFilter())
    if _service_console is not None and _service_console not in root.handlers:
        root.addHandler(_service_console)


class TrialLogBook:
    """One rank's notes per trial number until its verdict is agreed (case C42): the job's log files, how this
    rank's task ended (``endings``), the last step it reported (``steps``)."""

    def __init__(self) -> None:
        self.files: dict[int, list[JobLogFile]] = {}
        self.endings: dict[int, str] = {}
        self.steps: dict[int, int | None] = {}

    def note_files(self, number: int) -> None:
        """Inside trial ``number``'s job: note the files the root logger's file handlers write to now."""
        known = self.files.setdefault(number, [])
        now = [JobLogFile(h.baseFilename, h.formatter) for h in logging.getLogger().handlers
               if isinstance(h, logging.FileHandler)]
        known.extend(f for f in now if f not in known)

    def log(self, verdicts: Sequence["Verdict"], *, refit: str = "") -> None:
        """Append each trial's agreed outcome (:func:`outcome_text`) to this rank's job log(s) of that trial, and
        forget the trial. ``refit``: for a refit run, what it refits (``trial n`` or ``baseline <name>``)."""
        for v in verdicts:
            files = self.files.pop(v.number, [])
            ending = self.endings.pop(v.number, None)
            step = self.steps.pop(v.number, None)
            if files:
                level = logging.ERROR if v.state.name == "FAIL" else logging.INFO
                append_line(files, outcome_text(v, ending, step, refit=refit), level=level,
                            name=__package__ + "._runner")


def outcome_text(verdict: "Verdict", ending: str | None, step: int | None, *, refit: str = "") -> str:
    """One line for a job log: the trial's agreed outcome and how this rank's task ended (case C42), e.g.
    ``trial 1 FAIL: rank 1: RuntimeError: boom (on this rank the task returned 0.5)``."""
    what = f"refit of {refit}" if refit else f"trial {verdict.number}"
    text = f"{what} {'INTERRUPTED' if verdict.preempted else verdict.state.name}"
    if verdict.values:
        text += " value " + ", ".join(f"{v:.6g}" for v in verdict.values)
    if verdict.metrics:
        text += f" metrics {dict(verdict.metrics)}"
    if verdict.state.name == "PRUNED" and step is not None:
        text += f" at step {step}"
    if verdict.error:
        text += f": {verdict.error}"
    return text + f" (on this rank the task {ending or 'did not run'})"
