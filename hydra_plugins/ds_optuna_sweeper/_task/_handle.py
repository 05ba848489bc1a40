"""The trial handle: what a task sees of the trial it runs, on every rank, and the live trial of a sweep.

:func:`._slot.current_trial` returns a :class:`TrialHandle`: a :class:`RankTrial` for a live trial of a sweep,
or a :class:`._replayed.ReplayedTrial`. A live trial's rank 0 holds the real ``optuna.Trial`` and decides; every
other rank receives rank 0's answer over the control plane, so all ranks leave a pruned trial at the same step
and use bit-identical suggested values (a pickled float64, not the float32 tensor round trip of
optuna-integration's distributed trial).

optuna and torch are imported inside functions: the package root imports this module, and Hydra's plugin
scanner imports the root in every Hydra app.
"""

from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:  # optuna and torch (under _comm._ranks) are imported inside functions at run time
    import optuna

    from .._errors import RemoteError
    from .._comm._ranks import RankComm
    from .._comm._arrivals import CallCheck


@runtime_checkable
class TrialHandle(Protocol):
    """What the task sees of its trial: the interface :class:`RankTrial` and :class:`._replayed.ReplayedTrial` share.

    Write task code against this type (``trial: TrialHandle = current_trial()``). A live trial's
    ``report``, ``should_prune``, ``suggest_*`` and ``set_user_attr`` are collectives (see
    :class:`RankTrial`); a replayed trial's make no call at all.

    The attributes are :class:`RankTrial`'s.
    """

    number: int
    params: dict
    n_objectives: int
    rank: int
    world_size: int
    last_step: Optional[int]
    replayed: bool
    checkpoint_dir: Optional[str]
    resume_from: Optional[str]
    preempted: bool

    def report(self, value: float, step: int) -> None:
        """Report an intermediate objective ``value`` at int ``step`` (>= 0)."""

    def should_prune(self) -> bool:
        """Whether the pruner stops this trial now (the same answer on every rank)."""

    def prune_if_needed(self) -> None:
        """Raise ``optuna.TrialPruned`` on every rank when :meth:`should_prune` says so."""

    def should_preempt(self) -> bool:
        """Whether the run was asked to stop (SIGTERM or Ctrl-C on any rank), the same answer on every rank: save a
        checkpoint in ``checkpoint_dir`` and return (the trial is re-queued and resumes from it)."""

    def suggest_float(
        self, name: str, low: float, high: float, *, step: Optional[float] = None, log: bool = False
    ) -> float:
        """A float for ``name`` (``optuna.Trial.suggest_float``'s arguments)."""

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        """An int for ``name`` (``optuna.Trial.suggest_int``'s arguments)."""

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        """One of ``choices`` for ``name``."""

    def set_user_attr(self, key: str, value: Any) -> None:
        """Store ``value`` as the trial's user attribute ``key`` (rank 0's value is kept)."""

    def record_on_rank0(self, key: str, value: Any) -> None:
        """Store rank 0's ``value`` as user attribute ``key``; no message between ranks."""

    def optuna_trial(self) -> "optuna.trial.Trial":
        """The trial as an ``optuna.Trial`` for Optuna's APIs that take one (``optuna.artifacts``), on the
        trial's rank 0 of a live trial."""


class RankTrial:
    """The running trial as the task sees it, on any rank.

    .. note::
        ``report``, ``should_prune`` and ``suggest_*`` are collectives when the world size is above 1:
        every rank must call them in the same order (as with any ``torch.distributed`` call). Before each,
        the ranks meet in torchrun's store (:class:`.._comm._arrivals.CallCheck`): a rank at another call, or
        whose task ended without this one, fails the trial at once with :class:`CallMismatchError` naming it
        and the call; a rank (or rank 0's answer) that does not come within ``hydra.sweeper.rank_timeout``
        seconds fails it then. An exception raised by Optuna on rank 0 is raised on every rank with the same
        type and message (:func:`_rebuilt`), so all ranks leave together.

    Attributes:
        number: the Optuna trial number, equal on every rank.
        params: ``{param name: value}``, the params sampled so far (by the sweeper, then by ``suggest_*``).
        n_objectives: the study's number of objectives (``hydra.sweeper.direction``); ``report`` and pruning
            need exactly 1.
        rank: this process's rank in the trial's world (``RANK`` inside the task): with
            ``hydra.sweeper.n_jobs`` above 1, its rank in its trial group, not the launch's global rank.
        world_size: number of ranks taking part in the trial.
        last_step: the step of the last ``report`` call, or ``None``.
        replayed: ``True`` for a finished trial replayed in a refit or rerun line (nothing is reported
            or stored), ``False`` for a live trial of the sweep.
        checkpoint_dir: the directory where the task saves the trial's checkpoints (absolute; the same
            for every retry of the trial, :mod:`._checkpoints`); ``None`` outside a sweep's trial (a
            rerun line; a refit without ``refit.from_checkpoint``).
        resume_from: the newest complete checkpoint there when the trial started (a ``checkpoint-<step>``
            directory or a ``*.ckpt`` file), or ``None``: start from step 0.
        preempted: ``should_preempt()`` answered True (on every rank alike).
    """

    #: A live trial of the sweep (see :class:`._replayed.ReplayedTrial`).
    replayed = False

    def __init__(
        self, number: int, params: dict, ctx: Optional["RankComm"] = None,
        optuna_trial: Optional["optuna.trial.Trial"] = None, n_objectives: int = 1, calls: Optional["CallCheck"] = None,
        *, checkpoint_dir: Optional[str] = None, resume_from: Optional[str] = None, inherited_steps: Sequence[int] = (),
        pause_at: Optional[int] = None,
    ) -> None:
        from .._comm._ranks import RankComm

        self.number = number
        self.n_objectives = int(n_objectives)
        self.params = dict(params)
        self._ctx = ctx if ctx is not None else RankComm()
        self._trial = optuna_trial  # optuna.trial.Trial on rank 0, None elsewhere
        self.rank = self._ctx.rank
        self.world_size = self._ctx.world_size
        self.last_step: Optional[int] = None
        self._calls = calls  # the channel's arrival check of the trial calls (_comm._arrivals), or None: not checked
        self.checkpoint_dir = checkpoint_dir
        self.resume_from = resume_from
        self.preempted = False
        #: ``should_preempt()`` answered True because the trial reached its ASHA rung (``pause_at``), not a signal.
        self.paused = False
        self._pause_at = pause_at  # the step this trial pauses at (hydra/sweeper/scheduler=asha or pbt), or None
        #: the steps a retried trial inherited from the attempt it continues: ``report`` there is skipped.
        self._inherited = frozenset(int(s) for s in inherited_steps)
        if self._ctx.is_main and optuna_trial is None:
            raise ValueError(f"trial {number}: rank 0 needs the optuna.Trial; got None")

    def __repr__(self) -> str:
        return f"RankTrial(number={self.number}, rank={self.rank}/{self.world_size}, params={self.params})"

    def _on_rank0(self, what: str, fn: Callable[[], Any], call: str) -> Any:
        """Run ``fn`` on rank 0, broadcast its result (or its exception), return/raise on every rank; ``call``
        (``"report(step=3)"``) is checked first to be the call every rank makes now (case C34)."""
        from .._errors import RemoteError

        outcome: tuple = ("ok", None)
        failure: Optional[BaseException] = None
        if self._ctx.is_main:
            try:
                outcome = ("ok", fn())
            except BaseException as e:  # noqa: BLE001 - re-raised on every rank below
                failure = e
                outcome = ("error", RemoteError.from_exception(e, self.rank))
        kind, value = self._ctx.broadcast(outcome, what=what, trial=self.number, check=self._calls, call=call)
        if kind == "error":
            if failure is not None:
                raise failure  # rank 0: the exception itself, with its attributes and traceback
            raise _rebuilt(value)
        return value

    def report(self, value: float, step: int) -> None:
        """Report an intermediate objective ``value`` at ``step`` (an int >= 0, e.g. the global
        optimizer step or the epoch). Rank 0's value is stored; other ranks' values are ignored.

        Raises:
            NotImplementedError: for a multi-objective study (Optuna's rule: ``Trial.report``).
            CallMismatchError: if another rank does not make this call (case C34).
            RankTimeoutError: if rank 0 does not answer within ``rank_timeout`` seconds.
        """
        self.last_step = int(step)
        if int(step) in self._inherited:  # reported by the attempt this retry continues: kept as it was
            return
        if self.n_objectives > 1:  # every rank knows it: raise here, on every rank, with no message exchanged
            raise NotImplementedError(
                f"trial {self.number}: report() needs a single-objective study, but this study has "
                f"{self.n_objectives} directions; Optuna's pruners compare one intermediate value per step "
                "(Trial.report is single-objective only). Guard the call with 'if trial.n_objectives == 1:', "
                "or use one direction."
            )
        self._on_rank0("report", lambda: self._trial.report(float(value), int(step)), f"report(step={int(step)})")

    def should_prune(self) -> bool:
        """Whether the pruner stops this trial now; decided on rank 0, the same on every rank.

        Raises:
            RankTimeoutError: if rank 0 does not answer within ``rank_timeout`` seconds.
        """
        return bool(self._on_rank0("should_prune", lambda: self._trial.should_prune(), "should_prune()"))

    @property
    def missed_pause(self) -> bool:
        """The trial reported a step at or past its ASHA rung (``hydra/sweeper/scheduler=asha``) but never asked
        ``should_preempt()`` after it, so it could not pause there and ran on."""
        return (self._pause_at is not None and not self.preempted and self.last_step is not None
                and self.last_step >= self._pause_at)

    def prune_if_needed(self) -> None:
        """Raise ``optuna.TrialPruned`` on every rank when :meth:`should_prune` says so."""
        import optuna

        if self.should_prune():
            raise optuna.TrialPruned(f"trial {self.number} pruned at step {self.last_step}")

    def should_preempt(self) -> bool:
        """Whether this run must stop now: SIGTERM or SIGINT (Ctrl-C) reached any rank during the task (every
        rank's flag, :mod:`.._comm._signals`, OR-ed over the ranks), or the trial reached the step it pauses at under
        ``hydra/sweeper/scheduler=asha`` (its rung) or ``pbt`` (its interval's end) (:attr:`paused`); every rank
        answers the same at the same call. Once True it stays True (no further exchange). The first call makes
        the process preemption-aware: from then on SIGTERM or SIGINT during a task only sets the flag.

        On True: save a checkpoint in :attr:`checkpoint_dir` and return from the task (or raise
        :class:`~.._errors.TrialPreempted`). After the signal the sweeper closes the trial as interrupted,
        re-queues it and the launch exits 143 (130 after Ctrl-C), and the next launch's retry gets
        :attr:`resume_from`; after a pause the trial is kept and its continuation gets :attr:`resume_from`. At the
        rung a pause wins over a signal that came with it (the trial is kept, paused, and the launch still exits 143).

        Raises:
            CallMismatchError: if another rank does not make this call.
            RankTimeoutError: if a peer does not answer within ``rank_timeout`` seconds.
        """
        from .._comm import _signals

        _signals.mark_aware()
        if self.preempted:
            return True
        flag = _signals.received()
        rung = self._pause_at is not None and self.last_step is not None and self.last_step >= self._pause_at
        if self.world_size > 1:
            flags = self._ctx.all_gather((flag, rung), what="should_preempt", trial=self.number, check=self._calls,
                                         call="should_preempt()")
            flag, rung = any(f for f, _ in flags), any(r for _, r in flags)
        self.preempted = bool(flag or rung)
        # At its rung the trial pauses there even when a signal came with it: re-queued as a preempted trial, its
        # retry resumed after the rung and ran on without ASHA's decision there (a newcomer's SIGTERM at step 4).
        # The signal still ends the launch once the round is told.
        self.paused = bool(rung)
        if flag:
            _signals.acknowledge()
        return self.preempted

    def _suggest(self, name: str, fn: Callable[[], Any], kind: str) -> Any:
        value = self._on_rank0(f"suggest {name}", fn, f"suggest_{kind}({name!r})")
        self.params[name] = value
        return value

    def suggest_float(
        self, name: str, low: float, high: float, *, step: Optional[float] = None, log: bool = False
    ) -> float:
        """``optuna.Trial.suggest_float`` on rank 0; every rank gets the exact float64 value."""
        return self._suggest(name, lambda: self._trial.suggest_float(name, low, high, step=step, log=log), "float")

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        """``optuna.Trial.suggest_int`` on rank 0; every rank gets the same int."""
        return self._suggest(name, lambda: self._trial.suggest_int(name, low, high, step=step, log=log), "int")

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        """``optuna.Trial.suggest_categorical`` on rank 0; every rank gets the same choice."""
        return self._suggest(name, lambda: self._trial.suggest_categorical(name, list(choices)), "categorical")

    def set_user_attr(self, key: str, value: Any) -> None:
        """``optuna.Trial.set_user_attr`` on rank 0 (collective, like the others)."""
        self._on_rank0(f"user attr {key}", lambda: self._trial.set_user_attr(key, value), f"set_user_attr({key!r})")

    def record_on_rank0(self, key: str, value: Any) -> None:
        """Store rank 0's ``value`` as a user attribute; a no-op on other ranks. Not a collective: safe
        on any exit path of a trial (a teardown after an error), where peers may not call it."""
        if self._trial is not None:
            self._trial.set_user_attr(key, value)

    def optuna_trial(self) -> "optuna.trial.Trial":
        """This trial as an ``optuna.Trial``, on the trial's rank 0, for Optuna's APIs that take one: the FAQ's
        ``optuna.artifacts.upload_artifact(artifact_store=..., file_path=..., study_or_trial=trial.optuna_trial())``
        and ``get_all_artifact_meta`` (case C53, optuna#6015). Rank 0 of the launch gives the study's own
        ``optuna.Trial``; rank 0 of another trial group (``n_jobs`` above 1) one whose artifact storage calls
        run on global rank 0, which alone opens the study (:mod:`.._loop._remote_study`). Not a collective.
        Report, prune and suggest through this handle, not through the ``optuna.Trial``: those are collectives.

        Raises:
            GlueUsageError: on any rank but the trial's rank 0 (only rank 0 holds the trial; upload from there:
                ``if trial.rank == 0:``).
        """
        from .._errors import GlueUsageError

        if self._trial is None:
            raise GlueUsageError(
                f"trial {self.number}: optuna_trial() is on the trial's rank 0 only, and this is rank {self.rank} of "
                f"{self.world_size}: upload artifacts from rank 0 ('if trial.rank == 0: "
                "optuna.artifacts.upload_artifact(..., study_or_trial=trial.optuna_trial())')")
        forwarded = getattr(self._trial, "optuna_trial", None)  # another trial group's StudyTrial
        return forwarded() if callable(forwarded) else self._trial


def _rebuilt(remote: "RemoteError") -> BaseException:
    """Rank 0's exception, rebuilt on this rank (:meth:`._errors.RemoteError.to_exception`, ``wide=True``);
    attributes of the original do not cross."""
    return remote.to_exception(wide=True)
