"""Every rank: how a sweep ends, what each rank raises and says (the loop itself is in ``_sweep.py``).

The one exit policy (issue 40): a failure every rank sees is agreed and the sweep goes on in the same processes;
a failure some ranks cannot agree on (a rank's task raised while a peer sits in a training collective) ends the
launch from the failing rank (:func:`end_the_launch`), and torchrun stops the others and restarts the group
under ``--max-restarts``. :func:`ending_of` turns what unwound the loop into an :class:`Ending`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
from typing import Any, NoReturn, Sequence

from .._errors import (DSOptunaSweeperError, Interrupted, Preempted, RemoteError, StorageUnavailableError,
                       TrainingGroupBrokenError, TrialFailedError)
from .._study._command import resume_advice, resume_command
from .._comm._arrivals import ranks_on_hosts
from .._comm._launch_end import FINISHED, LaunchEnd, launch_end, record_end
from .._comm._refusal import quiet_exit, write_torchrun_error_file
from .._comm._whoami import first_process
from ._agree import Outcome, RankOutcome
from ._messages import Command, CommandKind
from .._comm._ranks import RankComm
from ._runner import describe
from .._comm._signals import SigtermGuard, keep_exit_status, signal_name

log = logging.getLogger(__package__ + "._sweep")  # the sweep's logger: tests and users filter by it

#: Seconds a rank whose task raised waits at the result gather for every peer before it ends the launch (case
#: C45): ranks that fail the same way arrive within a few seconds of each other; a rank still absent waits in a
#: call the failed rank never joins (DDP's gradient all-reduce), which only ``rank_timeout`` would end.
GRACE_S = 10.0
#: The same after an interruption (Ctrl-C): a peer that got the signal too arrives at once (C41).
INTERRUPT_GRACE_S = 2.0
#: The exit status of a rank that ends the launch after its task raised (``128 + signal`` after an interruption).
EXIT_STATUS = 1


def failure_of(rank: int, outcomes: Sequence[RankOutcome], received: int | None) -> LaunchEnd | None:
    """This rank's first failed or interrupted task among ``outcomes`` as the :class:`.._comm._launch_end.LaunchEnd`
    it would record (status :data:`EXIT_STATUS`, or ``128 + received``, the signal this rank's guard saw), else
    ``None``."""
    for o in outcomes:
        if o.state in (Outcome.FAILED, Outcome.INTERRUPTED):
            signalled = o.state == Outcome.INTERRUPTED and received is not None
            return LaunchEnd(rank, 128 + received if signalled else EXIT_STATUS, str(o.error), o.number, ended=True)
    return None


def grace_s(failure: LaunchEnd) -> float:
    """Seconds a failed rank waits at the gather for its peers (:data:`INTERRUPT_GRACE_S` after a signal)."""
    return INTERRUPT_GRACE_S if failure.signal is not None else GRACE_S


def end_the_launch(ctx: RankComm, study: Any, sweep_dir: str, failure: LaunchEnd, missing: list[int]) -> NoReturn:
    """End the launch from the rank whose task failed while peers ``missing`` wait in a call it never joins (case
    C45): record the failure in the attempt's store, close the trial (study owner) and exit with
    ``failure.status``; torchrun stops the other ranks and, with ``--max-restarts N``, restarts the group."""
    from .._task._process import exit_cleanly

    where = ranks_on_hosts(ctx.store, missing)  # "[2, 3] on node 1 (b, 198.18.250.2)" (issue 42)
    log.error("%s ends the launch: it %s and rank(s) %s did not reach the trial result's gather within %g s "
              "(they wait in a call this rank never joins, such as a training collective). It exits with status %d; "
              "torchrun stops the other ranks, and with --max-restarts N restarts the group, which resumes the study.",
              ctx.label, failure.what, where, grace_s(failure), failure.status)
    record_end(ctx.store, failure)
    # torchrun's "Root Cause" takes the smallest time stamp: the task failed about a grace ago, before any peer exited
    write_torchrun_error_file(f"{ctx.label} {failure.what} and ended the launch: rank(s) {where} were blocked in a "
                              "call it never joined", time.time() - grace_s(failure))
    if study is not None:
        _close_after(study, sweep_dir, failure)
    exit_cleanly(failure.status)


def _close_after(study: Any, sweep_dir: str, failure: LaunchEnd) -> None:
    """The study owner's part when a rank ended the launch: close the open trials (never re-queued after a raised
    task, which the same params would fail again) and log the resume command. Never raises."""
    try:
        study.abandon_open(f"rank {failure.rank} {failure.what} and ended the launch", retry=failure.status > 128,
                           everyone=True)
    except Exception:  # noqa: BLE001 - a restarted group closes its own RUNNING trial (by its group id) anyway
        log.exception("rank 0 could not close the trial before the launch ends")
    if failure.status > 128:  # a signal: the user stops the launch, no restart wanted
        log.error("The sweep stopped: rank %d %s; every rank exits with status %d. %s", failure.rank, failure.what,
                  failure.status, resume_advice(sweep_dir))
    else:
        log.error("With torchrun --max-restarts N the restarted group resumes the study; without, resume the study "
                  "with:\n%s", resume_command(sweep_dir))


@dataclasses.dataclass(frozen=True)
class Ending:
    """How this rank leaves the sweep.

    Attributes:
        leaving: :data:`.._comm._launch_end.FINISHED`, or why it stopped.
        preempted: SIGTERM reached the study owner; ``agreed``: at ``should_preempt()``, and the round was told.
        interrupted: the exception to raise instead (a signal to this rank or a peer), or ``None``.
        signal_here: this rank's own handler saw the signal.
        record: why this rank stopped, for the launch's end record (C41); ``None`` when it finished the sweep.
    """

    leaving: str = FINISHED
    preempted: bool = False
    agreed: bool = False
    interrupted: Interrupted | None = None
    signal_here: bool = False
    record: LaunchEnd | None = None

    @property
    def waits(self) -> bool:
        """Whether the study owner waits for the other trial groups and the ranks for the results: not after a
        signal to this rank (torchrun stops every rank itself) nor after a SIGTERM that was not agreed."""
        return not ((self.interrupted is not None and self.signal_here) or (self.preempted and not self.agreed))


def ending_of(e: BaseException, ctx: RankComm, guard: SigtermGuard, study: Any, sweep_dir: str) -> Ending:
    """The :class:`Ending` of a loop that raised ``e``; the study owner's handle ``study`` (``None`` elsewhere)
    closes the open trials first and logs why, with the resume advice. When a peer ended the launch
    (:func:`end_the_launch`), this rank closes the trial as that failure and exits at once with its status."""
    recorded = launch_end(ctx.store)
    if recorded is not None and recorded.ended and recorded.rank != ctx.rank:
        from .._task._process import exit_cleanly

        if study is not None:
            _close_after(study, sweep_dir, recorded)
        else:
            log.warning("%s stops: rank %d %s and ended the launch; exit status %d", ctx.label, recorded.rank,
                        recorded.what, recorded.status)
        exit_cleanly(recorded.status)
    preempted = isinstance(e, Preempted)
    agreed = preempted and e.agreed  # the round was told; the other trial groups stop alike
    how = signal_name(e.code - 128) if agreed else "SIGTERM"  # agreed: preempted_after's exit, 128 + the signal
    leaving = f"stopped on {how} (preemption)" if agreed else f"stopped: {describe(e)}"
    stopped = None if preempted else _interruption(ctx, guard, recorded)
    if study is not None:
        why = "SIGTERM" if preempted else (signal_name(stopped[0]) if stopped else f"the sweep stopped: {describe(e)}")
        signalled = preempted or stopped is not None
        study.abandon_open(why, everyone=signalled and not agreed, signalled=signalled)
        theirs = (TrialFailedError, TrainingGroupBrokenError, StorageUnavailableError)  # they say it themselves
        if not stopped and not agreed and not isinstance(e, theirs):
            log.error("The sweep stopped (%s). %s", describe(e), resume_advice(study.sweep_dir))
    interrupted = _interrupted(ctx, *stopped, sweep_dir=sweep_dir) if stopped is not None else None
    record = LaunchEnd(ctx.rank, 1, f"{how} (preemption)" if agreed else describe(e))
    return Ending(leaving, preempted, agreed, interrupted, guard.received is not None, record)


def preempted_after(verdicts: list, ctx: RankComm, sweep_dir: str, signum: int | None = None) -> Preempted:
    """The exit (status ``128 + signum``) of every rank after a round in which SIGTERM or SIGINT reached a rank
    during the task; ``signum``: this rank's signal, ``None`` (a peer's) counts as SIGTERM. The resume command is
    said once, by the launch's first process (issue 38, C59)."""
    signum = signum or signal.SIGTERM
    if ctx.is_main:
        saved = [v.number for v in verdicts if v.preempted]
        paused = [v.number for v in verdicts if v.paused_at is not None]
        parts = []
        if saved:
            parts.append(f"trial(s) {saved} stopped on should_preempt() and were re-queued; their retries resume "
                         "from the newest checkpoint")
        if paused:
            parts.append(f"trial(s) {paused} reached the step they pause at and were kept there with their checkpoint")
        what = "; ".join(parts) or "the round's trials were told"
        if first_process():
            log.error("%s during the trial: %s. Every rank exits with status %d. Resume the study with:\n%s",
                      signal_name(signum), what, 128 + signum, resume_command(sweep_dir))
        else:
            log.warning("%s, %s during the trial: %s", ctx.label, signal_name(signum), what)
    exit_ = Preempted(128 + signum)
    exit_.agreed = True
    return exit_


def _interrupted(ctx: RankComm, signum: int, ranks: list[int], *, sweep_dir: str) -> Interrupted:
    """Log the interruption (rank 0: with the resume command on a line of its own) and return the exit."""
    code = 128 + signum
    text = f"{signal_name(signum)} received by rank(s) {ranks}"
    if ctx.is_main:
        log.error("The sweep stopped: %s; a running trial is closed (FAIL) and every rank exits with status "
                  "%d. Resume the study with:\n%s", text, code, resume_command(sweep_dir))
    else:
        log.warning("%s stops: %s; exit status %d", ctx.label, text, code)
    return Interrupted(code)


def _interruption(ctx: RankComm, guard: "SigtermGuard", end: LaunchEnd | None) -> tuple[int, list[int]] | None:
    """``(signal, [ranks that received it])`` when this rank (:attr:`SigtermGuard.received`) or a peer (the
    launch's end record ``end``) was interrupted, else ``None``; a ``KeyboardInterrupt`` the task raised is none."""
    found = (end.signal, [end.rank]) if end is not None and end.signal is not None else None
    if guard.received is None:
        return found
    ranks = found[1] if found is not None and found[0] == guard.received else []
    return guard.received, sorted({ctx.rank, *ranks})


def setup_refused(ctx: RankComm, error: RemoteError, failure: Exception | None, owner: bool,
                   world_size: int) -> BaseException:
    """What every rank raises when rank 0 could not start the sweep (issue 22, item 4).

    A refusal by one of the package's errors is said once, by rank 0 (also into torchrun's error file; issue
    38, C59), and ends each rank with ``SystemExit(1)``, which Hydra does not report, after
    :data:`.._comm._refusal.REFUSAL_GRACE_S` at world size above 1. With ``HYDRA_FULL_ERROR=1``, and for any other
    error (then logged by every other rank), the error itself is returned. ``owner``: global rank 0. Either way the
    rank ignores SIGTERM from here on at world size above 1 (:func:`.._comm._signals.keep_exit_status`), so that
    torchrun's stop after the first rank's exit does not replace this rank's exit status.
    """
    if world_size > 1:
        keep_exit_status()
    exc = error.to_exception()
    package_error = type(exc) is not DSOptunaSweeperError or error.type_name == DSOptunaSweeperError.__name__
    if owner and package_error and os.environ.get("HYDRA_FULL_ERROR") != "1":
        # rank 0 logged it already: torchrun's error file gets it too, so its "Root Cause" shows the message
        write_torchrun_error_file(f"Sweep set-up failed on rank 0: {error.type_name}: {error.message}", time.time())
    elif not owner and not package_error:  # a bug or an unreachable storage: every rank says why it stops
        log.error("%s stops: rank 0 could not start the sweep: %s: %s", ctx.label, error.type_name, error.message)
    quiet = quiet_exit(world_size) if package_error else None
    if quiet is not None:
        return quiet
    if isinstance(failure, DSOptunaSweeperError):
        return failure
    if failure is not None:
        exc.__cause__ = failure
    return exc


def stop_for(signum: int, sweep_dir: str) -> Command:
    """Rank 0's STOP for a signal whose exception was swallowed (see :class:`SigtermGuard`)."""
    name = signal_name(signum)
    return Command(CommandKind.STOP, error=RemoteError("TrialFailedError", (
        f"rank 0 received {name} during the last trial; every rank stops before the next one. "
        f"Resume the study with:\n{resume_command(sweep_dir)}"), 0))
