"""Join the torchrun world and own its process groups: create the default (training) group and the gloo
control groups, probe the training group after a failed trial, destroy the default group if the sweeper made it.
torch is imported inside functions (the package root must stay light at plugin discovery)."""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

from .._comm import _wire
from .._errors import TrainingGroupBrokenError
from .._comm._arrivals import announce_host
from .._comm._tcp_deadline import bound_store_connections
from .._comm._ranks import RankComm
from .._comm._whoami import env_world, restart_count

log = logging.getLogger(__name__)


def default_backend() -> str:
    """``"cpu:gloo,cuda:nccl"`` when CUDA is usable, else ``"gloo"``."""
    import torch

    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def uses_nccl(backend: str) -> bool:
    """True when ``backend`` (``"nccl"``, ``"cpu:gloo,cuda:nccl"``...) sends CUDA tensors through NCCL."""
    return "nccl" in str(backend).lower()


def _bind_device(backend: str, local_rank: int) -> dict[str, Any]:
    """With NCCL and CUDA: set this rank's GPU, ``cuda:LOCAL_RANK`` (else the first collective runs on GPU 0 on
    every rank of a node: PyTorch's "using GPU 0 to perform barrier" warning), and return
    ``{"device_id": device}`` for ``init_process_group`` (torch.distributed documentation); else ``{}``."""
    import torch

    if not uses_nccl(backend) or not torch.cuda.is_available():
        return {}
    device = torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
    torch.cuda.set_device(device)
    return {"device_id": device}


def probe_tensor(backend: str) -> Any:
    """A one-element tensor for the default group's backend: on the current CUDA device for ``nccl`` alone
    (NCCL takes no CPU tensor), else on the CPU (``cpu:gloo,cuda:nccl``: the gloo half, which a failed trial's
    NCCL state cannot block)."""
    import torch

    backend = str(backend).lower()
    if backend == "nccl" or (uses_nccl(backend) and "cpu:" not in backend):
        return torch.zeros(1, device=torch.device("cuda", torch.cuda.current_device()))
    return torch.zeros(1)


def setup_ranks(timeout_s: float, backend: str | None = None) -> RankComm:
    """Join the torchrun world (if any) and create the gloo control group; returns this process's ``RankComm``.

    Without a default group one is created (from ``env://``, bound to this rank's GPU with NCCL; at world size 1
    :func:`_single_process_group`); an existing one is kept (re-creating one fails, docs/deepspeed-cpu.md).
    ``timeout_s``: seconds, the control group's (and a new default group's) timeout; ``backend``: a new default
    group's (``None``: :func:`default_backend`).

    Raises:
        ValueError: if ``timeout_s`` is not positive (``Settings`` refuses it earlier, naming the key).
    """
    if not timeout_s or timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s=}")
    rank, world_size, local_rank = env_world()
    timeout = timedelta(seconds=float(timeout_s))
    attempt = restart_count()
    if world_size <= 1:
        launcher = _launcher_store(timeout)
        group_id, restarted = _group_identity(launcher, is_main=True, attempt=attempt)
        env_set = _single_process_env()
        chosen, owns = _single_process_group(backend, timeout, local_rank)
        return RankComm(0, 1, local_rank, float(timeout_s), None, chosen, group_id=group_id, restarted=restarted,
                        owns_group=owns, env_set=env_set, attempt=attempt, launcher_store=launcher)
    import torch.distributed as dist

    store = _create_default_group(backend, timeout, local_rank, attempt) if not dist.is_initialized() else None
    group = dist.new_group(backend="gloo", timeout=timeout)
    patient_group = dist.new_group(backend="gloo", timeout=2 * timeout)
    group_id, restarted = _group_identity(store, is_main=dist.get_rank() == 0, attempt=attempt)
    bound_store_connections(os.environ.get("MASTER_PORT"), timeout_s)  # a silent link ends store calls (issue 42)
    attempt_store = None
    if store is not None:
        attempt_store = dist.PrefixStore(_wire.attempt_prefix(attempt), store)
        announce_host(attempt_store, dist.get_rank())  # a lost rank's message names its host (issue 42)
    return RankComm(store=attempt_store, patient_group=patient_group, rank=dist.get_rank(),
                    world_size=dist.get_world_size(), local_rank=local_rank, timeout_s=float(timeout_s), group=group,
                    backend=str(dist.get_backend()), group_id=group_id, restarted=restarted,
                    owns_group=store is not None, attempt=attempt, launcher_store=store)


def _create_default_group(backend: str | None, timeout: timedelta, local_rank: int, attempt: int) -> Any:
    """Create the default group from ``env://`` (world size above 1); returns torchrun's store. A prefix per
    attempt keeps a ``--max-restarts`` attempt off the keys of the one before (gloo's "connectFullMesh failed")."""
    import torch.distributed as dist

    store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
    chosen = backend or default_backend()
    dist.init_process_group(backend=chosen, store=dist.PrefixStore(_wire.rendezvous_prefix(attempt), store), rank=rank,
                            world_size=world_size, timeout=timeout, **_bind_device(chosen, local_rank))
    return store


def _single_process_group(backend: str | None, timeout: timedelta, local_rank: int) -> tuple[str, bool]:
    """At world size 1, create a one-process default group on a ``HashStore`` so a task written for torchrun
    runs unchanged (C39). Returns ``(its backend or "none", True when this call created it)``; a failure is
    logged and the sweep goes on without one."""
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
    """At world size 1, set the unset torchrun variables as a one-process torchrun worker has them (DeepSpeed and
    DDP scripts read them, case C39); ``TORCHELASTIC_RUN_ID`` stays unset. Returns the names set."""
    import socket

    added = {k: v for k, v in _SINGLE_PROCESS_ENV.items() if k not in os.environ}
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:  # nothing listens on it (the group uses a HashStore); a free one all the same
            s.bind(("127.0.0.1", 0))
            added["MASTER_PORT"] = str(s.getsockname()[1])
    os.environ.update(added)
    return tuple(added)


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


def _group_identity(store: Any, *, is_main: bool, attempt: int = 0) -> tuple[str | None, bool]:
    """``(group id or None, restarted)``: this torchrun group's identity and whether torchrun restarted it (C29).

    ``TORCHELASTIC_RUN_ID`` is no identity (most launch lines leave it at ``none``), so rank 0 of the first
    attempt writes a random id into torchrun's ``store`` (not an attempt's prefix store), which outlives
    ``--max-restarts`` restarts; a later attempt reads it back and is ``restarted``.
    """
    if store is None or not is_main:
        return None, False
    import uuid

    try:
        if attempt > 0 and store.check([_wire.GROUP_ID]):
            return store.get(_wire.GROUP_ID).decode(), True
        group_id = uuid.uuid4().hex
        store.set(_wire.GROUP_ID, group_id)
        return group_id, False
    except Exception:  # a store without these calls: heartbeats alone decide
        log.warning("cannot keep a group id in torchrun's store", exc_info=True)
        return None, False


def probe_training_group(ctx: RankComm, trial: int, trial_error: str | None, resume_hint: str = "") -> None:
    """After a failed trial, check with one ``all_reduce`` (:func:`probe_tensor`) and one control-plane gather
    that the training process group still works on every rank. A collective ended by its timeout leaves it broken
    (gloo: "Application timeout caused pair closure"; docs/deepspeed-cpu.md). ``trial_error`` (the agreed error)
    and ``resume_hint`` (the resume command) go into the message.

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


def close_group(ctx: RankComm) -> None:
    """At the end of the sweep: destroy the default process group if the sweeper created it
    (:attr:`.._comm._ranks.RankComm.owns_group`) and remove the variables it set (``ctx.env_set``). Never raises."""
    import gc

    import torch.distributed as dist

    for name in ctx.env_set:
        os.environ.pop(name, None)
    if not ctx.owns_group:
        return
    try:
        if dist.is_initialized():
            gc.collect()  # drop DDP reducers of finished trials before their group goes away
            dist.destroy_process_group()
    except Exception:  # the sweep's outcome matters more than a clean teardown
        log.debug("destroy_process_group failed", exc_info=True)
