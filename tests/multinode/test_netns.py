"""The two hosts themselves (``tests/multinode/netns.py``), without torchrun: the link carries traffic between
them, nothing leaves the machine, a cut link stops it, and teardown kills what runs inside and deletes both
namespaces, also after a failing test body. A few seconds; in ``make test``."""

import subprocess
import sys
import time

import pytest

from tests.multinode.netns import ip, make_two_hosts, why_not

pytestmark = [pytest.mark.multinode, pytest.mark.timeout(60)]

#: Connects to argv[1]:argv[2] with a 3 s timeout and prints "ok" or the error's class name.
CONNECT = ("import socket,sys\ntry:\n socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=3).close();"
           "print('ok')\nexcept OSError as e:\n print(type(e).__name__, e.errno)")
#: Accepts connections on argv[1]:argv[2] forever (until killed).
SERVE = ("import socket,sys\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
         "s.bind((sys.argv[1],int(sys.argv[2])));s.listen()\nwhile True: s.accept()[0].close()")


def _connect(host, addr: str, port: int) -> str:
    res = subprocess.run([*host.exec_prefix(), sys.executable, "-c", CONNECT, addr, str(port)],
                         capture_output=True, text=True, timeout=20)
    return res.stdout.strip() or res.stderr.strip()


def test_the_link_joins_the_hosts_only_and_teardown_leaves_nothing(two_hosts):
    a, b = two_hosts.a, two_hosts.b
    server = a.track(subprocess.Popen([*a.exec_prefix(), sys.executable, "-c", SERVE, a.addr, "29555"]))
    try:
        end = time.monotonic() + 15
        while _connect(b, a.addr, 29555) != "ok":
            assert time.monotonic() < end, "host b never reached host a's server"
            time.sleep(0.2)
        assert server.pid in a.pids() and server.pid not in b.pids()
        # No route out: the machine's own address and a public one are unreachable from either host.
        out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True,
                             timeout=10).stdout.split()
        root_addrs = [w.split("/")[0] for w in out if "/" in w and not w.startswith("198.18.")]
        for target in [*root_addrs[:1], "1.1.1.1"]:
            assert _connect(a, target, 22).startswith("OSError 101"), target  # ENETUNREACH
        assert ip("-n", a.ns, "route").stdout.split()[0] == f"198.18.{a.addr.split('.')[2]}.0/24"
        two_hosts.set_link(up=False)
        assert _connect(b, a.addr, 29555) != "ok"
        two_hosts.set_link(up=True)
    finally:
        server.kill()
        server.wait(timeout=10)


def test_teardown_after_a_failure_kills_the_processes_and_deletes_the_namespaces():
    """A body that raises with a process running in each namespace: teardown still kills both and deletes the
    namespaces (the ``two_hosts`` fixture calls the same teardown in its ``finally``)."""
    reason = why_not()
    if reason:
        pytest.skip(reason)
    hosts = make_two_hosts(f"{__import__('os').getpid()}t", subnet=250)
    procs = []
    try:
        with pytest.raises(RuntimeError):
            try:
                procs = [h.track(subprocess.Popen([*h.exec_prefix(), "sleep", "300"])) for h in (hosts.a, hosts.b)]
                raise RuntimeError("the test body failed")
            finally:
                hosts.teardown()
        for p in procs:
            assert p.wait(timeout=10) == -9
        listed = ip("netns", "list").stdout
        assert hosts.a.ns not in listed and hosts.b.ns not in listed, listed
    finally:
        for p in procs:
            p.kill()
        hosts.teardown()
