"""The sweep loop, in the order one trial flows. Every collective of the loop is in this file.

One round, on every rank (docs/design.md, "One trial, by role")::

    rank 0   study.next_command()       ask trial(s) -> Command(RUN, payloads) | Command(STOP)
    all      ctx.broadcast(command)     over the gloo control group
    all      runner.run(Launch)         launcher.launch -> config check -> the user's task
    all      ctx.all_gather(outcomes)   one RankOutcome per rank and trial; a rank whose task failed first
                                        waits GRACE_S for every rank's arrival, else ends the launch (C45)
    all      agree(...)                 one Verdict per trial, identical on every rank
    rank 0   study.tell(verdicts)
    all      probe_training_group(...)  after a failed trial only

"rank 0" is the first rank of the world or, with ``hydra.sweeper.n_jobs=K``, of each of the K trial groups
(:mod:`._trial_groups`), whose ``study`` handle reaches the one :class:`._study_service.StudyService` on global
rank 0. Every control call is reached by every rank on every path: an error on rank 0 travels inside the next
Command, a failure on any rank inside its RankOutcome.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import os
import pickle
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict
from optuna.trial import TrialState

from .._errors import DSOptunaSweeperError, Preempted, RemoteError, SweepStoppedError, TrialFailedError
from .._comm._refusal import refusal_exit
from .._settings import Settings
from .._study._command import resume_command
from ._agree import RankOutcome, agree
from ._exits import Ending, end_the_launch, ending_of, failure_of, grace_s, preempted_after, setup_refused, stop_for
from ._group import _group_identity, close_group, probe_training_group, setup_ranks
from .._comm._launcher import die_with_launcher, stop_watching
from .._comm._launch_end import LaunchEnd, record_end
from .._comm._long_waits import mark_results_written, wait_for_results
from ._messages import STOP, CommandKind, Launch, LaunchMode, Setup
from .._comm._ranks import PeersBlockedError, RankComm
from ._runner import Runner
from .._comm import _signals, _wire
from .._comm._signals import SigtermGuard
from ._study_handles import StudyHandle, open_handle
from ._timings import PhaseTimer
from ._trial_groups import TrialGroups, split_world

log = logging.getLogger(__name__)

#: Seconds (at most; ``rank_timeout`` if shorter) a rank waits for rank 0's results at the end of a launch
#: without trial groups: a dead rank 0 costs it no more (torchrun stops it sooner).
RESULTS_WAIT_S = 120.0


class Sweep:
    """One sweep on one rank, of the checked ``hydra.sweeper`` settings; created by the ``DSOptunaSweeper``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.timer = PhaseTimer()
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.runner: Runner | None = None
        self.guard: SigtermGuard | None = None
        self.sweep_dir = ""  # rank 0's absolute sweep dir, on every rank once rank 0's Setup arrived
        self._finished_text = "Sweep finished"  # or one trial group's

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        """Keep Hydra's config and create the runner (and its launcher) around the task function."""
        self.config = config
        self.hydra_context = hydra_context
        self.runner = Runner(self.settings, config, hydra_context, task_function, self.timer)

    def sweep(self, arguments: list[str]) -> None:
        """Run the sweep on this rank until rank 0 says stop.

        With ``hydra.sweeper.n_jobs=K`` the world is split into K trial groups first, and this rank's group runs
        the loop as its world.

        Raises:
            SystemExit: status 1 on every rank when rank 0 refused a setting before trial 0
                (:func:`._exits.setup_refused`) or stopped the sweep with a ``TrialFailedError`` (failure rate, a
                failed refit, an interrupted rank): said once by rank 0, no traceback (``HYDRA_FULL_ERROR=1``: the
                error itself, the same type on every rank).
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
            # the same verdict on every rank: said once, by rank 0, without a traceback (issue 38, C59)
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
        # The first signal is recorded in torchrun's store at once (C41). SIGTERM is the study owner's alone:
        # elsewhere its default action ends a rank blocked in a gloo wait, where a handler would wait for the wait.
        guard = SigtermGuard(sigterm=owner, on_signal=lambda signum: record_end(
            ctx.store, LaunchEnd(ctx.rank, 128 + signum, signal.Signals(signum).name)))
        self.guard = guard
        if owner:  # a torchrun restart resumes in the first attempt's sweep dir, whatever composed it (C50)
            store, attempt = (groups.torchrun_store, groups.attempt) if groups else (ctx.launcher_store, ctx.attempt)
            keep_sweep_dir(store, self.config, attempt, os.environ.get("TORCHELASTIC_RUN_ID"))
        study, failure = open_handle(self.settings, self.config, self.hydra_context, ctx, groups, arguments) \
            if ctx.is_main else (None, None)
        ending = Ending()
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
                    ending = ending_of(e, ctx, guard, study, self.sweep_dir)
                    if ending.interrupted is not None:
                        raise ending.interrupted from e
                    raise
        finally:
            self._leave(ctx, study, groups, ending)

    def _leave(self, ctx: RankComm, study: StudyHandle | None, groups: TrialGroups | None,
               ending: Ending) -> None:
        """This rank's leaving record; the study owner writes the results; every other rank waits until they are
        written (:attr:`Ending.waits`)."""
        if ending.record is not None:  # why this rank stops, for peers whose waits break (C41)
            record_end(ctx.store, ending.record)
        waits = ending.waits
        if study is not None:
            study.finish(ending.leaving, wait=waits, wait_s=self.settings.preempt_grace_s if ending.agreed else None)
        if groups is not None:  # every rank of a trial group leaves once global rank 0 wrote the results
            if not ctx.is_main and waits:
                wait_for_results(groups.world_store, f"global rank {groups.rank}")
        elif ctx.is_main:
            mark_results_written(ctx.store)
        elif waits:  # a dead rank 0 costs at most this (torchrun stops this rank sooner)
            wait_for_results(ctx.store, ctx.label, timeout_s=min(RESULTS_WAIT_S, self.settings.rank_timeout_s))
        close_group(ctx)

    def _share_setup(self, ctx: RankComm, study: StudyHandle | None, failure: Exception | None,
                     owner: bool, groups: TrialGroups | None) -> None:
        """Every rank receives rank 0's :class:`Setup` and prepares its runner.

        Raises:
            SystemExit, DSOptunaSweeperError: rank 0's set-up error, on every rank (:func:`._exits.setup_refused`).
        """
        assert self.runner is not None
        refusal = RemoteError.from_exception(failure, ctx.rank) if failure is not None else None
        setup = study.setup_message(refusal) if study is not None else Setup(None, error=refusal)
        setup = ctx.broadcast(setup, what="sweep set-up", trial=None)
        if setup.error is not None:
            raise setup_refused(ctx, setup.error, failure if owner else None, owner,
                                 max(self.settings.world_size, ctx.world_size))
        self.sweep_dir = str(setup.sweep_dir)
        self.runner.start(ctx, self.sweep_dir, setup.resolver_cache, owner=owner)
        log.info("ds_optuna: %s%s", ctx.describe(), f", {groups.describe()}" if groups is not None else "")
        if owner and groups is None and getattr(self, "_notice", None):  # said once, before trial 0
            log.warning("%s", self._notice)

    def _loop(self, ctx: RankComm, driver: StudyHandle | None, guard: "SigtermGuard | None") -> None:
        """Rounds until rank 0 orders STOP. The order of collectives is the same on every rank.

        A signal whose exception was swallowed (:attr:`SigtermGuard.received`) makes rank 0 order STOP: every rank
        raises :class:`TrialFailedError` naming it, rank 0 :class:`Preempted` (143) for SIGTERM.
        """
        assert self.runner is not None
        timer, last_number = self.timer, None
        while True:
            timer.start()
            command = STOP
            missed = guard.received if guard is not None else None
            if driver is not None:
                with timer.phase("ask"):
                    command = stop_for(missed, self.sweep_dir) if missed else driver.next_command()
            with timer.phase("broadcast"):
                hint = None if last_number is None else last_number + 1
                command = ctx.broadcast(command, what="trial payload", trial=hint)
            if command.kind == CommandKind.WAIT:
                continue
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
            with timer.phase("launch"):
                launch = driver.launch(command.payloads) if driver is not None else Launch.of(command.payloads)
                outcomes = self.runner.run(launch)
            with timer.phase("gather"):
                gathered = self._gather(ctx, outcomes, "trial result", first, driver)
            verdicts = [agree(p.number, [g[i] for g in gathered]) for i, p in enumerate(command.payloads)]
            self.runner.book.log(verdicts)
            if driver is not None:
                with timer.phase("tell"):
                    driver.tell(verdicts)
            last_number = command.payloads[-1].number
            timer.finish(ctx.rank, ctx.world_size, last_number)
            failed = [v for v in verdicts if v.state == TrialState.FAIL and not (v.interrupted or v.preempted)]
            if failed and ctx.distributed:
                probe_training_group(ctx, failed[0].number, failed[0].error, resume_command(self.sweep_dir))
            if any(v.preempted or v.signalled for v in verdicts):
                raise preempted_after(verdicts, ctx, self.sweep_dir, _signals.received())
            interrupted = [v for v in verdicts if v.interrupted]
            if interrupted:
                raise TrialFailedError(
                    f"trial {interrupted[0].number} was interrupted ({interrupted[0].error}); every rank stops. "
                    f"Resume the study with:\n{resume_command(self.sweep_dir)}"
                )

    def _refit(self, ctx: RankComm, study: StudyHandle | None) -> None:
        """After the search: every rank runs the chosen trials' configs once more (``hydra.sweeper.refit``), one run
        at a time, with the same collectives as a trial. Every refit runs even when an earlier one failed.

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
            outcomes = self.runner.run(Launch.of([payload], LaunchMode.REFIT))
            gathered = [g[0] for g in self._gather(ctx, outcomes, "refit result", payload.number, None)]
            verdict = agree(payload.number, gathered)
            self.runner.book.log([verdict], refit=payload.what)
            if study is not None:
                study.refit_record(payload, verdict)
            if verdict.state != TrialState.COMPLETE and verdict.paused_at is None:  # a schedule's part pauses
                if verdict.interrupted:
                    raise TrialFailedError(
                        f"refit failed ({payload.what}: {verdict.error or verdict.state.name}); the search's "
                        f"results are kept. Run the refit again on the study without new trials: "
                        f"{resume_command(self.sweep_dir)}")
                if ctx.distributed:
                    probe_training_group(ctx, payload.number, verdict.error, resume_command(self.sweep_dir))

    def _gather(self, ctx: RankComm, outcomes: list[RankOutcome], what: str, trial: int,
                study: StudyHandle | None) -> list[list[RankOutcome]]:
        """Every rank's outcomes of the round (the patient gather). A rank whose task failed waits
        :data:`._exits.GRACE_S` s for every rank, then ends the launch (:func:`._exits.end_the_launch`, C45)."""
        failure = failure_of(ctx.rank, outcomes, self.guard.received if self.guard is not None else None)
        try:
            return ctx.all_gather(outcomes, what=what, trial=trial, patient=True,
                                  grace_s=grace_s(failure) if failure is not None else None)
        except PeersBlockedError as e:
            assert failure is not None
            end_the_launch(ctx, study, self.sweep_dir, failure, e.missing)


def world_size_one_notice(argv: list[str] | None = None) -> str | None:
    """The one-time notice for a sweep outside torchrun (None inside one, where torchrun sets
    ``TORCHELASTIC_RUN_ID`` and ``WORLD_SIZE``): the torchrun command for N ranks of ``argv`` (default
    ``sys.argv``) and, when ``OMP_NUM_THREADS`` is unset and torch uses several threads, what torchrun sets.

    ``python app.py -m`` (torchrun forgotten) ran at world size 1 without a word, each trial 7-10x slower (2 busy
    cores, a small MLP: 14-16 ms a step with torch's 2 threads, 0.6-0.7 ms with 1): torchrun sets
    ``OMP_NUM_THREADS=1`` for its ranks (``torch.distributed.run``, above one rank per node) while a plain process
    uses every core. The sweeper leaves the thread count alone (every core can be right at world size 1) and says
    it (issue 38, C59).
    """
    if "TORCHELASTIC_RUN_ID" in os.environ or "WORLD_SIZE" in os.environ:
        return None
    argv = list(sys.argv if argv is None else argv)
    command = shlex.join(["torchrun", "--nproc_per_node", "N", *argv])
    text = (f"ds_optuna: this sweep runs at world size 1 (not started by torchrun): every trial runs in this one "
            f"process. To run each trial on N ranks: {command}")
    if not os.environ.get("OMP_NUM_THREADS"):
        import torch

        threads = torch.get_num_threads()
        if threads > 1:
            text += (f". OMP_NUM_THREADS is not set, so torch uses {threads} threads here; torchrun sets "
                     "OMP_NUM_THREADS=1 for each of its ranks, and on a busy machine several threads per process "
                     "can make each training step many times slower: set OMP_NUM_THREADS to choose")
    return text


def keep_sweep_dir(store: Any, config: DictConfig, attempt: int, run_id: str | None) -> str | None:
    """Make ``config.hydra.sweep.dir`` the same in every torchrun attempt of one launch (case C50).

    Hydra composes ``hydra.sweep.dir`` anew in every process: its default, ``multirun/${now:...}``, gave a restarted
    worker group a new dir and with it a new default SQLite study, where the first study kept the closed trial's
    retry WAITING forever (ashleve/lightning-hydra-template#146). Any interpolation may differ between attempts, so
    the first attempt's resolved dir and resolver cache are kept in torchrun's store (which outlives the worker
    restarts) under a key that carries ``TORCHELASTIC_RUN_ID``; the store is any object with torch ``Store``'s
    ``set``/``get``/``check``.

    Called once by global rank 0, before the study is opened. Attempt 0 resolves its dir once (made absolute),
    sets it in ``config`` and records it with the resolver cache; a later attempt that finds a record sets the
    recorded dir and restores the cache, so ``${now:...}`` in the task config keeps its first value too.

    ``store``: torchrun's store (not an attempt's ``PrefixStore``), or ``None``; ``config``: changed in place;
    ``attempt``: torchrun's restart count (``TORCHELASTIC_RESTART_COUNT``); ``run_id``: ``TORCHELASTIC_RUN_ID``.
    Returns the absolute sweep dir this attempt uses, or ``None`` when nothing could be kept (no store, or the
    store refused the call: logged as a warning; the attempt then composes its own dir).
    """
    if store is None:
        return None
    key = _wire.sweep_dir_key(run_id)
    try:
        if attempt > 0 and store.check([key]):
            record = json.loads(store.get(key))
            sweep_dir = str(record["sweep_dir"])
            with open_dict(config):
                config.hydra.sweep.dir = sweep_dir
            if record.get("cache"):
                OmegaConf.set_cache(config, pickle.loads(base64.b64decode(record["cache"])))
            log.info("torchrun restart %d: resuming in the first attempt's sweep dir %s", attempt, sweep_dir)
            return sweep_dir
        sweep_dir = str(Path(str(config.hydra.sweep.dir)).absolute())
        with open_dict(config):  # an uncached resolver would give another value at the next read
            config.hydra.sweep.dir = sweep_dir
        store.set(key, json.dumps({"sweep_dir": sweep_dir, "cache": _cache_text(config)}))
        return sweep_dir
    except Exception:
        log.warning("cannot keep the sweep dir in torchrun's store; a torchrun restart composes it again",
                    exc_info=True)
        return None


def _cache_text(config: DictConfig) -> str:
    """The config's resolver cache, pickled and base64-encoded; ``""`` when empty or not picklable."""
    cache = OmegaConf.get_cache(config)
    if not cache:
        return ""
    try:
        return base64.b64encode(pickle.dumps(dict(cache))).decode()
    except Exception:
        log.debug("the resolver cache cannot be pickled; only the sweep dir is kept", exc_info=True)
        return ""
