"""The control plane's communication handle (:class:`RankComm`): rank 0 <-> all ranks messages over a dedicated
gloo group (never the training group, which may be NCCL and busy or broken after a failed trial), each wait
bounded by a timeout. Every call is a collective: all ranks make it, in the same order, on every path, errors
included. torch is imported inside functions (the package root imports this module at plugin discovery).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from .._errors import ControlPlaneError, PeerLostError, ProcessGroupMisuseError, RankTimeoutError
from ._arrivals import CallCheck, absent_after, mark_arrival, rank_on_host, ranks_on_hosts
from ._launch_end import launch_end
from ._whoami import rank_label

log = logging.getLogger(__name__)


class PeersBlockedError(ControlPlaneError):
    """Raised on a rank whose task failed when a peer did not reach the trial result's gather within the grace
    (case C45; e.g. it waits in DDP's all-reduce); the rank then ends the launch
    (:func:`.._loop._exits.end_the_launch`). ``missing``: the global ranks without an arrival mark, in rank order."""

    def __init__(self, message: str, missing: list[int] | None = None) -> None:
        super().__init__(message)
        self.missing = list(missing or [])


@dataclass(frozen=True)
class RankComm:
    """This process's place in the torchrun world, its control groups and torchrun's store. Built by
    :func:`.._loop._group.setup_ranks`; ``RankComm()`` is the one-process handle.

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
    #: gloo group for trial results, with twice the timeout (peers blocked in a training collective end after
    #: ``timeout_s``).
    patient_group: Any = field(default=None, repr=False, compare=False)
    #: On rank 0 under torchrun: this group's identity across restarts (:func:`.._loop._group._group_identity`).
    group_id: str | None = None
    #: On rank 0: True when torchrun restarted this group (its RUNNING trials belong to a dead attempt).
    restarted: bool = False
    #: This attempt's store (a prefix of torchrun's) when the sweeper created the group; else ``None``.
    store: Any = field(default=None, repr=False, compare=False)
    #: True when the sweeper created the default process group (:func:`.._loop._group.close_group` destroys it).
    owns_group: bool = False
    #: At world size 1: the torchrun variables the sweeper set (:func:`.._loop._group._single_process_env`).
    env_set: tuple[str, ...] = ()
    #: torchrun's restart count of this group (:func:`._whoami.restart_count`); 0 without torchrun.
    attempt: int = 0
    #: torchrun's store itself (it outlives ``--max-restarts`` restarts), or ``None`` (no torchrun, or the task
    #: made the default group).
    launcher_store: Any = field(default=None, repr=False, compare=False)

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the only rank that opens the study."""
        return self.rank == 0

    @property
    def label(self) -> str:
        """``"rank 1/2"`` (``"rank 1/2 of trial group 1/4"`` inside a trial group), for messages."""
        return rank_label(self.rank, self.world_size)

    @property
    def distributed(self) -> bool:
        """True when there is more than one rank to talk to."""
        return self.world_size > 1

    def broadcast(self, obj: Any, *, what: str, trial: int | None, check: CallCheck | None = None,
                  call: str | None = None) -> Any:
        """Send rank 0's picklable ``obj`` to every rank.

        Args:
            obj: on rank 0 the object to send; ignored on other ranks (pass ``None``).
            what: what is being sent, for the timeout message (``"trial payload"``).
            trial: the trial number the message belongs to, or ``None`` outside a trial.
            check: a trial call's arrival check (:class:`._arrivals.CallCheck`): every rank must be at ``call``
                (``"report(step=3)"``) before the broadcast (case C34); ``None``: none.
            call: the trial call's label for ``check`` (default ``what``).

        Returns:
            Rank 0's object, equal on every rank. With one process, ``obj`` itself.

        Raises:
            CallMismatchError: ``check`` found a rank at another call, or not at this one in time.
            RankTimeoutError: if nothing arrives within ``timeout_s`` seconds.
            PeerLostError: the connection to a peer broke before that (the message says why, from
                :func:`._launch_end.launch_end`).
        """
        if not self.distributed:
            return obj
        import torch.distributed as dist

        self._enter(what, trial, check, call)
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

    def all_gather(self, obj: Any, *, what: str, trial: int | None, patient: bool = False,
                   grace_s: float | None = None, check: CallCheck | None = None, call: str | None = None) -> list[Any]:
        """Collect one picklable object from every rank, on every rank.

        Args:
            obj: this rank's object.
            what: what is being gathered, for the timeout message (``"trial result"``).
            trial: the trial number the message belongs to, or ``None``.
            patient: wait up to ``2 * timeout_s`` (the trial-result gather after a task).
            grace_s: with ``patient``, on a rank whose task failed: seconds to wait for every rank's arrival
                mark before the gather (case C45; not without torchrun's store). ``None``: no such wait.
            check, call: a trial call's arrival check, as in :meth:`broadcast`.

        Returns:
            ``[obj of rank 0, obj of rank 1, ...]``, length ``world_size``, equal on every rank.

        Raises:
            RankTimeoutError: if a rank does not answer within ``timeout_s`` seconds.
            PeerLostError: the connection to a rank broke before that (see :meth:`broadcast`).
            PeersBlockedError: some rank had not arrived after ``grace_s`` seconds (its ranks in ``missing``).
            CallMismatchError: as :meth:`broadcast`.
        """
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        self._enter(what, trial, check, call)
        out: list[Any] = [None] * self.world_size
        start = time.monotonic()
        arrival = mark_arrival(self.store, what, trial, self.rank) if patient else None
        if grace_s is not None and arrival is not None:
            missing = absent_after(self.store, arrival, self.world_size, grace_s)
            if missing:
                raise PeersBlockedError(
                    f"{self.label}: rank(s) {ranks_on_hosts(self.store, missing)} did not reach trial {trial}'s {what} "
                    f"within {grace_s:g} s", missing)
        try:
            group = self.patient_group if patient and self.patient_group is not None else self.group
            dist.all_gather_object(out, (what, obj), group=group)
        except Exception as e:
            limit = self.timeout_s * (2 if patient else 1)
            missing = absent_after(self.store, arrival, self.world_size, 0.0) if arrival is not None else []
            peer = f"rank(s) {ranks_on_hosts(self.store, missing)}, which never arrived" if missing else "all ranks"
            raise self._timeout_error(what, trial, peer, time.monotonic() - start, e, limit) from e
        others = {r: w for r, (w, _) in enumerate(out) if w != what}
        if others:
            raise self._desync_error(what, trial, others)
        return [o for _, o in out]

    def gather_errors(
        self, error: str | None, *, what: str, trial: int | None, value: Any = None
    ) -> tuple[list[tuple[int, str]], list[Any]]:
        """Gather every rank's one-line ``error`` (or ``None``) and a picklable ``value`` in one
        :meth:`all_gather`, raising as it does. Returns ``([(rank, error)]`` of the ranks that sent one, in rank
        order, ``[every rank's value]``)."""
        pairs = self.all_gather((error, value), what=what, trial=trial)
        return [(r, err) for r, (err, _) in enumerate(pairs) if err], [v for _, v in pairs]

    def _enter(self, what: str, trial: int | None, check: CallCheck | None, call: str | None) -> None:
        """Before a collective: the trial call's arrival check, then :meth:`check_group_alive`."""
        if check is not None:
            check.before(call or what)
        self.check_group_alive(what, trial)

    def check_group_alive(self, what: str, trial: int | None) -> None:
        """Raise ``ProcessGroupMisuseError`` if the default process group was destroyed, instead of reporting a
        timeout later (case C24)."""
        import torch.distributed as dist

        if not dist.is_initialized():
            raise ProcessGroupMisuseError(
                f"{self.label} cannot send {what!r} for trial {trial}: the default process "
                "group was destroyed, most likely by the task (torch.distributed.destroy_process_group()). The "
                "sweeper owns the default group for the whole sweep and destroys it itself at the end; remove that "
                "call from the task (or guard it with hydra_plugins.ds_optuna_sweeper.in_trial())."
            )

    def _desync_error(self, what: str, trial: int | None, others: dict[int, str]) -> ControlPlaneError:
        return ControlPlaneError(
            f"{self.label} expected {what!r} for trial {trial} but "
            + ", ".join(f"rank {r} sent {w!r}" for r, w in others.items())
            + ": the ranks took different paths through the sweep (a bug in the sweeper); stopping."
        )

    def _timeout_error(
        self, what: str, trial: int | None, peer: str, waited_s: float, cause: BaseException,
        limit_s: float | None = None,
    ) -> RankTimeoutError:
        """:class:`PeerLostError` when the wait broke well before its limit (a peer is gone), else
        :class:`RankTimeoutError` (the limit passed: a peer may be slow or stuck)."""
        trial_text = f"trial {trial}'s" if trial is not None else "the sweep's"
        limit = limit_s or self.timeout_s
        if waited_s < 0.5 * limit:  # the connection to a peer broke; say why from the records (C41)
            waiting = f"{trial_text} {what} from {peer} on the gloo control group"
            end = launch_end(self.store)
            if end is not None and end.rank != self.rank:
                return PeerLostError(f"{self.label} stopped waiting for {waiting} after {waited_s:.1f} s: "
                                     f"rank {rank_on_host(self.store, end.rank)} {end.what}.")
            silent = [r for r in range(self.world_size) if r != self.rank]
            known = "no exit recorded: killed or crashed" if self.store is not None else "no torchrun store to tell why"
            return PeerLostError(
                f"{self.label} lost the connection to rank(s) {silent} after {waited_s:.1f} s "
                f"while waiting for {waiting} ({known}; {cause}); see torchrun's output and the per-rank logs in the "
                "job dir."
            )
        return RankTimeoutError(
            f"{self.label} waited {waited_s:.1f} s (limit {limit:g} s) for "
            f"{trial_text} {what} from {peer} on the gloo control group and gave up ({cause}). A rank may "
            "have crashed or be stuck in user code; see the per-rank logs in the job dir. Raise "
            "hydra.sweeper.rank_timeout if that gap is expected."
        )

    def describe(self) -> str:
        """One line for the log: rank, world size, local rank, backends, timeout."""
        return (f"{self.label} (local rank {self.local_rank}), training backend {self.backend}, control plane "
                f"{'gloo' if self.distributed else 'none'}, rank_timeout {self.timeout_s:g} s")

