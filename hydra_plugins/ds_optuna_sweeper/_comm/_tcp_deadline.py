"""Every rank: a kernel deadline on this process's connections to torchrun's store (issue 42: a link that stays down).

torch's ``TCPStore`` client does not keep its timeout when the link to the store's host drops packets silently (a
cut cable, a link set down): a ``check`` or ``get`` sent after the cut waits until the link comes back or the kernel
gives up retransmitting (``net.ipv4.tcp_retries2``, about 15 minutes; measured with torch 2.13: a client with
``timeout=5 s`` still blocked after 120 s), so the sweeper's polling waits would never reach ``rank_timeout``.

Linux ``tcp(7)``: ``TCP_USER_TIMEOUT`` bounds how long sent data may stay unacknowledged, and keepalive probes
(``SO_KEEPALIVE``, ``TCP_KEEPIDLE``, ``TCP_KEEPINTVL``, ``TCP_KEEPCNT``) make an idle connection send something to
be acknowledged. With both set to ``rank_timeout``, the store call raises ("Connection timed out") within about
``rank_timeout`` seconds of the cut. A live store host acknowledges at the kernel level, however busy its process
is, so a long legitimate wait is never cut. Only the standard library; Linux only (elsewhere nothing is set).
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


def bound_store_connections(port: int | str | None, timeout_s: float) -> int:
    """Set the kernel deadline (module docstring) of about ``timeout_s`` seconds (the sweep's ``rank_timeout``) on
    every TCP connection of this process to ``port`` (torchrun's ``MASTER_PORT``, or a trial group's store port;
    ``None`` or ``""``: nothing to do). Returns how many connections got it (0 where the platform lacks the
    options). Never raises: a connection that refuses an option keeps torch's behaviour.
    """
    if not port or not hasattr(socket, "TCP_USER_TIMEOUT") or not os.path.isdir("/proc/self/fd"):
        return 0
    port, done = int(port), 0
    for fd in _socket_fds():
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6) \
                    and sock.getpeername()[1] == port:
                _set_deadline(sock, timeout_s)
                done += 1
        except OSError:  # not connected, or an option refused: torch's behaviour stays
            pass
        finally:
            sock.close()  # the duplicate only; the option belongs to the connection both share
    log.debug("kernel deadline of %g s on %d connection(s) to port %d", timeout_s, done, port)
    return done


def _socket_fds() -> list[int]:
    """This process's open file descriptors that are sockets (``/proc/self/fd/<n>`` links to ``socket:[...]``)."""
    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                fds.append(int(name))
        except OSError:  # closed meanwhile (the listing's own descriptor among them)
            continue
    return fds


def _set_deadline(sock: socket.socket, timeout_s: float) -> None:
    idle = max(1, int(timeout_s / 3))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, idle // 3))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, max(1000, int(timeout_s * 1000)))
