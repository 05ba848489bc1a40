"""Each rank's job log: the files a job's logging writes to, and the trial's outcome appended to them.

Hydra configures ``hydra.job_logging`` when a job starts (its file handler writes
``<job dir>/<job name>.log``; the sweeper names it ``<job name>_rank<R>.log`` above world size 1) and
puts ``hydra.hydra_logging`` back when the launcher returns. So whatever the task logs lands in the
job's log, but the trial's outcome, known only once every rank's result is gathered and agreed, would
go to the console alone (case C42: a failing trial's per-rank logs held one line each). The runner
notes the job's log files while the job runs (:func:`job_log_files`) and appends the agreed outcome to
them afterwards (:func:`append_line`), in the job's own format.
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
    """One file a job's logging wrote to.

    Attributes:
        path: the file's absolute path (a ``logging.FileHandler``'s ``baseFilename``).
        formatter: the handler's formatter (``None``: logging's default ``%(message)s``).
    """

    path: str
    formatter: logging.Formatter | None = None


def job_log_files() -> list[JobLogFile]:
    """The files the root logger's handlers write to now (inside a job: the job's log), in order.

    Only ``logging.FileHandler`` and its subclasses (rotating handlers included) count; a job logging
    config without a file handler gives an empty list.
    """
    return [JobLogFile(h.baseFilename, h.formatter) for h in logging.getLogger().handlers
            if isinstance(h, logging.FileHandler)]


def append_line(files: list[JobLogFile], message: str, *, level: int = logging.INFO, name: str = __name__) -> None:
    """Append one log record with ``message`` to each file, formatted as the job's own lines.

    Opens and closes each file (append mode); never raises: a log line is not worth a failed sweep
    (a removed job dir, a full disk), so an error is logged at DEBUG on the console instead.

    Args:
        files: from :func:`job_log_files`, taken while the job ran.
        message: the text; may span lines (a traceback).
        level: the record's level (``logging.ERROR`` for a failed trial).
        name: the record's logger name, shown by formats with ``%(name)s``.
    """
    record = logging.LogRecord(name, level, __file__, 0, message, None, None)
    for f in files:
        handler = logging.FileHandler(f.path, mode="a", encoding="utf-8", delay=True)
        try:
            if f.formatter is not None:
                handler.setFormatter(f.formatter)
            handler.handle(record)
        except Exception:  # noqa: BLE001 - see the docstring
            log.debug("could not append to the job log %s", f.path, exc_info=True)
        finally:
            handler.close()


#: Threads whose records never go to a job's log: the study service serves *other* trial groups' trials
#: (``_study_service.StudyService``); its lines go to the console in the sweep's own format.
FOREIGN_THREADS = ("ds-optuna-study-service",)
#: Global rank 0's console handler for the study service's records while a job's logging is in place, in the
#: format of the sweep's own lines (``hydra.hydra_logging``); set by :func:`remember_sweep_console`.
_service_console: logging.Handler | None = None


class _OtherTrialsFilter(logging.Filter):
    """Drops records logged from :data:`FOREIGN_THREADS` (a job log holds its own trial's lines, case C42)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName not in FOREIGN_THREADS


def remember_sweep_console() -> None:
    """At the start of the sweep on global rank 0 (Hydra's ``hydra_logging`` in place): keep a console handler
    in the sweep's format for the study service's records, which :func:`keep_other_trials_out` puts in place
    beside each job's logging (the service logs while rank 0's own job runs)."""
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
    """Inside a job: the job's handlers (Hydra made them for this job) drop the study service's records about
    other groups' trials, which go to the console in the sweep's format instead. Idempotent; nothing but the
    filters on ranks without a study service."""
    root = logging.getLogger()
    for handler in root.handlers:
        if handler is not _service_console and not any(isinstance(f, _OtherTrialsFilter) for f in handler.filters):
            handler.addFilter(_OtherTrialsFilter())
    if _service_console is not None and _service_console not in root.handlers:
        root.addHandler(_service_console)


class TrialLogBook:
    """One rank's notes per trial number until its verdict is agreed (case C42): the job's log files
    (:func:`job_log_files`), how this rank's task ended (``endings``), the last step it reported (``steps``)."""

    def __init__(self) -> None:
        self.files: dict[int, list[JobLogFile]] = {}
        self.endings: dict[int, str] = {}
        self.steps: dict[int, int | None] = {}

    def note_files(self, number: int) -> None:
        """Inside trial ``number``'s job: note the files its logging writes to now."""
        known = self.files.setdefault(number, [])
        known.extend(f for f in job_log_files() if f not in known)

    def log(self, verdicts: Sequence["Verdict"], *, refit: str = "") -> None:
        """Append each trial's agreed outcome to this rank's job log(s) of that trial, and forget the trial.

        Called on every rank after the verdicts are agreed (no communication). The line says the state
        (COMPLETE with the value, PRUNED at the step, FAIL with the failing ranks' errors) and how this
        rank's own task ended; a failure's traceback is already in the log of the rank that raised it.

        Args:
            verdicts: the round's verdicts (equal on every rank).
            refit: for a refit run, what it refits (``trial n`` or ``baseline <name>``; the line says "refit of ...").
        """
        for v in verdicts:
            files = self.files.pop(v.number, [])
            ending = self.endings.pop(v.number, None)
            step = self.steps.pop(v.number, None)
            if files:
                level = logging.ERROR if v.state.name == "FAIL" else logging.INFO
                append_line(files, outcome_text(v, ending, step, refit=refit), level=level,
                            name=__package__ + "._runner")


def outcome_text(verdict: "Verdict", ending: str | None, step: int | None, *, refit: str = "") -> str:
    """One line for a job log: the trial's agreed outcome and how this rank's task ended (case C42).

    E.g. ``trial 1 FAIL: rank 1: RuntimeError: boom (on this rank the task returned 0.5)``.
    """
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
