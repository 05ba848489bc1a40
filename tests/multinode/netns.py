"""Two "hosts" on one machine: Linux network namespaces joined by a veth pair (issue 42).

Each host is a network namespace with ``lo`` up and one end of a veth pair, addressed from 198.18.0.0/15 (the
range reserved for benchmarking, RFC 2544). There is no default route and no link to the root namespace, so
traffic goes only between the two hosts. The file system is shared, as a shared file system would be. Every
process of a host is started with ``ip netns exec <ns>``; :meth:`TwoHosts.teardown` kills every process in
both namespaces and deletes them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field

#: Seconds any one ``ip`` call may take before it counts as failed.
IP_TIMEOUT_S = 10.0


def why_not() -> str | None:
    """Why namespaces cannot be made here (a skip reason), or ``None`` when they can: root and ``ip`` needed."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    return None


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``ip *args`` (at most :data:`IP_TIMEOUT_S` seconds). Raises ``RuntimeError`` with its stderr when it
    fails and ``check`` is true."""
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if check and res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


@dataclass
class Host:
    """One host: its namespace ``ns``, its veth interface ``ifname`` and its address ``addr``."""

    name: str
    ns: str
    ifname: str
    addr: str
    started: list[subprocess.Popen] = field(default_factory=list)

    def exec_prefix(self) -> list[str]:
        """The command prefix that runs a command inside this host's namespace."""
        return ["ip", "netns", "exec", self.ns]

    def track(self, proc: subprocess.Popen) -> subprocess.Popen:
        """Remember ``proc`` (started with :meth:`exec_prefix`) so that :meth:`kill_all` kills it even before it
        has entered the namespace: ``ip netns exec`` joins it only after its own start-up, and ``ip netns pids``
        does not list it until then (a teardown right after a start missed it once in CI). Returns ``proc``."""
        self.started.append(proc)
        return proc

    def pids(self) -> list[int]:
        """Pids of every process in this host's namespace (``ip netns pids``) and of every tracked process still
        running."""
        res = ip("netns", "pids", self.ns, check=False)
        listed = [int(p) for p in res.stdout.split()]
        return listed + [p.pid for p in self.started if p.poll() is None and p.pid not in listed]

    def kill_all(self, sig: int = signal.SIGKILL, settle_s: float = 5.0) -> None:
        """Stop every process of this host, then send ``sig`` to each (as a lost machine: nothing of it runs any
        code in between), and wait up to ``settle_s`` seconds for them to be gone (looking again for any
        started meanwhile)."""
        pids = self.pids()
        for pid in pids:
            _kill(pid, signal.SIGSTOP)
        end = time.monotonic() + settle_s
        while pids and time.monotonic() < end:
            for pid in pids:
                _kill(pid, sig)
            time.sleep(0.1)
            pids = self.pids()


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class TwoHosts:
    """Hosts ``a`` and ``b`` joined by one link; made by :func:`make_two_hosts`."""

    a: Host
    b: Host
    made: list[str] = field(default_factory=list)

    def set_link(self, up: bool) -> None:
        """Bring host ``b``'s end of the link down (``up=False``: the cable is cut) or up again."""
        ip("-n", self.b.ns, "link", "set", self.b.ifname, "up" if up else "down")

    def teardown(self) -> None:
        """Kill every process in both namespaces and delete them; never raises (it runs after failures)."""
        for host in (self.a, self.b):
            if host.ns in self.made:
                try:
                    host.kill_all()
                except Exception:  # keep going: the namespaces must go
                    pass
        for ns in self.made:
            ip("netns", "del", ns, check=False)
        self.made.clear()


def make_two_hosts(tag: str, subnet: int) -> TwoHosts:
    """Make namespaces ``dso<tag>a`` and ``dso<tag>b`` joined by a veth pair, ``lo`` up in each, host a at
    198.18.<subnet>.1/24 and host b at 198.18.<subnet>.2/24 (``subnet`` in 0..255), no other route.

    ``tag`` makes the names unique (a pid and a counter: parallel pytest-xdist workers never collide); names are
    kept within Linux's 15 characters. On any failure what was made is deleted and ``RuntimeError`` raised.
    """
    hosts = TwoHosts(Host("a", f"dso{tag}a", "veth-a", f"198.18.{subnet}.1"),
                     Host("b", f"dso{tag}b", "veth-b", f"198.18.{subnet}.2"))
    try:
        for host in (hosts.a, hosts.b):
            ip("netns", "add", host.ns)
            hosts.made.append(host.ns)
        # Both ends are created inside their namespaces: nothing appears in the root namespace.
        ip("link", "add", hosts.a.ifname, "netns", hosts.a.ns, "type", "veth", "peer", "name", hosts.b.ifname,
           "netns", hosts.b.ns)
        for host in (hosts.a, hosts.b):
            ip("-n", host.ns, "link", "set", "lo", "up")
            ip("-n", host.ns, "addr", "add", f"{host.addr}/24", "dev", host.ifname)
            ip("-n", host.ns, "link", "set", host.ifname, "up")
    except BaseException:
        hosts.teardown()
        raise
    return hosts
