"""Errors raised by the sweeper. One base class; each subclass says when it is raised."""

from __future__ import annotations


class DSOptunaSweeperError(Exception):
    """Base class of every error this plugin raises on purpose."""


class SearchSpaceError(DSOptunaSweeperError, ValueError):
    """Raised when a sweep expression cannot become an Optuna distribution.

    Examples: a reversed or empty ``interval``/``range``, ``step <= 0``, ``tag(log, ...)`` with a bound
    ``<= 0``, an empty ``choice``, a ``glob`` sweep, or a grid sampler over a continuous interval.
    Raised on rank 0 before any trial is asked; every rank then exits with the same message.
    """


class SweeperConfigError(DSOptunaSweeperError, ValueError):
    """Raised when the ``hydra.sweeper`` settings are invalid (bad direction, ``n_jobs > 1`` under
    torchrun, a negative ``rank_timeout``...), before any rank starts training."""


class RankTimeoutError(DSOptunaSweeperError, TimeoutError):
    """Raised when a wait between ranks on the control plane ends without an answer.

    The message names this rank, the world size, the trial, what was awaited and the timeout; the
    usual cause is a peer rank that crashed or hangs in user code.
    """


class ConfigMismatchError(DSOptunaSweeperError):
    """Raised inside a trial when the resolved task config differs between ranks.

    The message lists the differing keys. The trial is told FAIL; per-rank values (local rank,
    device) must not be part of the composed config.
    """


class TrialFailedError(DSOptunaSweeperError):
    """Raised on every rank when the sweep stops because of failed trials.

    Either the failure rate passed ``hydra.sweeper.max_failure_rate``, or a rank was interrupted
    (``SystemExit``/``KeyboardInterrupt``) during a trial.
    """


class ControlPlaneError(DSOptunaSweeperError):
    """Raised when ranks exchange different kinds of control message (they took different paths).

    This is a bug in the sweeper, reported instead of misreading the message; the sweep stops.
    """


class ProcessGroupMisuseError(DSOptunaSweeperError):
    """Raised when the task manages the default process group that the sweeper owns (case C24).

    The sweeper creates the default group before the first trial and destroys it after the last one.
    A task that calls ``torch.distributed.init_process_group`` without ``if not dist.is_initialized()``
    fails its trial with this error; a task that calls ``destroy_process_group`` stops the sweep on
    every rank at the next control call, with this error instead of a timeout.
    """


class TrainingGroupBrokenError(DSOptunaSweeperError):
    """Raised on every rank when a failed trial left the training process group unusable.

    A rank released from a training collective by the timeout breaks gloo's connections for good,
    and the default group cannot be re-created in the same processes. The trial is told FAIL and the
    processes exit non-zero so that ``torchrun --max-restarts`` restarts the group and the study
    resumes from storage.
    """


class Preempted(SystemExit):
    """Raised in rank 0's main thread when SIGTERM arrives (preemption, or torchrun stopping the
    group). Unwinds the sweep without waiting for peers, closes the running trial in storage, and
    exits with status 143 (128 + SIGTERM)."""
