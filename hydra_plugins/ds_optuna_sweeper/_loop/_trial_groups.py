"""Every rank, before anything else: split the torchrun world into trial groups (``hydra.sweeper.n_jobs=K``).

``torchrun --nproc_per_node 8 app.py -m hydra.sweeper.n_jobs=4`` runs 4 trials at once, each on 2 consecutive
ranks, which see their group as their world (docs/design.md, "Trial groups"): torchrun's variables
(:data:`REWRITTEN`) hold the group's values, ``MASTER_ADDR``/``MASTER_PORT`` name a ``TCPStore`` served by the
group's first rank (so ``setup_ranks`` creates the group's default process group from ``env://``), and on a
CUDA build ``CUDA_VISIBLE_DEVICES`` lists the group's GPUs of this node.

The launch-wide control plane is torchrun's own store, under a prefix per attempt (``dist.new_group`` only builds
groups inside the default group, which is now the trial group). A group fits inside one node or is made of
whole nodes. torch is imported inside functions (light at plugin discovery).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Mapping

from .._comm import _wire
from .._errors import SweeperConfigError
from .._comm._tcp_deadline import bound_store_connections
from .._comm._whoami import LAUNCH_WORLD_ENV, TRIAL_GROUP_ENV, own_address, restart_count

log = logging.getLogger(__name__)

#: The variables a trial group's process sees rewritten (torch.distributed.run documentation's names).
REWRITTEN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
             "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "CUDA_VISIBLE_DEVICES")


@dataclass(frozen=True)
class GroupLayout:
    """How ``n_groups`` trial groups (``hydra.sweeper.n_jobs``) cover a world of ``world_size`` ranks,
    ``local_world_size`` per node; see :func:`plan_groups`."""

    n_groups: int
    world_size: int
    local_world_size: int

    @property
    def group_size(self) -> int:
        return self.world_size // self.n_groups

    def group_of(self, rank: int) -> int:
        """The trial group of global ``rank`` (consecutive ranks form a group)."""
        return rank // self.group_size

    def group_env(self, rank: int, local_rank: int) -> dict[str, str]:
        """The torchrun variables global ``rank`` (``local_rank`` on its node) sees inside its group. Inside one
        node: local rank = group rank, ``GROUP_RANK`` 0; a group of whole nodes keeps the local rank and ranks per
        node, ``GROUP_RANK`` is the node's index in the group."""
        size, per_node = self.group_size, self.local_world_size
        group_rank = rank % size
        if size <= per_node:
            local, local_size, node, nodes = group_rank, size, 0, 1
        else:
            local, local_size, node, nodes = local_rank, per_node, group_rank // per_node, size // per_node
        return {"RANK": str(group_rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local),
                "LOCAL_WORLD_SIZE": str(local_size), "GROUP_RANK": str(node), "GROUP_WORLD_SIZE": str(nodes),
                "ROLE_RANK": str(group_rank), "ROLE_WORLD_SIZE": str(size)}

    def node_local_ranks(self, rank: int, local_rank: int) -> list[int]:
        """This node's local ranks (launch numbering) that belong to ``rank``'s group, in order."""
        size, per_node = self.group_size, self.local_world_size
        if size >= per_node:
            return list(range(per_node))
        base = local_rank - local_rank % size
        return list(range(base, base + size))


def valid_group_counts(world_size: int, local_world_size: int) -> list[int]:
    """The ``n_jobs`` values :func:`plan_groups` accepts for this world, ascending."""
    out = []
    for k in range(1, world_size + 1):
        if world_size % k:
            continue
        size = world_size // k
        if local_world_size % size == 0 or size % local_world_size == 0:
            out.append(k)
    return out


def plan_groups(n_groups: int, world_size: int, local_world_size: int | None = None) -> GroupLayout:
    """The :class:`GroupLayout` of ``n_groups`` (``hydra.sweeper.n_jobs``) trial groups of equal size over
    ``world_size`` ranks, ``local_world_size`` per node (``None``: one node), none straddling nodes unevenly.

    Raises:
        SweeperConfigError: ``n_groups`` does not divide the world, or a group would cover part of a
            node plus part of another; the message lists the values that work and what each gives.
    """
    per_node = int(local_world_size or world_size)
    if per_node <= 0 or world_size % per_node:
        per_node = world_size  # an uneven elastic world: judge it as one node
    valid = valid_group_counts(world_size, per_node)
    options = ", ".join(f"{k} ({world_size // k} rank{'s' if world_size // k > 1 else ''} a trial)" for k in valid)
    if n_groups < 1 or world_size % n_groups:
        raise SweeperConfigError(
            f"hydra.sweeper.n_jobs={n_groups} does not divide the torchrun world of {world_size} ranks into trial "
            f"groups of equal size; use one of: {options}. Nothing was started."
        )
    size = world_size // n_groups
    if per_node % size and size % per_node:
        raise SweeperConfigError(
            f"hydra.sweeper.n_jobs={n_groups} makes trial groups of {size} ranks, which would straddle nodes of "
            f"{per_node} ranks unevenly (a group must fit in one node or be made of whole nodes); use one of: "
            f"{options}. Nothing was started."
        )
    return GroupLayout(n_groups, world_size, per_node)


def group_devices(visible: list[str], node_local_ranks: list[int]) -> list[str]:
    """The GPUs of the group's local ranks ``node_local_ranks`` on this node, each once, in order: rank ``l`` uses
    ``visible[l % len(visible)]`` (``visible``: this node's ``CUDA_VISIBLE_DEVICES`` entries, or ``"0".."n-1"``)."""
    if not visible:
        return []
    out: list[str] = []
    for local in node_local_ranks:
        device = visible[local % len(visible)]
        if device not in out:
            out.append(device)
    return out


@dataclass
class TrialGroups:
    """This process's trial group and the launch-wide channel; built by :func:`split_world`.

    Attributes:
        rank: this process's global rank in the launch; ``index``: its trial group, ``0 .. n_groups - 1``.
        world_store: torchrun's store under this attempt's prefix; ``torchrun_store``: the store itself.
        attempt: torchrun's restart count.
        saved_env: the launch's values of :data:`REWRITTEN` (``None``: unset), put back by :meth:`restore`.
    """

    layout: GroupLayout
    rank: int
    index: int
    world_store: Any = field(repr=False)
    torchrun_store: Any = field(repr=False)
    attempt: int = 0
    saved_env: dict[str, str | None] = field(default_factory=dict, repr=False)
    _group_store_server: Any = field(default=None, repr=False)  # kept alive on the group's first rank

    @property
    def n_groups(self) -> int:
        return self.layout.n_groups

    @property
    def is_owner(self) -> bool:
        """Global rank 0: the process that owns the study for every group (:mod:`._study_service`)."""
        return self.rank == 0

    @property
    def group_size(self) -> int:
        return self.layout.group_size

    def describe(self) -> str:
        """``"global ranks 2-3 of 4"``: where the group lies in the launch (the start-up line's tail)."""
        first = self.index * self.group_size
        ranks = f"{first}-{first + self.group_size - 1}" if self.group_size > 1 else str(first)
        return f"global rank{'s' if self.group_size > 1 else ''} {ranks} of {self.layout.world_size}"

    def restore(self) -> None:
        """Put the launch's variables back (the end of the sweep). Never raises."""
        for name, value in self.saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        os.environ.pop(LAUNCH_WORLD_ENV, None)
        os.environ.pop(TRIAL_GROUP_ENV, None)


def split_world(n_groups: int, timeout_s: float) -> TrialGroups:
    """Split the torchrun world into ``n_groups`` (``n_jobs``) trial groups and make this process see its own;
    every rank calls it before any process group exists. ``timeout_s``: seconds a wait for a peer may last.

    Raises:
        SweeperConfigError: a default process group exists already (the task or the launcher made it:
            the world cannot be split any more), or CUDA was initialised before the split.
        RankTimeoutError: the group's first rank did not publish its store within ``timeout_s``.
    """
    import torch.distributed as dist

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    layout = plan_groups(n_groups, world_size, int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
    if dist.is_available() and dist.is_initialized():
        raise SweeperConfigError(
            f"hydra.sweeper.n_jobs={n_groups}: a default process group exists before the sweep (created by the task's "
            "module or the launcher), so the world can no longer be split into trial groups. Create it inside the "
            "task, guarded with 'if not torch.distributed.is_initialized():', or use n_jobs=1."
        )
    devices = _cuda_devices(layout, rank, local_rank)
    attempt = restart_count()
    timeout = timedelta(seconds=float(timeout_s))
    store, _, _ = next(dist.rendezvous("env://", timeout=timeout))
    world_store = dist.PrefixStore(_wire.world_prefix(attempt), store)
    index = layout.group_of(rank)
    server, address, port = _group_store(world_store, layout, rank, timeout)
    bound_store_connections(os.environ.get("MASTER_PORT"), timeout_s)  # the launch's store (issue 42)
    env = {**layout.group_env(rank, local_rank), "MASTER_ADDR": address, "MASTER_PORT": port,
           "TORCHELASTIC_USE_AGENT_STORE": "True"}
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    saved = {name: os.environ.get(name) for name in REWRITTEN}
    os.environ[LAUNCH_WORLD_ENV] = f"{world_size}/{layout.local_world_size}"
    os.environ[TRIAL_GROUP_ENV] = f"{index}/{layout.n_groups}"
    os.environ.update(env)
    warn_import_time_values(saved, env, f"rank {rank} of the launch, rank {env['RANK']} of trial group "
                                        f"{index}/{layout.n_groups}")  # case C58
    if devices is not None:
        _check_cuda_sees(devices, index)
    return TrialGroups(layout, rank, index, world_store, store, attempt, saved, server)


def _group_store(world_store: Any, layout: GroupLayout, rank: int, timeout: timedelta) -> tuple[Any, str, str]:
    """The group's own store, served by its first rank on a free port and published in the launch's store:
    ``(the server or None, address, port)``. Raises ``RankTimeoutError`` when not published within ``timeout``."""
    import torch.distributed as dist

    from .._errors import RankTimeoutError

    index = layout.group_of(rank)
    key = f"groups/{index}/store"
    server = None
    if rank % layout.group_size == 0:
        server = dist.TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False, timeout=timeout)
        world_store.set(key, f"{own_address()}:{server.port}")
    try:
        world_store.wait([key], timeout)
    except Exception as e:
        raise RankTimeoutError(
            f"global rank {rank}/{layout.world_size}: trial group {index}'s first rank (global rank "
            f"{index * layout.group_size}) did not publish its store within {timeout.total_seconds():g} s ({e}); "
            "see its log."
        ) from e
    address, port = world_store.get(key).decode().rsplit(":", 1)
    return server, address, port


def _cuda_devices(layout: GroupLayout, rank: int, local_rank: int) -> list[str] | None:
    """The group's GPUs on this node, or ``None`` without CUDA (counted with NVML, which leaves the runtime's view
    unfixed). Raises ``SweeperConfigError`` when CUDA was initialised already in this process."""
    import torch

    if not torch.backends.cuda.is_built() and not getattr(torch.version, "hip", None):
        return None
    if torch.cuda.is_initialized():
        raise SweeperConfigError(
            f"hydra.sweeper.n_jobs={layout.n_groups}: CUDA was initialised in this process before the sweep, so the "
            "sweeper can no longer give the trial group its own GPUs (CUDA_VISIBLE_DEVICES is read once). Move "
            "every torch.cuda call (and model.to('cuda')) from the script's top level into the task."
        )
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = [d.strip() for d in raw.split(",") if d.strip()] if raw is not None else [
        str(i) for i in range(torch.cuda.device_count())]
    if not visible:
        return None
    return group_devices(visible, layout.node_local_ranks(rank, local_rank))


def _check_cuda_sees(devices: list[str], index: int) -> None:
    """After the rewrite, CUDA must see exactly the group's GPUs (it reads ``CUDA_VISIBLE_DEVICES`` at its first
    use); raises ``SweeperConfigError`` otherwise."""
    from .._upstream import cuda_runtime_device_count

    seen = cuda_runtime_device_count()
    if seen >= 0 and seen != len(devices):
        raise SweeperConfigError(
            f"trial group {index} should see GPU(s) {devices} of this node, but CUDA sees {seen} GPU(s): CUDA read "
            "CUDA_VISIBLE_DEVICES before the sweep split the world (a torch.cuda call at the script's top level, "
            "e.g. torch.cuda.is_available(), or an import that makes one: 'import deepspeed' asks for its "
            "accelerator). Move those calls and imports into the task function, or use n_jobs=1."
        )


#: The rewritten variables a script typically keeps in a module global, by the global's name (any case; case C58).
WATCHED = {"RANK": "RANK", "GLOBAL_RANK": "RANK", "WORLD_SIZE": "WORLD_SIZE", "LOCAL_RANK": "LOCAL_RANK",
           "LOCAL_WORLD_SIZE": "LOCAL_WORLD_SIZE"}


def stale_globals(namespace: Mapping[str, Any], launch: Mapping[str, str | None],
                  group: Mapping[str, str]) -> dict[str, tuple[int, int]]:
    """``{global name: (its value, the trial group's value)}`` for each module global of ``namespace`` named like
    a :data:`WATCHED` variable (``RANK``, ``rank``, ``WORLD_SIZE`` ...) whose int value is the launch's and not the
    group's. ``launch``/``group``: the variables before and after the rewrite."""
    found: dict[str, tuple[int, int]] = {}
    for name, value in namespace.items():
        variable = WATCHED.get(name.upper())
        if variable is None or isinstance(value, bool) or not isinstance(value, (int, str)):
            continue
        before, after = launch.get(variable), group.get(variable)
        if before is None or after is None or before == after:
            continue
        try:
            if int(value) == int(before):
                found[name] = (int(value), int(after))
        except ValueError:
            continue
    return found


def warn_import_time_values(launch: Mapping[str, str | None], group: Mapping[str, str], where: str) -> bool:
    """Warn once when the script's module (``__main__``), run before the rewrite, holds a launch's value of a
    rewritten variable (:func:`stale_globals`; case C58); ``where`` names this process. Returns whether it warned."""
    main = sys.modules.get("__main__")
    found = stale_globals(vars(main), launch, group) if main is not None else {}
    if not found:
        return False
    names = ", ".join(f"{name}={value} (the trial group's: {now})" for name, (value, now) in sorted(found.items()))
    log.warning(
        "%s: the script read torchrun's variables before the sweep split the world into trial groups "
        "(hydra.sweeper.n_jobs), so its module globals hold the launch's values: %s. Inside the task, RANK, "
        "WORLD_SIZE and LOCAL_RANK are the trial group's: read the trial's rank as current_trial().rank (or "
        "os.environ['RANK'] inside the task), not at import time, or 'rank 0 only' code never runs in this group",
        where, names)
    return True
