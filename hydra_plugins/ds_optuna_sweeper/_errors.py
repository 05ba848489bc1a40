"""Errors raised by the sweeper. One base class; each subclass says when it is raised."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn


class DSOptunaSweeperError(Exception):
    """Base class of every error this plugin raises on purpose."""


class SearchSpaceError(DSOptunaSweeperError, ValueError):
    """Raised on rank 0, before any trial is asked, when a sweep expression cannot become an Optuna distribution:
    a reversed or empty ``interval``/``range``, ``step <= 0``, ``tag(log, ...)`` with a bound ``<= 0``, an empty
    ``choice``, a ``glob`` sweep, or a grid sampler over a continuous interval."""


class SweeperConfigError(DSOptunaSweeperError, ValueError):
    """Raised when the ``hydra.sweeper`` settings are invalid (bad direction, ``n_jobs > 1`` under
    torchrun, a negative ``rank_timeout``...), before any rank starts training."""


class RankTimeoutError(DSOptunaSweeperError, TimeoutError):
    """Raised when a wait between ranks on the control plane ends without an answer (usually a peer rank that
    crashed or hangs in user code); the message names this rank, the trial, what was awaited and the timeout."""


class ConfigMismatchError(DSOptunaSweeperError):
    """Raised inside a trial when the resolved task config differs between ranks (the message lists the keys;
    per-rank values such as the device must not be in the composed config). The trial is told FAIL."""


class TrialFailedError(DSOptunaSweeperError):
    """Raised on every rank when the sweep stops because of failed trials: the failure rate passed
    ``hydra.sweeper.max_failure_rate``, or a rank was interrupted (``SystemExit``/``KeyboardInterrupt``)."""


class ControlPlaneError(DSOptunaSweeperError):
    """Raised when ranks exchange different kinds of control message (they took different paths): a bug in the
    sweeper, reported instead of misreading the message; the sweep stops."""


class ProcessGroupMisuseError(DSOptunaSweeperError):
    """Raised when the task manages the default process group that the sweeper owns from the first trial to the
    last (case C24): ``init_process_group`` without ``if not dist.is_initialized()`` fails the trial;
    ``destroy_process_group`` stops the sweep on every rank at the next control call, instead of a timeout."""


class TrainingGroupBrokenError(DSOptunaSweeperError):
    """Raised on every rank when a failed trial left the training process group unusable (a collective ended by
    its timeout breaks gloo's connections, and the group cannot be re-created in the same processes). The trial
    is told FAIL; the processes exit non-zero so that ``torchrun --max-restarts`` restarts the group."""


class StorageUnavailableError(DSOptunaSweeperError):
    """Raised on rank 0 when the study's storage kept failing with transient errors (a dropped
    connection, a database restarting, SQLite's "database is locked") for longer than
    ``hydra.sweeper.storage_retry_timeout`` (case C35, optuna/optuna#5600). The sweep stops on every rank;
    nothing stored is lost.

    Attributes:
        storage: the storage URL with its password hidden.
        waited_s: seconds from the first failure of the outage to giving up.
        attempts: calls made during the outage.
        last_error: the last error's type and first line.
        resume: the resume command the message ends with, or ``None``.
    """

    def __init__(self, storage: str, waited_s: float = 0.0, attempts: int = 0, last_error: str = "",
                 resume: str | None = None) -> None:
        self.storage, self.waited_s, self.attempts, self.last_error = storage, waited_s, attempts, last_error
        self.resume = resume
        text = (f"the Optuna storage {storage!r} kept failing for {waited_s:.1f} s ({attempts} attempt(s) on fresh "
                f"connections, hydra.sweeper.storage_retry_timeout); last error: {last_error}")
        if resume:
            text += f". Nothing stored is lost. Once the storage answers again, resume the study with:\n{resume}"
        super().__init__(text)

    def with_resume(self, resume: str) -> "StorageUnavailableError":
        """The same error whose message ends with ``resume`` (a command line) on its own line."""
        return StorageUnavailableError(self.storage, self.waited_s, self.attempts, self.last_error, resume)

    def __reduce__(self) -> tuple:  # RankTrial sends rank 0's error to every rank
        return (StorageUnavailableError, (self.storage, self.waited_s, self.attempts, self.last_error, self.resume))


class CallMismatchError(DSOptunaSweeperError):
    """Raised inside a trial when the ranks did not make the same rank-consistent call (case C34): ``report``,
    ``should_prune``, ``suggest_*`` and ``set_user_attr`` of :class:`RankTrial` are collectives every rank makes
    in the same order, and another rank is at a different call, its task ended without making it, or it did not
    reach it within ``rank_timeout`` (optuna/optuna#1417: a metric logged on rank 0 only). The trial fails.

    Attributes:
        rank: the rank that did not make the call (or made another one).
        call: the call, e.g. ``"report(step=3)"``.
        trial: the trial number.
    """

    def __init__(self, message: str, *, rank: int = -1, call: str = "", trial: int = -1) -> None:
        super().__init__(message)
        self.rank, self.call, self.trial = rank, call, trial


class Interrupted(SystemExit):
    """Raised on every rank when the sweep stops because a rank received SIGINT (Ctrl-C) or SIGTERM
    (case C41): on the rank that received it, and on a rank that learned it from a peer's record in
    torchrun's store (:func:`._comm._launch_end.launch_end`). The running trial is closed FAIL (or re-queued with
    ``retry_failed_trials``); the process exits with ``code`` = 128 + the signal number (130 for SIGINT,
    143 for SIGTERM), as a shell reports a process ended by that signal."""


class Preempted(SystemExit):
    """Raised in rank 0's main thread when SIGTERM arrives (preemption, or torchrun stopping the group): unwinds
    the sweep without waiting for peers, closes the running trial, and exits 143 (128 + SIGTERM). Also raised on
    every rank at once (:attr:`agreed` True) after a round in which SIGTERM reached a rank during the task."""

    agreed = False


class TrialPreempted(DSOptunaSweeperError):
    """Raised by a task (or the training glue, after it saved a checkpoint) on every rank once
    ``trial.should_preempt()`` answered True; returning from the task then does the same. The sweeper closes the
    trial as interrupted (stored FAIL with the user attribute ``ds_optuna:interrupted``; not a failure for
    ``max_failure_rate``), re-queues it with its params, pruning history and checkpoint directory, and the
    launch exits 143 (130 after Ctrl-C)."""


class PeerLostError(RankTimeoutError):
    """Raised on every surviving rank when a peer rank is gone (its process ended, or torchrun's store
    says it left) while this rank waited for it on the control plane (case C45). A wait that merely ran past
    ``rank_timeout`` with every peer still alive stays a plain :class:`RankTimeoutError`."""


class SweepStoppedError(TrialFailedError):
    """Raised on every rank when rank 0 stops the sweep because of an error outside any trial: the
    sampler raised in ``study.ask``, or ``study.tell`` failed. The message is rank 0's error (type and text).
    A :class:`TrialFailedError`, as every stop of a failed sweep."""


class GlueConfigError(DSOptunaSweeperError, ValueError):
    """Raised by the training glue (``_hf.py``, ``_lightning.py``) when its arguments or the trainer's
    settings cannot work with the sweep (e.g. a metric the trainer never reports); ``except ValueError`` catches it."""


@dataclass(frozen=True)
class RemoteError:
    """An error raised on one rank, as a plain value that another rank can receive and raise again
    (:meth:`from_exception`, then :meth:`raise_here`). Pickles as three plain fields, so no class needs to be
    importable on the peer; attributes other than the message (``CallMismatchError.rank``...) do not cross.

    Attributes:
        type_name: the class name of the original exception, e.g. ``"SweeperConfigError"``.
        message: ``str(exc)`` of the original exception.
        rank: the global rank that raised it.
    """

    type_name: str
    message: str
    rank: int

    @classmethod
    def from_exception(cls, exc: BaseException, rank: int) -> "RemoteError":
        """The value for ``exc`` raised on ``rank`` (int, global rank)."""
        return cls(type(exc).__name__, str(exc), int(rank))

    def to_exception(self, *, wide: bool = False) -> BaseException:
        """The exception to raise on this rank: the package class named ``type_name`` built from ``message``,
        else :class:`DSOptunaSweeperError` with ``"<type_name>: <message>"``. ``wide=True`` (a task's trial
        calls, where Optuna raises): also a built-in or ``optuna.exceptions`` type (``ValueError``,
        ``TrialPruned``...) rebuilt from the message; a ``SystemExit`` keeps its exit code."""
        if wide:
            rebuilt = self._wide()
            if rebuilt is not None:
                return rebuilt
        cls = globals().get(self.type_name)
        if isinstance(cls, type) and issubclass(cls, DSOptunaSweeperError):
            try:
                exc = cls(self.message)
                if str(exc) == self.message:
                    return exc
            except TypeError:
                pass
            exc = cls.__new__(cls)  # a constructor that builds its own text: same type and text, no attributes
            Exception.__init__(exc, self.message)
            return exc
        return DSOptunaSweeperError(str(self))

    def _wide(self) -> BaseException | None:
        """A built-in, ``optuna.exceptions`` or ``SystemExit`` type rebuilt (see :meth:`to_exception`), or ``None``."""
        import builtins

        name, message = self.type_name, self.message
        cls = globals().get(name) or getattr(builtins, name, None)
        if cls is None:
            import optuna.exceptions

            cls = getattr(optuna.exceptions, name, None)
        if not (isinstance(cls, type) and issubclass(cls, BaseException)) or issubclass(cls, DSOptunaSweeperError):
            return None
        if issubclass(cls, SystemExit):  # str(SystemExit(130)) is "130": give the exit code back as an int
            return cls(int(message) if message.lstrip("-").isdigit() else (message or None))
        try:
            return cls(message)
        except Exception:  # a constructor that needs more than a message (UnicodeDecodeError...)
            return None

    def __str__(self) -> str:
        """``"TypeName: message"``, as a log line or a trial's error names it."""
        return f"{self.type_name}: {self.message}"

    def raise_here(self) -> NoReturn:
        raise self.to_exception()


class GlueUsageError(DSOptunaSweeperError, RuntimeError):
    """Raised by the training glue when the task uses it in a way it does not support, e.g. a second
    Trainer tracked by one trial scope (one trial, one Trainer); ``except RuntimeError`` catches it."""


class UpstreamChangedError(DSOptunaSweeperError, RuntimeError):
    """Raised by the training glue when a library internal it relies on (DeepSpeed's ZeRO-3 holders,
    accelerate's lists of prepared objects) is not where it was checked; the message names what moved.
    ``except RuntimeError`` catches it. The sentinel tests in ``tests/test_transformers_unit.py`` fail with it
    when an upstream release moves such an internal."""


class MissingExtraError(DSOptunaSweeperError, ImportError):
    """Raised when a feature needs an optional dependency that is not installed (the ``hf`` or
    ``lightning`` extra, or DeepSpeed for a config with a ``deepspeed`` section); the message names the
    ``pip install`` line. ``except ImportError`` catches it."""


class MetricNotLoggedError(DSOptunaSweeperError, KeyError):
    """Raised by a pruning callback, on every rank, when the metric it reports was not logged by the
    trainer; the message lists the metrics that were logged. ``except KeyError`` catches it (``str()`` quotes
    the message, as for any ``KeyError``)."""
