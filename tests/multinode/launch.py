"""Start one multi-node ``torchrun`` world across the hosts of :mod:`tests.multinode.netns`.

Each host runs its own ``torchrun --nnodes 2 --rdzv-backend c10d`` inside its namespace, as each machine of a
cluster would; the node ranks are decided by the rendezvous. What these worlds need beyond the README's recipe,
all because the two "hosts" share one hostname (``vm``, resolving to 127.0.0.1 on this machine):

- ``--local-addr <host's address>``: the address each agent publishes to the other (its hostname would be
  127.0.0.1, the other host's loopback);
- ``--rdzv-conf is_host=1`` on host a, ``is_host=0`` on host b: torch decides who hosts the rendezvous store by
  comparing the endpoint to the machine's hostname and addresses, which matches on neither host here;
- ``GLOO_SOCKET_IFNAME=<host's veth>``: gloo otherwise binds to the address the hostname resolves to.

Every process goes through ``tests/torchrun_utils.start_process`` (tagged, killed when the test ends) and
``ip netns exec``; the environment (``PYTHONPATH`` included) passes through ``ip netns exec`` unchanged.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.multinode.netns import Host, TwoHosts
from tests.torchrun_utils import REPO, allowed_seconds, base_env, kill_tree, start_process

#: The rendezvous port on host a (each test has its own namespaces, so ports never collide).
RDZV_PORT = 29400


def node_command(host: Host, hosts: TwoHosts, script: str, args: list[str], *, rdzv_id: str, nproc: int = 2,
                 join_timeout_s: int = 120, port: int = RDZV_PORT, torchrun_args: list[str] | None = None) -> list[str]:
    """The command line that runs ``torchrun`` for one node of the 2-node world on ``host``.

    ``join_timeout_s``: seconds the rendezvous waits for the other node (torch's ``join_timeout``, 600 by default).
    ``port``: the rendezvous port on host a (another for each world that runs at the same time).
    """
    script_path = Path(script) if Path(script).is_absolute() else REPO / script
    return [
        *host.exec_prefix(), sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "2", "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{hosts.a.addr}:{port}", "--rdzv-id", rdzv_id,
        "--local-addr", host.addr,
        "--rdzv-conf", f"is_host={int(host is hosts.a)},join_timeout={join_timeout_s}",
        *(torchrun_args or []), str(script_path), *args,
    ]


@dataclass
class Node:
    """One host's running ``torchrun``: its process and the file holding its (and its ranks') output."""

    host: Host
    proc: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start_node(host: Host, hosts: TwoHosts, script: str, args: list[str], *, rdzv_id: str, log: Path,
               env: dict[str, str] | None = None, **kwargs) -> Node:
    """Start :func:`node_command` on ``host`` with :func:`tests.torchrun_utils.base_env` plus ``env`` and
    ``GLOO_SOCKET_IFNAME``, output to ``log``; ``kwargs`` go to :func:`node_command`."""
    cmd = node_command(host, hosts, script, args, rdzv_id=rdzv_id, **kwargs)
    with open(log, "w") as out:
        proc = start_process(cmd, cwd=REPO, env=base_env(GLOO_SOCKET_IFNAME=host.ifname, **(env or {})), stdout=out)
    return Node(host, host.track(proc), log)


def wait_nodes(nodes: list[Node], timeout_s: float) -> list[int]:
    """Wait for every node's torchrun to end, all within ``allowed_seconds(timeout_s)`` seconds in total, and
    return their exit statuses; every process they started is killed on any way out.

    Raises:
        AssertionError: if one runs longer (a hang), with the tail of each node's output.
    """
    end = time.monotonic() + allowed_seconds(timeout_s)
    try:
        for node in nodes:
            try:
                node.proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"host {node.host.name}'s torchrun still ran after {timeout_s:g} s (a hang?)\n"
                                     + tails(nodes)) from None
    finally:
        for node in nodes:
            kill_tree(node.proc)
    return [node.proc.returncode for node in nodes]


def tails(nodes: list[Node], chars: int = 4000) -> str:
    """The last ``chars`` characters of each node's output, headed by its host."""
    return "\n".join(f"--- host {n.host.name} (exit {n.proc.returncode}) ---\n{n.output()[-chars:]}" for n in nodes)


def run_two_nodes(hosts: TwoHosts, script: str, args: list[str], tmp_path: Path, *, rdzv_id: str,
                  timeout_s: float = 180, env: dict[str, str] | None = None, label: str = "run",
                  **kwargs) -> list[Node]:
    """Start the node on host a, then on host b, wait for both (``timeout_s`` seconds in all) and return them;
    logs go to ``tmp_path/<label>-<host>.log``. The exit statuses are the caller's to check."""
    nodes = [start_node(h, hosts, script, args, rdzv_id=rdzv_id, log=tmp_path / f"{label}-{h.name}.log", env=env,
                        **kwargs) for h in (hosts.a, hosts.b)]
    wait_nodes(nodes, timeout_s)
    return nodes
