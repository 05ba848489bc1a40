"""Every rank: launch the trial's job(s) through Hydra's launcher and report how each ended.

The :class:`Runner` owns the launcher and the task wrapper, which checks the resolved config across ranks
(docs/design.md, "One config") and sets :func:`current_trial`; the job's return value or exception becomes a
:class:`RankOutcome`. It never talks to the study: ``Sweep`` hands it each round as one :class:`._messages.Launch`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import traceback
from typing import Any, Iterator, Sequence

import optuna
from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from .._errors import Preempted, TrialPreempted
from .._secrets import redact_job_files
from .._settings import Settings
from .._study._override_text import format_value, literal_value
from .._comm import _signals
from .._comm._signals import signal_name
from .._comm._arrivals import CallCheck
from .._task._handle import RankTrial
from .._task._replayed import ReplayedTrial
from .._task._slot import trial_slot
from .._tracking._task_env import mlflow_cause, trial_tracking
from .._upstream import job_return_value
from ._agree import Outcome, RankOutcome, combine_repeats, objective_values, refit_metrics
from ._config_check import ConfigCheck
from ._joblog import TrialLogBook, keep_other_trials_out
from ._messages import Launch, TrialPayload
from .._comm._ranks import RankComm
from ._timings import PhaseTimer

log = logging.getLogger(__name__)


class Runner:
    """Runs trials on this rank: the user's ``task_function`` through the launcher of Hydra's master ``config``."""

    def __init__(
        self, settings: Settings, config: DictConfig, hydra_context: HydraContext, task_function: TaskFunction,
        timer: PhaseTimer,
    ) -> None:
        self.settings = settings
        self.config = config
        self.task_function = task_function
        self.timer = timer
        self.launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=self._run_task
        )
        self.ctx = RankComm()
        self._current: Launch | None = None  # the round being run (:meth:`_launching`), read by the task wrapper
        self._config_check = ConfigCheck(self.ctx, timer)
        self._rank_overrides: list[str] = []
        self._said: set[str] = set()  # the scheduler warnings given (:func:`_scheduler_warnings`), once per sweep
        self._launches = 0  # launches so far, equal on every rank: names each task run's call check (_comm._arrivals)
        self.book = TrialLogBook()  # per trial, until its verdict is agreed (case C42)
        #: per trial number until its outcome: (should_preempt() answered True, the signal that reached this rank
        #: during the task or None, the trial paused at its rung).
        self._stops: dict[int, tuple[bool, int | None, bool]] = {}
        self._logged: list[BaseException] = []  # the exceptions already logged inside the job (this launch)
        self._rank_trial: Any = None

    def start(self, ctx: RankComm, sweep_dir: str, resolver_cache: Any, *, owner: bool | None = None) -> None:
        """Adopt rank 0's sweep dir and resolver cache (from its ``Setup``), and prepare this rank's job overrides;
        ``owner``: this rank opened the study (default: ``ctx.is_main``), every other rank takes rank 0's cache."""
        self.ctx = ctx
        self._config_check = ConfigCheck(ctx, self.timer)
        if not (ctx.is_main if owner is None else owner):
            OmegaConf.set_cache(self.config, resolver_cache)
        if not ctx.is_main:
            logging.getLogger("hydra._internal.core_plugins.basic_launcher").setLevel(logging.WARNING)
        with open_dict(self.config):
            self.config.hydra.sweep.dir = sweep_dir
        self._rank_overrides = self._make_rank_overrides(sweep_dir)

    def _make_rank_overrides(self, sweep_dir: str) -> list[str]:
        """Overrides this rank adds to every job: rank 0's sweep dir, per-rank log file, and no
        ``.hydra/`` writes on ranks other than 0 (two writers tear the files, docs/hydra-internals.md)."""
        extra = [f"hydra.sweep.dir={literal_value(sweep_dir)}"]
        if self.ctx.distributed:
            if OmegaConf.select(self.config, "hydra.job_logging.handlers.file") is not None:
                name = "'${hydra.runtime.output_dir}/${hydra.job.name}_rank" + str(self.ctx.rank) + ".log'"
                extra.append(f"hydra.job_logging.handlers.file.filename={name}")
            if not self.ctx.is_main:
                extra.append("hydra.output_subdir=null")
        return extra

    def run(self, launch: Launch) -> list[RankOutcome]:
        """Run the launch's jobs on this rank and return one outcome per payload.

        Consecutive trial numbers go to the launcher as one batch. With ``repeats > 1`` each trial runs once per
        seed (``seed_key=<seed>``, job dir ``<number>/seed<seed>``), whatever happened to the earlier seeds, so that
        all ranks make the same calls. A refit runs each payload once with a :class:`ReplayedTrial`, its return
        value becoming metrics (:func:`refit_metrics`). Failures are caught either way.
        """
        with self._launching(launch):
            if launch.refit or self.settings.repeats <= 1:
                return [o for batch in _consecutive(launch.payloads) for o in self._launch_batch(batch, [])]
            return [self._run_seeds(p) for p in launch.payloads]

    @contextlib.contextmanager
    def _launching(self, launch: Launch) -> Iterator[Launch]:
        """Hold ``launch`` in the runner's one slot, and its heartbeat open, while the round runs."""
        self._current = launch
        try:
            with launch.heartbeat:
                yield launch
        finally:
            self._current = None

    def _run_seeds(self, payload: TrialPayload) -> RankOutcome:
        """One launch per seed of ``payload`` (``repeats > 1``), combined into one outcome."""
        seeds = self.settings.seeds
        per_seed = []
        for seed in seeds:
            extra = [
                f"{self.settings.seed_key}={format_value(seed)}",
                f"hydra.sweep.subdir={format_value(f'{payload.number}/seed{seed}')}",
            ]
            per_seed.append(self._launch_batch([payload], extra)[0])
        return combine_repeats(payload.number, per_seed, seeds)

    def _launch_batch(self, batch: list[TrialPayload], extra: list[str]) -> list[RankOutcome]:
        """One ``launcher.launch`` of ``batch`` (consecutive trial numbers) with ``extra`` overrides."""
        outcomes: list[RankOutcome] = []
        self._launches += 1
        try:
            rets = self.launcher.launch(
                [list(p.overrides) + extra + self._rank_overrides for p in batch], initial_job_idx=batch[0].number
            )
            outcomes.extend(self._outcome(p, r) for p, r in zip(batch, rets))
        except Preempted:
            raise  # peers are being stopped too: do not wait for them
        except (KeyboardInterrupt, SystemExit) as e:
            self._log_failure(batch[0].what, e)
            outcomes.extend(RankOutcome(p.number, Outcome.INTERRUPTED, error=describe(e)) for p in batch)
        except BaseException as e:  # Hydra's own errors escape launch (docs/hydra-internals.md)
            self._log_failure(batch[0].what, e)
            outcomes.extend(RankOutcome(p.number, Outcome.FAILED, error=describe(e)) for p in batch)
        finally:
            self._logged.clear()
        if self.ctx.distributed or self.ctx.owns_group:
            self.ctx.check_group_alive("the trial's end", batch[0].number)
        self._config_check.meet(batch[0].number, None, outcomes[-1].error or "the job did not start")
        return outcomes

    def _outcome(self, payload: TrialPayload, ret: JobReturn) -> RankOutcome:
        preempted, signum, paused = self._stops.pop(payload.number, (False, None, False))
        signalled = signum is not None
        if preempted and (ret.status == JobStatus.COMPLETED or isinstance(job_return_value(ret), TrialPreempted)):
            step = self.book.steps.get(payload.number)
            if paused:  # its rung (ASHA, PBT): stored PRUNED, kept to be continued
                where = "at its interval's end" if self.settings.scheduler.name == "pbt" else "at its rung"
                return RankOutcome(payload.number, Outcome.PAUSED, step=payload.pause_at,
                                   error=f"{where}, step {payload.pause_at} (last reported step {step}); its "
                                   "checkpoint is kept to continue it", signalled=signalled)
            where = f" (last reported step {step})" if step is not None else ""
            how = signal_name(signum) if signum is not None else "SIGTERM"  # a peer's signal: torchrun's, likely
            return RankOutcome(payload.number, Outcome.PREEMPTED, error=f"preempted ({how}){where}", signalled=True)
        outcome = self._ended(payload, ret)
        return dataclasses.replace(outcome, signalled=True) if signalled else outcome

    def _ended(self, payload: TrialPayload, ret: JobReturn) -> RankOutcome:
        """The outcome of a job that was not preempted: its value(s), a prune, or its error."""
        if ret.status == JobStatus.COMPLETED:
            try:
                if self._current is not None and self._current.refit:
                    return RankOutcome(payload.number, Outcome.OK, (), metrics=refit_metrics(job_return_value(ret)))
                return RankOutcome(payload.number, Outcome.OK, objective_values(job_return_value(ret), self.settings.n_objectives))
            except ValueError as e:
                log.error("rank %d, %s failed: %s", self.ctx.rank, payload.what, e)
                return RankOutcome(payload.number, Outcome.FAILED, error=str(e))
        exc = job_return_value(ret)
        if isinstance(exc, optuna.TrialPruned):
            return RankOutcome(payload.number, Outcome.PRUNED)
        self._log_failure(payload.what, exc)
        state = Outcome.INTERRUPTED if isinstance(exc, (KeyboardInterrupt, SystemExit)) else Outcome.FAILED
        return RankOutcome(payload.number, state, error=_with_cause(exc))

    def _log_failure(self, what: str, exc: BaseException) -> None:
        """Log ``exc``'s traceback once, for ``what`` (``trial <n>`` or ``baseline <name>``)."""
        if any(e is exc for e in self._logged):
            return  # logged inside the job (:meth:`_run_task`), so its job log has it too
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        log.error("%s, %s failed:\n%s", self.ctx.label, what, tb)

    def _run_task(self, cfg: DictConfig) -> Any:
        """The task function the launcher calls, inside the job: :meth:`_run_checked_task`, noting in ``book`` the
        job's log files and how the task ended; a failure's traceback is logged here, into the job's log (C42)."""
        payload = self._job_payload()
        number = payload.number
        self.book.note_files(number)
        keep_other_trials_out()  # rank 0 serving other trial groups: their lines stay out of this job's log
        redact_job_files()  # Hydra just wrote the job's .hydra/*.yaml: no storage password in them (C59)
        self._rank_trial = None
        try:
            value = self._run_checked_task(cfg, payload)
        except optuna.TrialPruned:
            self.book.endings[number] = "was pruned"
            raise
        except TrialPreempted:
            self.book.endings[number] = "stopped on should_preempt()"
            raise
        except Preempted:  # SIGTERM on rank 0: the sweep unwinds and says so, no traceback
            raise
        except BaseException as e:
            self._log_failure(payload.what, e)
            self._logged.append(e)
            self.book.endings[number] = f"raised {describe(e)}"
            raise
        finally:
            self._said |= _scheduler_warnings(self.ctx, self._rank_trial, payload, self.settings.scheduler, self._said)
            self.book.steps[number] = getattr(self._rank_trial, "last_step", None)
            self._stops[number] = (bool(getattr(self._rank_trial, "preempted", False)), _signals.received(),
                                   bool(getattr(self._rank_trial, "paused", False)))
            self._rank_trial = None
        self.book.endings[number] = f"returned {_short(value)}"
        return value

    def _job_payload(self) -> TrialPayload:
        """The payload of the job Hydra is running: the launch's only one, or the one numbered ``job.num``."""
        launch = self._current
        assert launch is not None, "the task wrapper runs inside Runner.run only"
        if len(launch.payloads) == 1:
            return launch.payloads[0]
        return launch.payload(int(HydraConfig.get().job.num))

    def _run_checked_task(self, cfg: DictConfig, payload: TrialPayload) -> Any:
        """Check the config is equal on every rank, then run the user's task with :func:`current_trial` set."""
        launch = self._current
        assert launch is not None
        self._config_check.meet(payload.number, cfg)
        rank_trial: Any
        calls = None
        if launch.refit:
            rank_trial = ReplayedTrial(payload.number, payload.params, checkpoint_dir=payload.checkpoint_dir or None,
                                       resume_from=payload.resume_from, pause_at=payload.pause_at,
                                       refit=True, baseline=payload.baseline)
            params = payload.params
            log.info("%s runs the refit of %s with overrides %s", self.ctx.label,
                     payload.what, [o for o in payload.overrides if not o.startswith("hydra.")])
        else:
            optuna_trial = launch.optuna_trials.get(payload.number)
            params = payload.params or (dict(optuna_trial.params) if optuna_trial is not None else {})
            calls = CallCheck.for_task(self.ctx, payload.number, self._launches)
            rank_trial = RankTrial(payload.number, params, self.ctx, optuna_trial, self.settings.n_objectives, calls,
                                   checkpoint_dir=payload.checkpoint_dir or None, resume_from=payload.resume_from,
                                   inherited_steps=payload.inherited_steps, pause_at=payload.pause_at)
            log.info("%s runs trial %d with params %s", self.ctx.label, payload.number, params)
        self._rank_trial = rank_trial
        ended = calls.task() if calls is not None else contextlib.nullcontext()  # peers at a call learn it (C34)
        with trial_slot(rank_trial), self.timer.phase("task"), ended, \
                _signals.task_window(self.settings.preempt_grace_s), trial_tracking(payload.tracking_env):
            return self.task_function(cfg)

def _scheduler_warnings(ctx: RankComm, rank_trial: Any, payload: TrialPayload, scheduler: Any,
                        said: set[str]) -> set[str]:
    """On rank 0, the warnings a task's run under a pausing scheduler calls for, each once per sweep (``said``:
    those already given); returns the ones given now: ``"missed_pause"`` (it ran past its rung without asking
    ``should_preempt()``) and ``"past_the_end"`` (it reported a step past ``max_steps``: the rungs are in another
    unit than its reports, as a new user's ``max_steps=32`` against the HF glue's thousandths of an epoch)."""
    if not ctx.is_main or rank_trial is None:
        return set()
    now = set()
    if "missed_pause" not in said and getattr(rank_trial, "missed_pause", False):
        log.warning("trial %d reported step %s, past its rung (step %d), but did not call trial.should_preempt() "
                    "after that report, so it could not pause there and ran on: with hydra/sweeper/scheduler=asha or "
                    "pbt the task must check should_preempt() after each report (the HF and Lightning glue do; see "
                    "examples/ddp_mlp.py) and save a checkpoint on True", payload.number, rank_trial.last_step,
                    payload.pause_at)
        now.add("missed_pause")
    last = getattr(rank_trial, "last_step", None)
    if ("past_the_end" not in said and scheduler.pauses and scheduler.max_steps is not None and last is not None
            and last > scheduler.max_steps):
        log.warning("Trial %d reported step %d, past hydra.sweeper.scheduler.max_steps=%d: the scheduler's steps "
                    "(min_steps, max_steps, interval) are in the unit of the task's trial.report(value, step), and "
                    "every rung lies below max_steps. The HF glue's pruning_callback reports thousandths of an epoch "
                    "by default (step='epoch': one epoch = 1000), Lightning's the epoch number: "
                    "docs/how-to/schedulers.md", payload.number, last, scheduler.max_steps)
        now.add("past_the_end")
    return now


def _consecutive(payloads: Sequence[TrialPayload]) -> list[list[TrialPayload]]:
    """Split payloads into runs of consecutive trial numbers (one ``launcher.launch`` each)."""
    batches: list[list[TrialPayload]] = []
    for p in payloads:
        if batches and batches[-1][-1].number + 1 == p.number:
            batches[-1].append(p)
        else:
            batches.append([p])
    return batches


#: What torch.distributed says when the default group is initialised twice (checked with torch 2.13).
_INIT_TWICE = "default process group twice"


def _with_cause(exc: BaseException) -> str:
    """:func:`describe`, plus the cause and the fix for a task that created the default group itself (C24), or
    that started an MLflow run while the sweeper's is active (C57)."""
    text = describe(exc)
    if _INIT_TWICE in str(exc):
        text += (
            " -- the task called torch.distributed.init_process_group, but the sweeper already created the "
            "default process group and owns it for the whole sweep: guard the call with "
            "'if not torch.distributed.is_initialized():' (ProcessGroupMisuseError)"
        )
    return text + mlflow_cause(exc)


def _short(value: Any, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(exc: BaseException) -> str:
    """``"TypeName: first line of the message"`` for logs and verdicts."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
