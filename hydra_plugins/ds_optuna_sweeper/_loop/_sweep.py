"""The sweep loop, in the order one trial flows. Every collective of the loop is in this file.

One round, on every rank (docs/design.md, "One trial, by role")::

    rank 0   study.next_command()       ask trial(s) -> Command(RUN, payloads) | Command(STOP)
    all      ctx.broadcast(command)     over the gloo control group
    all      runner.run(Launch)         launcher.launch -> config check -> the user's task
    all      ctx.all_gather(outcomes)   one RankOutcome per rank and trial
             (both inside a PeerWatch: a task failure is announced in torchrun's store, case C45)
    all      agree(...)                 one Verdict per trial, identical on every rank
    rank 0   study.tell(verdicts)
    all      probe_training_group(...)  after a failed trial only

"rank 0" is the first rank of the world, or, with ``hydra.sweeper.n_jobs=K`` inside a torchrun world, of
each of the K trial groups (:mod:`._trial_groups`, split before anything else): every group runs this loop
on its own ranks at the same time, and its first rank's ``study`` handle reaches the one
:class:`._study_service.StudyService` on global rank 0, the only process that opens the study.

Every control call is reached by every rank on every path: an error on rank 0 travels inside the
next Command instead of skipping it, and a failure on any rank travels inside its RankOutcome.
Inside the job, the config check (``Runner``) and ``RankTrial``'s report/should_prune/suggest_* are
the only other collectives.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import signal
import time
from typing import Any

from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig
from optuna.trial import TrialState

from .._errors import (
    DSOptunaSweeperError,
    Interrupted,
    Preempted,
    RemoteError,
    StorageUnavailableError,
    TrainingGroupBrokenError,
    SweepStoppedError,
    TrialFailedError,
)
from .._refusal import first_process, quiet_exit, refusal_exit, write_torchrun_error_file
from .._settings import Settings
from .._study._command import resume_advice, resume_command
from ._agree import agree
from ._group import _group_identity, close_group, probe_training_group, setup_ranks
from ._launch import Launch, LaunchMode
from .._comm._launcher import die_with_launcher, stop_watching
from .._comm._leaving import FINISHED, interruption, leaving_records, record_leaving, wait_for_rank0_results
from ._messages import STOP, Command, CommandKind, Setup
from ._peer_watch import NO_WATCH, PeerChannel, signal_name
from .._comm._ranks import RankComm
from ._restart_dir import keep_for_this_launch
from ._runner import Runner, describe
from ._signals import SigtermGuard
from ._liveness import wait_for_results
from ._study_handles import LocalStudy, RemoteStudy, open_handle
from ._timings import PhaseTimer
from ._trial_groups import TrialGroups, split_world
from ._world_notice import world_size_one_notice

log = logging.getLogger(__name__)


class Sweep:
    """One sweep on one rank. Created by :class:`~hydra_plugins.ds_optuna_sweeper.sweeper.DSOptunaSweeper`.

    Args:
        settings: the checked ``hydra.sweeper`` settings.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.timer = PhaseTimer()
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.runner: Runner | None = None
        self.peers: PeerChannel | None = None
        #: rank 0's absolute sweep dir, on every rank once rank 0's Setup arrived (``""`` before).
        self.sweep_dir = ""
        #: how the loop's end is logged: the sweep's, or one trial group's (``n_jobs`` under torchrun).
        self._finished_text = "Sweep finished"

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Keep Hydra's config and create the runner (and its launcher) around the task function."""
        self.config = config
        self.hydra_context = hydra_context
        self.runner = Runner(self.settings, config, hydra_context, task_function, self.timer)

    def sweep(self, arguments: list[str]) -> None:
        """Run the sweep on this rank until rank 0 says stop.

        With ``hydra.sweeper.n_jobs=K`` inside a torchrun world, the world is split into K trial groups
        first (:func:`._trial_groups.split_world`), and this rank's group runs the loop as its world.

        Raises:
            SystemExit: status 1 on every rank when rank 0 refused a setting before trial 0 (see
                :func:`_setup_refused`; ``HYDRA_FULL_ERROR=1``: the same error type on every rank).
            SystemExit: status 1 on every rank when rank 0 stopped the sweep with a ``TrialFailedError`` (failure
                rate, a failed refit, a rank was interrupted): said once by rank 0, no traceback
                (:func:`._refusal.refusal_exit`; ``HYDRA_FULL_ERROR=1``: the error itself).
            SweepStoppedError: ask or tell failed.
            StorageUnavailableError: the storage stayed away longer than ``storage_retry_timeout``.
            RankTimeoutError: no answer within ``rank_timeout``; ``PeerLostError``: a peer is gone.
            TrainingGroupBrokenError: a failed trial left the training process group unusable.
            Preempted: SIGTERM on rank 0 (exit status 143).
            Interrupted: on every rank, when a rank received SIGINT (Ctrl-C; exit status 130), or a peer of
                this rank received SIGINT or SIGTERM (its record in torchrun's store says so; 143 for SIGTERM).
            SweeperConfigError: the world cannot be split into trial groups (a default group exists already,
                or CUDA was initialised before the sweep).
        """
        die_with_launcher()  # kill -9 of torchrun: SIGTERM here, as when torchrun stops the group (C55)
        # before the control plane sets WORLD_SIZE for a world of one (issue 38, C59: torchrun forgotten)
        self._notice = world_size_one_notice()
        groups = None
        if self.settings.trial_groups > 1:
            try:
                groups = split_world(self.settings.trial_groups, self.settings.rank_timeout_s)
            except DSOptunaSweeperError as e:
                where = f"rank {os.environ.get('RANK', '0')}/{self.settings.world_size}: hydra.sweeper refused"
                raise refusal_exit(e, where, self.settings.world_size) from None
        try:
            self._sweep(arguments, groups)
        except TrialFailedError as e:
            if isinstance(e, SweepStoppedError):  # ask or tell failed outside any trial: keep the traceback
                raise
            # rank 0's verdict (failure rate, a failed refit, an interrupted trial), the same on every rank: said
            # once, by rank 0, without a traceback (issue 38, C59)
            raise refusal_exit(e, "ds_optuna stopped the sweep", max(self.settings.world_size, 1)) from None
        finally:
            if groups is not None:
                groups.restore()

    def _sweep(self, arguments: list[str], groups: TrialGroups | None) -> None:
        """:meth:`sweep` on this rank's world: the torchrun world, or this rank's trial group."""
        assert self.config is not None and self.runner is not None
        ctx = setup_ranks(self.settings.rank_timeout_s, self.settings.backend)
        owner = groups.is_owner if groups is not None else ctx.is_main  # the one process that opens the study
        if groups is not None:
            self._finished_text = f"Trial group {groups.index}/{groups.n_groups} finished its search"
        if groups is not None and owner:  # the launch's identity, kept in torchrun's store across restarts
            group_id, restarted = _group_identity(groups.torchrun_store, is_main=True, attempt=groups.attempt)
            ctx = dataclasses.replace(ctx, group_id=group_id, restarted=restarted)
        # Every rank records a signal in torchrun's store at once (its peers then know why it leaves, C41);
        # SIGTERM is the study owner's alone (Preempted): elsewhere it keeps its default action, which ends a
        # rank blocked in a gloo wait at once, where a Python handler would only run once the wait returns.
        guard = SigtermGuard(sigterm=owner, on_signal=lambda signum: record_leaving(
            ctx.store, ctx.rank, f"was interrupted by {signal.Signals(signum).name}"))
        self.peers = PeerChannel.open(ctx, lambda: guard.received)
        if owner:  # a torchrun restart resumes in the first attempt's sweep dir, whatever composed it (C50)
            keep_for_this_launch(self.config, ctx, groups)
        study, failure = open_handle(self.settings, self.config, self.hydra_context, ctx, groups, arguments) \
            if ctx.is_main else (None, None)
        leaving, interrupted, preempted, agreed = FINISHED, False, False, False
        try:
            with guard:
                self._share_setup(ctx, study, failure, owner, groups)
                try:
                    self._loop(ctx, study, guard if ctx.is_main else None)
                    if self.settings.refit_enabled:
                        self._refit(ctx, study)
                    stop_watching()  # every trial is told: the results get written even if torchrun dies now
                except BaseException as e:
                    guard.stopping = True  # a second SIGTERM during the clean-up is ignored
                    preempted = isinstance(e, Preempted)
                    agreed = preempted and e.agreed  # the round was told; the other trial groups stop alike
                    leaving = "stopped on SIGTERM (preemption)" if agreed else f"stopped: {describe(e)}"
                    stopped = None if preempted else _interruption(ctx, guard)
                    if study is not None:
                        why = "SIGTERM" if isinstance(e, Preempted) else (
                            signal_name(stopped[0]) if stopped else f"the sweep stopped: {describe(e)}")
                        signalled = preempted or stopped is not None
                        study.abandon_open(why, everyone=signalled and not agreed, signalled=signalled)
                        theirs = (TrialFailedError, TrainingGroupBrokenError, StorageUnavailableError)  # say it
                        if not stopped and not agreed and not isinstance(e, theirs):
                            log.error("The sweep stopped (%s). %s", describe(e), resume_advice(study.sweep_dir))
                    if stopped is not None:
                        interrupted = True
                        raise _interrupted(ctx, *stopped, sweep_dir=self.sweep_dir) from e
                    raise
        finally:
            record_leaving(ctx.store, ctx.rank, leaving)
            # A signal to this rank too (Ctrl-C: torchrun passes it to every rank and stops them all itself,
            # SIGKILL 30 s later, not rank 0 sooner), while rank 0 may still wait in a gather that this rank's
            # KeyboardInterrupt left: leave at once, which ends that wait. After SIGTERM (rank 0, Preempted)
            # the other trial groups are being stopped too: rank 0 writes the results without waiting for them.
            waits = not ((interrupted and guard.received is not None) or (preempted and not agreed))
            if study is not None:  # after an agreed preemption the other trial groups get the grace to stop
                study.finish(leaving, wait=waits, wait_s=self.settings.preempt_grace_s if agreed else None)
            if groups is not None:  # every rank of a trial group leaves once global rank 0 wrote the results
                if not ctx.is_main and waits:
                    wait_for_results(groups.world_store, self.settings.rank_timeout_s, f"global rank {groups.rank}")
            elif ctx.is_main or waits:
                wait_for_rank0_results(ctx, is_done=ctx.is_main, timeout_s=min(120.0, self.settings.rank_timeout_s))
            close_group(ctx)

    def _share_setup(self, ctx: RankComm, study: LocalStudy | RemoteStudy | None, failure: Exception | None,
                     owner: bool, groups: TrialGroups | None) -> None:
        """Every rank receives rank 0's :class:`Setup` (or its set-up error) and prepares its runner.

        With trial groups, global rank 0 publishes it to every group's first rank, which passes it on.

        Raises:
            SystemExit, DSOptunaSweeperError: rank 0's set-up error, on every rank (:func:`_setup_refused`).
        """
        assert self.runner is not None
        refusal = RemoteError.from_exception(failure, ctx.rank) if failure is not None else None
        setup = study.setup_message(refusal) if study is not None else Setup(None, error=refusal)
        setup = ctx.broadcast(setup, what="sweep set-up", trial=None)
        if setup.error is not None:
            record_leaving(ctx.store, ctx.rank, f"stopped: rank 0 could not start the sweep ({setup.error.type_name})")
            raise _setup_refused(ctx, setup.error, failure if owner else None, owner,
                                 max(self.settings.world_size, ctx.world_size))
        self.sweep_dir = str(setup.sweep_dir)
        self.runner.start(ctx, self.sweep_dir, setup.resolver_cache, owner=owner)
        log.info("ds_optuna: %s%s", ctx.describe(), f", {groups.describe()}" if groups is not None else "")
        if owner and groups is None and getattr(self, "_notice", None):  # said once, before trial 0
            log.warning("%s", self._notice)

    def _loop(self, ctx: RankComm, driver: LocalStudy | RemoteStudy | None, guard: "SigtermGuard | None") -> None:
        """Rounds until rank 0 orders STOP. The order of collectives is the same on every rank.

        Rank 0 orders STOP instead of asking when its guard saw a signal whose exception was swallowed
        (:attr:`SigtermGuard.received` still set at the next ask); every rank then raises :class:`TrialFailedError` naming the
        signal and the resume command, and rank 0 raises :class:`Preempted` (exit 143) for SIGTERM.
        """
        assert self.runner is not None
        timer, last_number = self.timer, None
        while True:
            timer.start()
            command = STOP
            # a signal still set here never unwound the sweep: its exception was swallowed (SigtermGuard)
            missed = guard.received if guard is not None else None
            if driver is not None:
                with timer.phase("ask"):
                    command = _stop_for(missed, self.sweep_dir) if missed else driver.next_command()
            with timer.phase("broadcast"):
                hint = None if last_number is None else last_number + 1
                command = ctx.broadcast(command, what="trial payload", trial=hint)
            if command.kind == CommandKind.STOP:
                if missed and command.error is not None:
                    log.error("%s", command.error.message)
                if missed == signal.SIGTERM:
                    raise Preempted(128 + signal.SIGTERM)
                if command.error is not None:
                    command.error.raise_here()
                if driver is not None:  # with trial groups: this group's search; the sweep ends with the last group
                    log.info("%s: %s", self._finished_text, command.reason)
                return
            first = command.payloads[0].number
            with self._watch(f"trial{first}", driver, close=True) as watch:
                with timer.phase("launch"):
                    launch = driver.launch(command.payloads, watch) if driver is not None else Launch.of(
                        command.payloads, watch=watch)
                    outcomes = self.runner.run(launch)
                with timer.phase("gather"):
                    gathered = ctx.all_gather(outcomes, what="trial result", trial=first, patient=True)
            verdicts = [agree(p.number, [g[i] for g in gathered]) for i, p in enumerate(command.payloads)]
            self.runner.log_outcomes(verdicts)
            if driver is not None:
                with timer.phase("tell"):
                    driver.tell(verdicts)
            last_number = command.payloads[-1].number
            timer.finish(ctx.rank, ctx.world_size, last_number)
            failed = [v for v in verdicts if v.state == TrialState.FAIL and not (v.interrupted or v.preempted)]
            if failed and ctx.distributed:
                probe_training_group(ctx, failed[0].number, failed[0].error, resume_command(self.sweep_dir))
            if any(v.preempted or v.signalled for v in verdicts):
                raise _preempted_after(verdicts, ctx, self.sweep_dir)
            interrupted = [v for v in verdicts if v.interrupted]
            if interrupted:
                raise TrialFailedError(
                    f"trial {interrupted[0].number} was interrupted ({interrupted[0].error}); every rank stops. "
                    f"Resume the study with:\n{resume_command(self.sweep_dir)}"
                )

    def _refit(self, ctx: RankComm, study: LocalStudy | RemoteStudy | None) -> None:
        """After the search: every rank runs the chosen trials' configs once more (``hydra.sweeper.refit``).

        One run at a time, as rank 0 hands them out (with trial groups, once every group's search is over,
        to whichever group asks next): the same collectives as a trial (broadcast, the job with its config
        check, a patient gather), so a failing or hanging refit ends like a failing or hanging trial. Every
        refit runs even when an earlier one failed; then every rank (of every group) raises.

        Raises:
            TrialFailedError: on every rank, when a refit run failed on any rank.
        """
        assert self.runner is not None
        while True:
            command = study.refit_next() if study is not None else STOP
            command = ctx.broadcast(command, what="refit payload", trial=None)
            if command.kind == CommandKind.STOP:
                if command.error is not None:
                    command.error.raise_here()
                return
            payload = command.payloads[0]
            with self._watch(f"refit{payload.number}", study, close=False) as watch:
                outcome = self.runner.run(Launch.of([payload], LaunchMode.REFIT, watch=watch))[0]
                gathered = ctx.all_gather(outcome, what="refit result", trial=payload.number, patient=True)
            verdict = agree(payload.number, gathered)
            self.runner.log_outcomes([verdict], refit=payload.what)
            if study is not None:
                study.refit_record(payload, verdict)
            if verdict.state != TrialState.COMPLETE:
                if verdict.interrupted:
                    raise TrialFailedError(
                        f"refit failed ({payload.what}: {verdict.error or verdict.state.name}); the search's "
                        f"results are kept. Run the refit again on the study without new trials: "
                        f"{resume_command(self.sweep_dir)}")
                if ctx.distributed:
                    probe_training_group(ctx, payload.number, verdict.error, resume_command(self.sweep_dir))

    def _watch(self, round_key: str, driver: LocalStudy | RemoteStudy | None, *, close: bool) -> Any:
        """The round's :class:`._peer_watch.PeerWatch` (:data:`NO_WATCH` at world size 1 or without a store).

        Before a blocked group ends, rank 0 closes the round's open trials (``close``; after a failure
        FAIL, never re-queued: a task raised, the same params would fail again; after an interruption as
        any interrupted trial: FAIL, or re-queued with ``retry_failed_trials``) and logs the resume
        command on its own line.
        """
        if self.peers is None:
            return NO_WATCH
        on_end = functools.partial(_end_the_group, driver, self.sweep_dir, close) if driver is not None else None
        return self.peers.watch(round_key, on_end)


def _end_the_group(study: LocalStudy | RemoteStudy, sweep_dir: str, close: bool, why: str, status: int) -> None:
    """Rank 0's clean-up when the peer watch ends its group (:meth:`Sweep._watch`); this process exits next."""
    interrupted = status > 128
    if close:  # with trial groups, every group's open trial is closed (the whole launch ends)
        study.abandon_open(why, retry=interrupted, everyone=True)
    if interrupted:
        log.error("The sweep stopped: %s; every rank exits with status %d. %s", why, status,
                  resume_advice(sweep_dir))
    else:
        log.error("With torchrun --max-restarts N the restarted group resumes the study; without, resume "
                  "the study with:\n%s", resume_command(sweep_dir))


def _preempted_after(verdicts: list, ctx: RankComm, sweep_dir: str) -> Preempted:
    """The exit of every rank after a round in which SIGTERM reached a rank during the task.

    Each trial group's rank 0 logs its trials; the resume command is said once, by the launch's first process
    (:func:`._refusal.first_process`; issue 38, C59: twice with ``n_jobs=2``).
    """
    if ctx.is_main:
        saved = [v.number for v in verdicts if v.preempted]
        what = (f"trial(s) {saved} stopped on should_preempt() and were re-queued; their retries resume from the "
                "newest checkpoint" if saved else "the round's trials were told")
        if first_process():
            log.error("SIGTERM during the trial: %s. Every rank exits with status 143. Resume the study with:\n%s",
                      what, resume_command(sweep_dir))
        else:
            log.warning("%s, SIGTERM during the trial: %s", ctx.label, what)
    exit_ = Preempted(128 + signal.SIGTERM)
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


def _interruption(ctx: RankComm, guard: "SigtermGuard") -> tuple[int, list[int]] | None:
    """``(signal, [ranks that received it])`` when this rank or a peer was interrupted, else ``None``.

    Evidence only: this rank's own handler (:attr:`SigtermGuard.received`), or a peer's record in torchrun's
    store (:func:`._leaving.record_leaving`). A ``KeyboardInterrupt`` the task raised itself is no signal.
    """
    found = interruption(leaving_records(ctx.store, ctx.world_size))
    if guard.received is None:
        return found
    ranks = found[1] if found is not None and found[0] == guard.received else []
    return guard.received, sorted({ctx.rank, *ranks})


def _setup_refused(ctx: RankComm, error: RemoteError, failure: Exception | None, owner: bool,
                   world_size: int) -> BaseException:
    """What every rank raises when rank 0 could not start the sweep (issue 22, item 4).

    Rank 0 logged its error already (:func:`._study_handles.open_handle`). A refusal by one of the package's
    errors (a bad setting or search space: the message says what to change) is said once, by rank 0, which
    also writes it to torchrun's error file (issue 38, C59: once per rank was noise), and ends each rank with
    ``SystemExit(1)``, which Hydra does not report (its ``run_and_report`` handles ``Exception`` only): exit
    status 1 after :data:`._refusal.REFUSAL_GRACE_S` at world size above 1, no traceback. For any other error
    every other rank logs it once, naming rank 0. With
    ``HYDRA_FULL_ERROR=1`` (Hydra's switch for full tracebacks), and for any other error (a bug, an
    unreachable storage), the error itself is returned: rank 0's own one for a package error, else the
    :class:`._errors.RemoteError` rebuilt (chained to the original on rank 0). ``owner``: this is the rank
    that opened the study (global rank 0); ``world_size``: the launch's ranks (trial groups included).
    """
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


def _stop_for(signum: int, sweep_dir: str) -> Command:
    """Rank 0's STOP for a signal whose exception was swallowed (see :class:`SigtermGuard`)."""
    name = signal_name(signum)
    return Command(CommandKind.STOP, error=RemoteError("TrialFailedError", (
        f"rank 0 received {name} during the last trial; every rank stops before the next one. "
        f"Resume the study with:\n{resume_command(sweep_dir)}"), 0))
