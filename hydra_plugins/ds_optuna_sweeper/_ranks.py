"""The control plane: who am I, and rank 0 <-> all ranks messages, each wait bounded by a timeout.

Rank 0 alone talks to the Optuna study; the other ranks learn everything (trial payloads, verdicts,
stop orders) through these calls. Messages travel over a dedicated gloo process group, never the
training group (which may be NCCL and may be busy or broken after a failed trial). Every call here is
a collective: all ranks call it, in the same order, on every path, errors included.

torch is imported inside functions: :mod:`._trial`, which the package root imports at plugin discovery,
imports this module.
"""


from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ._errors import ControlPlaneError, ProcessGroupMisuseError, RankTimeoutError, TrainingGroupBrokenError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankContext:
    """This process's place in the torchrun world, and the control group.

    Attributes:
        rank: global rank (``RANK``), 0 for a single process.
        world_size: number of processes (``WORLD_SIZE``), 1 without torchrun.
        local_rank: rank on this node (``LOCAL_RANK``).
        timeout_s: seconds any wait in :meth:`broadcast` / :meth:`all_gather` may last.
        group: the gloo ``ProcessGroup`` used for control messages; ``None`` when ``world_size == 1``.
        backend: backend of the default (training) process group, for messages.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    timeout_s: float = 600.0
    group: Any = field(default=None, repr=False, compare=False)
    backend: str = "none"
    #: gloo group for trial results, with twice the timeout: a rank that failed early must outwait
    #: peers blocked in a training collective, which end after ``timeout_s``.
    patient_group: Any = field(default=None, repr=False, compare=False)
    #: On rank 0 under torchrun: this group's identity, kept across ``--max-restarts`` restarts
    #: (:func:`_group_identity`); ``None`` elsewhere.
    group_id: str | None = None
    #: On rank 0: True when torchrun restarted this group (its RUNNING trials belong to a dead attempt).
    restarted: bool = False
    #: This attempt's store (a prefix of torchrun's) when the sweeper created the group; else ``None``.
    store: Any = field(default=None, repr=False, compare=False)
    #: At world size 1: True when the sweeper created the one-process default group (it destroys it
    #: at the end); above 1 the sweeper always owns the default group.
    owns_group: bool = False
    #: At world size 1: the torchrun variables the sweeper set because they were unset
    #: (:func:`_single_process_env`); :func:`close_group` removes them again.
    env_set: tuple[str, ...] = ()

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the only rank that opens the study."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True when there is more than one rank to talk to."""
        return self.world_size > 1

    def broadcast(self, obj: Any, *, what: str, trial: int | None) -> Any:
        """Send rank 0's picklable ``obj`` to every rank.

        Collective: all ranks call it. Source: global rank 0.

        Args:
            obj: on rank 0 the object to send; ignored on other ranks (pass ``None``).
            what: what is being sent, for the timeout message (``"trial payload"``).
            trial: the trial number the message belongs to, or ``None`` outside a trial.

        Returns:
            Rank 0's object, equal on every rank. With one process, ``obj`` itself.

        Raises:
            RankTimeoutError: if nothing arrives within ``timeout_s`` seconds, or the connection to a peer
                broke (the message says why from the peers' records, :func:`record_leaving`).
        """
        if not self.distributed:
            return obj
        import torch.distributed as dist

        self._check_group_alive(what, trial)
        box = [(what, obj) if self.is_main else None]
        start = time.monotonic()
        try:
            dist.broadcast_object_list(box, src=0, group=self.group)
        except Exception as e:  # gloo raises RuntimeError / DistBackendError on timeout or peer loss
            raise self._timeout_error(what, trial, "rank 0", time.monotonic() - start, e) from e
        sent_what, sent = box[0]
        if sent_what != what:
            raise self._desync_error(what, trial, {0: sent_what})
        return sent

    def all_gather(self, obj: Any, *, what: str, trial: int | None, patient: bool = False) -> list[Any]:
        """Collect one picklable object from every rank, on every rank.

        Collective: all ranks call it.

        Args:
            obj: this rank's object.
            what: what is being gathered, for the timeout message (``"trial result"``).
            trial: the trial number the message belongs to, or ``None``.
            patient: wait up to ``2 * timeout_s`` (the trial-result gather after a task).

        Returns:
            ``[obj of rank 0, obj of rank 1, ...]``, length ``world_size``, equal on every rank.

        Raises:
            RankTimeoutError: if a rank does not answer within ``timeout_s`` seconds, or the connection to
                it broke (the message says why from the peers' records, :func:`record_leaving`).
        """
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        self._check_group_alive(what, trial)
        out: list[Any] = [None] * self.world_size
        start = time.monotonic()
        arrival = self._arrive(what, trial) if patient else None
        try:
            group = self.patient_group if patient and self.patient_group is not None else self.group
            dist.all_gather_object(out, (what, obj), group=group)
        except Exception as e:
            limit = self.timeout_s * (2 if patient else 1)
            missing = self._missing(arrival)
            peer = f"rank(s) {missing}, which never arrived" if missing else "all ranks"
            raise self._timeout_error(what, trial, peer, time.monotonic() - start, e, limit) from e
        others = {r: w for r, (w, _) in enumerate(out) if w != what}
        if others:
            raise self._desync_error(what, trial, others)
        return [o for _, o in out]

    def gather_errors(
        self, error: str | None, *, what: str, trial: int | None, value: Any = None
    ) -> tuple[list[tuple[int, str]], list[Any]]:
        """Gather every rank's error (or ``None``) and an optional value, on every rank.

        The one place for "each rank says ok-or-error, then everyone raises naming the failed ranks"
        (config check, training-group probe). Collective: all ranks call it, one gather.

        Args:
            error: this rank's one-line error, or ``None`` when it is fine.
            what: what is being gathered, for the timeout message.
            trial: the trial number, or ``None``.
            value: an extra picklable value to gather alongside (e.g. a config fingerprint).

        Returns:
            ``(errors, values)``: ``[(rank, error)]`` for the ranks that sent an error, in rank order,
            and every rank's ``value`` (length ``world_size``).

        Raises:
            RankTimeoutError: as :meth:`all_gather`.
        """
        pairs = self.all_gather((error, value), what=what, trial=trial)
        return [(r, err) for r, (err, _) in enumerate(pairs) if err], [v for _, v in pairs]

    def _check_group_alive(self, what: str, trial: int | None) -> None:
        """Name a destroyed default process group instead of reporting a timeout (case C24).

        Raises:
            ProcessGroupMisuseError: if no default process group exists any more.
        """
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ProcessGroupMisuseError(
                f"rank {self.rank}/{self.world_size} cannot send {what!r} for trial {trial}: the default process "
                "group was destroyed, most likely by the task (torch.distributed.destroy_process_group()). The "
                "sweeper owns the default group for the whole sweep and destroys it itself at the end; remove that "
                "call from the task (or guard it with hydra_plugins.ds_optuna_sweeper.in_trial())."
            )

    def _desync_error(self, what: str, trial: int | None, others: dict[int, str]) -> ControlPlaneError:
        return ControlPlaneError(
            f"rank {self.rank}/{self.world_size} expected {what!r} for trial {trial} but "
            + ", ".join(f"rank {r} sent {w!r}" for r, w in others.items())
            + ": the ranks took different paths through the sweep (a bug in the sweeper); stopping."
        )

    def _arrive(self, what: str, trial: int | None) -> str | None:
        """Mark this rank's arrival at a gather in torchrun's store, so a timeout can name who never came."""
        if self.store is None:
            return None
        key = f"ds_optuna/arrived/{what}/{trial}"
        try:
            self.store.set(f"{key}/{self.rank}", "1")
        except Exception:  # naming the absent rank is a courtesy; the gather itself decides
            return None
        return key

    def _missing(self, key: str | None) -> list[int]:
        """Ranks without an arrival mark under ``key`` (empty when unknown)."""
        if key is None or self.store is None:
            return []
        try:
            return [r for r in range(self.world_size) if not self.store.check([f"{key}/{r}"])]
        except Exception:
            return []

    def _timeout_error(
        self, what: str, trial: int | None, peer: str, waited_s: float, cause: BaseException,
        limit_s: float | None = None,
    ) -> RankTimeoutError:
        trial_text = f"trial {trial}'s" if trial is not None else "the sweep's"
        limit = limit_s or self.timeout_s
        if waited_s < 0.5 * limit:  # not a timeout: the connection to a peer broke; say why from the records (C41)
            waiting = f"{trial_text} {what} from {peer} on the gloo control group"
            records = leaving_records(self.store, self.world_size)
            left = {r: why for r, why in (records or {}).items() if r != self.rank}
            if left:
                return RankTimeoutError(
                    f"rank {self.rank}/{self.world_size} stopped waiting for {waiting} after {waited_s:.1f} s: "
                    + "; ".join(f"rank {r} {why}" for r, why in sorted(left.items())) + "."
                )
            silent = [r for r in range(self.world_size) if r != self.rank]
            known = "no exit recorded: killed or crashed" if records is not None else "no torchrun store to tell why"
            return RankTimeoutError(
                f"rank {self.rank}/{self.world_size} lost the connection to rank(s) {silent} after {waited_s:.1f} s "
                f"while waiting for {waiting} ({known}; {cause}); see torchrun's output and the per-rank logs in the "
                "job dir."
            )
        return RankTimeoutError(
            f"rank {self.rank}/{self.world_size} waited {waited_s:.1f} s (limit {limit_s or self.timeout_s:g} s) for "
            f"{trial_text} {what} from {peer} on the gloo control group and gave up ({cause}). A rank may "
            "have crashed or be stuck in user code; see the per-rank logs in the job dir. Raise "
            "hydra.sweeper.rank_timeout if that gap is expected."
        )

    def describe(self) -> str:
        """One line for the log: rank, world size, local rank, backends, timeout."""
        return (
            f"rank {self.rank}/{self.world_size} (local rank {self.local_rank}), training backend "
            f"{self.backend}, control plane {'gloo' if self.distributed else 'none'}, rank_timeout "
            f"{self.timeout_s:g} s"
        )


def env_world() -> tuple[int, int, int]:
    """``(rank, world_size, local_rank)`` from torchrun's environment variables (0, 1, 0 without)."""
    return (
        int(os.environ.get("RANK", "0")),
        int(os.environ.get("WORLD_SIZE", "1")),
        int(os.environ.get("LOCAL_RANK", "0")),
    )


def default_backend() -> str:
    """``"cpu:gloo,cuda:nccl"`` when CUDA is usable, else ``"gloo"``."""
    import torch

    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def uses_nccl(backend: str) -> bool:
    """True when ``backend`` (``"nccl"``, ``"cpu:gloo,cuda:nccl"``...) sends CUDA tensors through NCCL."""
    return "nccl" in str(backend).lower()


def _bind_device(backend: str, local_rank: int) -> dict[str, Any]:
    """Select this rank's GPU before any group exists, and bind the default group to it.

    With NCCL and no device chosen, the first collective (or a barrier) runs on the current device,
    GPU 0, on every rank of a node, before the Trainer sets the device (PyTorch warns: "using GPU 0
    to perform barrier as devices used by this process are currently unknown"). The device is
    ``cuda:LOCAL_RANK`` (torchrun's convention), set with ``torch.cuda.set_device`` and passed as
    ``init_process_group(device_id=...)`` (torch.distributed documentation), which also lets NCCL
    connect eagerly. Without NCCL, or without CUDA, nothing changes (CPU runs are untouched).

    Returns:
        The extra keyword arguments for ``init_process_group``: ``{"device_id": device}`` or ``{}``.
    """
    import torch

    if not uses_nccl(backend) or not torch.cuda.is_available():
        return {}
    device = torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
    torch.cuda.set_device(device)
    return {"device_id": device}


def probe_tensor(backend: str) -> Any:
    """A one-element tensor on the device the default group's backend expects for it.

    ``cpu:gloo,cuda:nccl``: a CPU tensor (gloo half, which a failed trial's NCCL state cannot block).
    ``nccl`` alone: a tensor on this rank's current CUDA device, since NCCL takes no CPU tensor.
    """
    import torch

    backend = str(backend).lower()
    if backend == "nccl" or (uses_nccl(backend) and "cpu:" not in backend):
        return torch.zeros(1, device=torch.device("cuda", torch.cuda.current_device()))
    return torch.zeros(1)


def setup_ranks(timeout_s: float, backend: str | None = None) -> RankContext:
    """Join the torchrun world (if any) and create the gloo control group.

    When ``WORLD_SIZE > 1`` and no default group exists, one is created from ``env://`` with
    ``timeout=timeout_s`` (a training collective stuck on a dead peer also ends then), bound to this
    rank's GPU with NCCL. At world size 1 (``python app.py -m``, or torchrun with one process) a
    one-process default group is created (:func:`_single_process_group`). An existing default group is
    kept (re-creating one fails, NOTES-cpu.md).

    Args:
        timeout_s: seconds; the control group's (and a newly created default group's) timeout.
        backend: backend for a newly created default group; ``None`` picks :func:`default_backend`.

    Returns:
        The :class:`RankContext` for this process.

    Raises:
        ValueError: if ``timeout_s`` is not positive (``Settings`` refuses it earlier, naming the key).
    """
    if not timeout_s or timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s=}")
    rank, world_size, local_rank = env_world()
    timeout = timedelta(seconds=float(timeout_s))
    if world_size <= 1:
        group_id, restarted = _group_identity(_launcher_store(timeout), is_main=True)
        env_set = _single_process_env()
        chosen, owns = _single_process_group(backend, timeout, local_rank)
        return RankContext(0, 1, local_rank, float(timeout_s), None, chosen, group_id=group_id, restarted=restarted,
                           owns_group=owns, env_set=env_set)
    import torch.distributed as dist

    store = None
    if not dist.is_initialized():
        # The rendezvous store can outlive a torchrun restart (--max-restarts); keys left by the
        # previous attempt then send gloo to dead peers ("connectFullMesh failed ... Connection
        # refused", seen here). A prefix per attempt keeps each attempt's keys apart.
        store, rank_, world_size_ = next(dist.rendezvous("env://", timeout=timeout))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        chosen = backend or default_backend()
        dist.init_process_group(
            backend=chosen,
            store=dist.PrefixStore(f"ds_optuna/attempt_{attempt}", store),
            rank=rank_,
            world_size=world_size_,
            timeout=timeout,
            **_bind_device(chosen, local_rank),
        )
    group = dist.new_group(backend="gloo", timeout=timeout)
    patient_group = dist.new_group(backend="gloo", timeout=2 * timeout)
    group_id, restarted = _group_identity(store, is_main=dist.get_rank() == 0)
    attempt_store = None
    if store is not None:
        attempt_store = dist.PrefixStore(f"ds_optuna/control_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
    return RankContext(
        store=attempt_store,
        patient_group=patient_group,
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        timeout_s=float(timeout_s),
        group=group,
        backend=str(dist.get_backend()),
        group_id=group_id,
        restarted=restarted,
    )


def _single_process_group(backend: str | None, timeout: timedelta, local_rank: int) -> tuple[str, bool]:
    """At world size 1, create a one-process default group, so the task's code is the same as above 1 (C39).

    A task written for torchrun guards its ``init_process_group`` with ``if not dist.is_initialized():``
    and wraps its model in ``DistributedDataParallel``; started with ``python app.py -m`` it would call
    ``init_process_group`` with ``env://``, which needs ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT`` ("environment variable RANK expected, but not set"). The group is rendezvoused on an
    in-process ``HashStore`` (no port is opened). An existing default group is kept and left alone.

    Returns:
        ``(backend of the default group or "none", True when this call created it)``. A failure to create
        it is logged and the sweep goes on without a group (as before; a task that needs none still runs).
    """
    import torch.distributed as dist

    if not dist.is_available():
        return "none", False
    if dist.is_initialized():
        return str(dist.get_backend()), False
    chosen = backend or default_backend()
    try:
        dist.init_process_group(backend=chosen, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout,
                                **_bind_device(chosen, local_rank))
    except Exception:  # the sweep can still run tasks that need no group
        log.warning("could not create a one-process default process group (%s)", chosen, exc_info=True)
        return "none", False
    return str(dist.get_backend()), True


#: What a one-process torchrun worker finds in its environment (torch.distributed.run documentation),
#: except ``MASTER_PORT``, chosen free when set.
_SINGLE_PROCESS_ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1"}


def _single_process_env() -> tuple[str, ...]:
    """At world size 1, set the torchrun variables that are unset, as a one-process torchrun worker has them.

    Code written for torchrun reads them: DeepSpeed (``deepspeed.zero.Init`` reads ``LOCAL_RANK``, its
    ``init_distributed`` wants ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``
    or tries MPI discovery), and many DDP scripts (``int(os.environ["LOCAL_RANK"])``). With the
    one-process group these make ``python app.py -m`` look like ``torchrun --nproc_per_node 1 app.py -m``
    to the task (case C39). ``TORCHELASTIC_RUN_ID`` stays unset: rerun lines still say ``python``.

    Returns:
        The names set (the others were already set and are left as they were).
    """
    import socket

    added = {k: v for k, v in _SINGLE_PROCESS_ENV.items() if k not in os.environ}
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:  # nothing listens on it (the group uses a HashStore); a free one all the same
            s.bind(("127.0.0.1", 0))
            added["MASTER_PORT"] = str(s.getsockname()[1])
    os.environ.update(added)
    return tuple(added)


#: Key prefix, in an attempt's store (:attr:`RankContext.store`), of each rank's record of why it leaves the sweep.
LEAVING_KEY = "ds_optuna/leaving"


def record_leaving(store: Any, rank: int, why: str) -> None:
    """Record in torchrun's store why this rank is leaving the sweep, before it exits (case C41).

    A peer whose wait on the control plane breaks reads it (:func:`leaving_records`) and says what
    happened instead of guessing that a rank died. The first record of a rank stays (the signal handler
    writes "was interrupted by SIGINT" before the sweep unwinds and writes its outcome). Never raises, and
    does nothing without a store (world size 1, or a default group the task created).

    Args:
        store: the attempt's store (:attr:`RankContext.store`), or ``None``.
        rank: this process's global rank.
        why: a verb phrase after "rank N": ``"was interrupted by SIGINT"``, ``"was interrupted by SIGTERM"``,
            ``"stopped: <TypeName: first line>"``, ``"finished the sweep"``.
    """
    if store is None:
        return
    key = f"{LEAVING_KEY}/{rank}"
    try:
        if not store.check([key]):
            store.set(key, why)
    except Exception:  # leaving matters more than the record (torchrun may already be gone)
        log.debug("could not record why rank %d leaves", rank, exc_info=True)


def leaving_records(store: Any, world_size: int) -> dict[int, str] | None:
    """``{rank: why}`` of the ranks that recorded why they left (:func:`record_leaving`); ``None`` without a
    store or when it does not answer. No waiting: a rank with no record is absent."""
    if store is None:
        return None
    out: dict[int, str] = {}
    try:
        for r in range(world_size):
            key = f"{LEAVING_KEY}/{r}"
            if store.check([key]):
                out[r] = store.get(key).decode()
    except Exception:
        return None
    return out


def interruption(records: dict[int, str] | None) -> tuple[int, list[int]] | None:
    """``(signal number, [ranks])`` of the first signal the records name ("was interrupted by SIGINT"), or ``None``."""
    import re
    import signal

    found: dict[int, list[int]] = {}
    for r, why in sorted((records or {}).items()):
        m = re.match(r"was interrupted by (SIG[A-Z]+)", why)
        if m and hasattr(signal, m.group(1)):
            found.setdefault(int(getattr(signal, m.group(1))), []).append(r)
    if not found:
        return None
    signum = next(iter(found))
    return signum, found[signum]


#: Key of the torchrun group's identity in the launcher's store (outside every attempt's prefix).
GROUP_ID_KEY = "ds_optuna/group_id"


def _launcher_store(timeout: timedelta) -> Any:
    """A client of torchrun's store for a one-process world under torchrun; ``None`` without torchrun."""
    if not os.environ.get("TORCHELASTIC_RUN_ID") or not os.environ.get("MASTER_ADDR"):
        return None
    import torch.distributed as dist

    try:
        store, _, _ = next(dist.rendezvous("env://", timeout=timeout))
    except Exception:  # no reachable store: heartbeats alone decide about abandoned trials
        log.warning("torchrun's store is not reachable; a restarted group will not close its own trials", exc_info=True)
        return None
    return store


def _group_identity(store: Any, *, is_main: bool) -> tuple[str | None, bool]:
    """This torchrun group's identity and whether torchrun restarted it (case C29).

    ``TORCHELASTIC_RUN_ID`` is no identity: most launch lines leave it at ``none`` (no ``--rdzv-id``),
    so several live groups share it, and a group that took another group's running trial for its own
    failed it. Instead, rank 0 of the first attempt writes a random id into torchrun's store, which
    outlives ``--max-restarts`` restarts (the store belongs to torchrun's agent or rendezvous, not to
    the workers); a later attempt (``TORCHELASTIC_RESTART_COUNT > 0``) reads the same id back.

    Args:
        store: torchrun's store (not an attempt's prefix store), or ``None``.
        is_main: global rank 0 (only it talks to the study).

    Returns:
        ``(group id or None, restarted)``; ``restarted`` is True only on a later attempt whose first
        attempt wrote the id, i.e. when trials tagged with the id can only belong to a dead attempt.
    """
    if store is None or not is_main:
        return None, False
    import uuid

    try:
        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 and store.check([GROUP_ID_KEY]):
            return store.get(GROUP_ID_KEY).decode(), True
        group_id = uuid.uuid4().hex
        store.set(GROUP_ID_KEY, group_id)
        return group_id, False
    except Exception:  # a store without these calls: heartbeats alone decide
        log.warning("cannot keep a group id in torchrun's store", exc_info=True)
        return None, False


def probe_training_group(ctx: RankContext, trial: int, trial_error: str | None, resume_hint: str = "") -> None:
    """After a failed trial, check that the training process group still works on every rank.

    Collective: one ``all_reduce`` on the default group (on the device its backend expects,
    :func:`probe_tensor`), then one control-plane gather. A rank
    released from a training collective by its timeout leaves the group broken: gloo closes the pair
    for good ("Application timeout caused pair closure"), and re-creating the default group in the
    same processes fails (NOTES-cpu.md). Then every rank stops with a non-zero exit so that
    ``torchrun --max-restarts`` restarts the group, which resumes the study from storage. A healthy
    group (the failure left no collective unmatched) goes on.

    Args:
        ctx: this rank's context (world size above 1).
        trial: the failed trial's number.
        trial_error: the failed trial's agreed error, for the message.
        resume_hint: the exact command that resumes the study, for the message.

    Raises:
        TrainingGroupBrokenError: on every rank when the probe failed on any rank.
    """
    import torch.distributed as dist

    mine: str | None = None
    try:
        dist.all_reduce(probe_tensor(dist.get_backend()))
    except Exception as e:
        text = str(e).strip()
        mine = f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
    errors, _ = ctx.gather_errors(mine, what="training group probe", trial=trial)
    if errors:
        raise TrainingGroupBrokenError(
            f"trial {trial} failed ({trial_error}) and left the training process group broken: "
            + "; ".join(f"rank {r}: {err}" for r, err in errors)
            + ". Trial told FAIL; every rank exits non-zero so that torchrun --max-restarts N restarts the "
            "group, which resumes the study from storage"
            + (f"; without --max-restarts, resume with: {resume_hint}" if resume_hint else ".")
        )


def wait_for_rank0_results(ctx: RankContext, *, is_done: bool, timeout_s: float = 120.0) -> None:
    """Hold the other ranks until rank 0 wrote the results and plots (or ``timeout_s`` passed).

    When a sweep stops with an error, every rank raises at once; a rank that exits non-zero makes
    torchrun stop the others with SIGTERM, which cut rank 0's results and plots short. Rank 0 calls
    this with ``is_done=True`` after writing them; the others wait for that mark in the store. No
    collective: a dead rank 0 only costs the others ``timeout_s`` (torchrun stops them sooner).
    """
    if ctx.store is None or not ctx.distributed:
        return
    key = "ds_optuna/results_written"
    try:
        if is_done:
            ctx.store.set(key, "1")
        else:
            ctx.store.wait([key], timedelta(seconds=timeout_s))
    except Exception:  # leaving matters more than waiting
        log.debug("waiting for rank 0's results ended early", exc_info=True)


def close_group(env_set: tuple[str, ...] = ()) -> None:
    """Destroy the default process group the sweeper created (never raises), and remove the environment
    variables ``env_set`` (:attr:`RankContext.env_set`) that the sweeper set for it."""
    import gc

    import torch.distributed as dist

    for name in env_set:
        os.environ.pop(name, None)

    try:
        if dist.is_initialized():
            gc.collect()  # drop DDP reducers of finished trials before their group goes away
            dist.destroy_process_group()
    except Exception:  # the sweep's outcome matters more than a clean teardown
        log.debug("destroy_process_group failed", exc_info=True)
