"""Who this process is, from torchrun's environment: rank, world size, local rank, restart count, trial group,
and how messages name it. Imports nothing of the package (and no torch). Inside a trial group the rank and world
size are the group's (:func:`.._loop._trial_groups.split_world` rewrites the variables).
"""

from __future__ import annotations

import os
import socket

#: The launch's torchrun world as ``"<world size>/<ranks per node>"``, set by
#: :func:`.._loop._trial_groups.split_world` for the resume lines (:func:`.._study._command.launcher`).
LAUNCH_WORLD_ENV = "DS_OPTUNA_LAUNCH_WORLD"
#: This process's trial group as ``"<index>/<n_groups>"`` (``"1/2"``), set by
#: :func:`.._loop._trial_groups.split_world`; unset without trial groups. Messages name it (:func:`rank_label`).
TRIAL_GROUP_ENV = "DS_OPTUNA_TRIAL_GROUP"


def first_process() -> bool:
    """True in the launch's first process, where launch-wide messages are said (issue 38, C59): ``RANK`` 0 (or
    unset) and, with trial groups (whose ``RANK`` is the group's own), in group 0 (:data:`TRIAL_GROUP_ENV`)."""
    group = os.environ.get(TRIAL_GROUP_ENV, "")
    return os.environ.get("RANK", "0") in ("", "0") and group.split("/", 1)[0] in ("", "0")


def restart_count() -> int:
    """How many times torchrun restarted this group (``TORCHELASTIC_RESTART_COUNT``; 0 without torchrun, or
    when the variable is not a number)."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    except ValueError:
        return 0


def env_world() -> tuple[int, int, int]:
    """``(rank, world_size, local_rank)`` from torchrun's environment variables (0, 1, 0 without)."""
    return (
        int(os.environ.get("RANK", "0")),
        int(os.environ.get("WORLD_SIZE", "1")),
        int(os.environ.get("LOCAL_RANK", "0")),
    )


def rank_label(rank: int, world_size: int) -> str:
    """How messages name a rank of this process's world (its trial group's, with trial groups): ``"rank 1/2"``, or
    ``"rank 1/2 of trial group 1/4"`` inside trial group 1 of 4."""
    group = os.environ.get(TRIAL_GROUP_ENV)
    return f"rank {rank}/{world_size}" + (f" of trial group {group}" if group else "")


def own_address() -> str:
    """This host's address as the other ranks reach it: the source address of a route to ``MASTER_ADDR`` (a UDP
    ``connect`` picks it; nothing is sent), bracketed when IPv6 (``127.0.0.1`` with ``--standalone``).

    Raises:
        OSError: no route to ``MASTER_ADDR``; KeyError: ``MASTER_ADDR``/``MASTER_PORT`` unset.
    """
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    family = socket.getaddrinfo(host, port, proto=socket.IPPROTO_UDP)[0]
    with socket.socket(family[0], socket.SOCK_DGRAM) as probe:
        probe.connect(family[4])
        address = probe.getsockname()[0]
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def host_label() -> str:
    """How messages name this process's machine: ``"node 1 (hostname, 198.18.250.2)"`` (torchrun's node rank
    ``GROUP_RANK``, the host name, :func:`own_address`); the parts that cannot be found are left out. Issue 42: a
    lost rank's message names its host."""
    parts = [socket.gethostname()]
    try:
        parts.append(own_address())
    except (OSError, KeyError, ValueError):
        pass
    node = os.environ.get("GROUP_RANK")
    return (f"node {node} " if node is not None else "") + f"({', '.join(parts)})"
